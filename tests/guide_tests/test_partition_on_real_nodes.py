"""Partition layouts on a real node (#22, "Done when"): the suite deployed by deploy-all.sh from
the built images on a real node (kubelet + containerd + runc) with eight GPUs of the Runtime
simulator; the operator writes the layouts ConfigMap and the node label, nothing else.

The node goes whole → MIG on two GPUs (one of them held by a pod: the change waits, says so with
an Event naming the pod, fences both GPUs from new pods — the kubelet's allocatable and
NodeDevices drop exactly those two, an Event names them and the pod, a restarted device plugin
finds the fence again, a new pod goes to another GPU — and converges once the pod is deleted,
the fence lifted) → TDM on two more → refused
layouts (one the controller judges, one only the hardware can) with their Events and nothing
changed → two GPUs bound to vfio-pci and the rest whole again (six advertised as
``aliyun.com/gpu``, two as ``aliyun.com/gpu-vfio``) → whole, once a VM pod holding a vfio GPU
(no Runtime allocation: the kubelet's pod-resources API names it) is deleted. Two pods run on
GPUs no layout touches from before the first change to after the last, never restarted, their
Runtime allocations unchanged. After every step the Runtime's devices, the node's capacity, the
device plugin's NodeDevices object (each GPU's partitions, their resource, its binding) and its
labels (count, model, memory, partitioning, per-profile counts, sharing mode, vfio count, from the
Runtime's state at that step) match the layout."""

from __future__ import annotations

import functools
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from lj_runtimekit_testkit.node import RealNode
from lj_runtimekit_testkit.simulator.inventory import GIB, Kind
from lj_runtimekit_testkit.simulator.inventory_file import load_inventory
from lj_runtimekit_testkit.suite import (
    NS,
    Operator,
    accelerator_capacity,
    all_running,
    allocations,
    simulator_state,
    wait_for,
    workload,
)

from .conftest import RealCluster
from .test_lifecycle_on_real_nodes import enabled

pytestmark = [pytest.mark.realnode, pytest.mark.images, pytest.mark.timeout(900)]

WORK_NS = "partition"
GPU, VFIO = "aliyun.com/gpu", "aliyun.com/gpu-vfio"
LABEL = "lj_runtimekit_partition_layout"
CONFIGMAP = "lj-runtimekit-partition-layouts"
STATUS = "lj-runtimekit-controller/partition-status"
PREFIX = "lj-runtimekit.aliyun.com"
INVENTORY = "gpu-8x-nvlink"
MIG: list[Any] = ["3g.40gb", "3g.40gb"]
TDM: list[Any] = [50, 50]


@dataclass
class Setup:
    op: Operator
    node: RealNode


@pytest.fixture(scope="module")
def setup(real_cluster: RealCluster) -> Setup:
    rc = real_cluster
    node = rc.add_node("gpu", INVENTORY)
    rc.operator.label(node.name, True)
    out = rc.operator.deploy_all("deploy")
    assert "all selected components are ready" in out.stdout, out.stdout
    op = rc.operator
    op.kubectl("create", "namespace", WORK_NS)
    wait_for(f"{node.name} enabled", functools.partial(enabled, op, node.name), 240)
    wait_for(f"{GPU} registered", lambda: capacity(op, node).get(GPU) == "8", 60)
    wait_for(
        "the default service account",
        lambda: op.kubectl("-n", WORK_NS, "get", "sa", "default", check=False).returncode == 0,
        30,
        0.2,
    )
    return Setup(op, node)


def allocatable(op: Operator, node: RealNode) -> str:
    """The node's allocatable ``aliyun.com/gpu``: its healthy, unfenced units."""
    return str(op.node(node.name)["status"].get("allocatable", {}).get(GPU, "0"))


def fenced_in_nodedevices(op: Operator, node: RealNode) -> list[str]:
    st = op.json("get", "nodedevices", node.name).get("status") or {}
    return sorted(d["id"] for d in st.get("devices") or [] if d.get("fenced"))


def plugin_pod(op: Operator, node: RealNode) -> dict[str, Any] | None:
    items = op.json(
        "-n", NS, "get", "pods", "-l", "app=lj-runtimekit-device-plugin",
        "--field-selector", f"spec.nodeName={node.name}",
    )["items"]  # fmt: skip
    return items[0] if len(items) == 1 else None


def fence_holds(op: Operator, node: RealNode, fenced: list[str]) -> None:
    """Issue 39: exactly ``fenced`` are withheld from new pods, on both paths."""
    settle(
        f"allocatable {GPU} without {fenced}",
        str(8 - len(fenced)),
        lambda: allocatable(op, node),
        60,
    )
    settle("NodeDevices fenced", sorted(fenced), lambda: fenced_in_nodedevices(op, node), 30)


def capacity(op: Operator, node: RealNode) -> dict[str, str]:
    cap = accelerator_capacity(op.node(node.name))
    return {k: v for k, v in cap.items() if k in (GPU, VFIO)}


def index(device_id: str) -> int:
    return int(device_id.rsplit("-", 1)[1])


def run_pod(op: Operator, name: str) -> dict[str, Any]:
    body = workload(name, WORK_NS, {GPU: "1"})
    op.kubectl("create", "-f", write_json(op, name, body))
    return wait_for(f"pod {name} running", lambda: running(op, name), 120)


def write_json(op: Operator, name: str, body: dict[str, Any]) -> str:
    path = op.log_dir / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(body))
    return str(path)


def running(op: Operator, name: str) -> dict[str, Any] | None:
    pod: dict[str, Any] = op.json("-n", WORK_NS, "get", "pod", name)
    return pod if all_running([pod]) else None


def held_by(node: RealNode, pod: str) -> list[int]:
    """The GPU indices the Runtime's allocations of ``pod`` hold."""
    return sorted(
        index(d.split("-mig-")[0].split("-tdm-")[0])
        for a in allocations(node)
        if a["pod"] == f"{WORK_NS}/{pod}"
        for d in a["devices"]
    )


def layouts(op: Operator, data: dict[str, str]) -> None:
    args = [f"--from-literal={k}={v}" for k, v in data.items()]
    manifest = op.kubectl(
        "-n", NS, "create", "configmap", CONFIGMAP, *args, "--dry-run=client", "-o", "yaml"
    ).stdout
    path = op.log_dir / "layouts.yaml"
    path.write_text(manifest)
    op.kubectl("apply", "-f", str(path))


def select(op: Operator, node: RealNode, layout: str) -> None:
    op.kubectl("label", "node", node.name, f"{LABEL}={layout}", "--overwrite")


def pstatus(op: Operator, node: RealNode) -> dict[str, Any]:
    raw = op.node(node.name)["metadata"].get("annotations", {}).get(STATUS, "{}")
    status: dict[str, Any] = json.loads(raw or "{}")
    return status


def converged(op: Operator, node: RealNode, layout: str) -> dict[str, Any] | None:
    st = pstatus(op, node)
    if st.get("layout") == layout and st.get("result") in ("failed", "refused"):
        raise AssertionError(f"layout {layout} {st['result']}: {st}")
    return st if st.get("layout") == layout and st.get("result") == "succeeded" else None


def settle(what: str, want: Any, have: Callable[[], Any], deadline_s: float) -> None:
    """Wait until ``have()`` equals ``want``; on timeout, fail showing both."""
    seen: list[Any] = [None]

    def probe() -> bool:
        seen[0] = have()
        return bool(seen[0] == want)

    try:
        wait_for(what, probe, deadline_s)
    except TimeoutError as e:
        raise AssertionError(f"{e}\n want: {want}\n have: {seen[0]}") from None


def label_value(text: str) -> str:
    """``text`` as a label value (docs/node-labels.md: anything else than [A-Za-z0-9_.-] is -)."""
    v = "".join(c if (c.isascii() and c.isalnum()) or c in "_.-" else "-" for c in text)
    return v.strip("_.-")[:63].strip("_.-")


def inventory_labels(state: dict[str, Any]) -> dict[str, str]:
    """What the device plugin should label the node with for the Runtime's ``state`` (its
    ``/state``, each device with the ``profiles`` of its partitions added; model and memory from
    the node's inventory, which partitioning does not change): count, model, memory,
    partitioning, per-profile counts, sharing mode, vfio count."""
    inventory = {d.id: d for d in load_inventory(INVENTORY).devices}
    devices = state["devices"]
    counts: Counter[str] = Counter()
    for d in devices.values():
        for profile in d["profiles"]:
            counts[f"mig-{profile}.count" if d["mode"] == "mig" else f"{profile}.count"] += 1
    first = inventory[min(devices, key=lambda i: inventory[i].index)]
    shareable = any(
        d["mode"] == "none" and d["binding"] == "driver" and inventory[i].kind is Kind.GPU
        for i, d in devices.items()
    )
    out = {
        "count": str(len(devices)),
        "model": label_value(first.model),
        "memory-gib": str(min(inventory[i].memory_bytes for i in devices) // GIB),
        "partitioning": "_".join(sorted({d["mode"] for d in devices.values()})),
        # the deployed plugin's config advertises gpu-core and gpu-memory
        "sharing-mode": "core-memory" if shareable else "none",
        "vfio.count": str(sum(d["binding"] == "vfio" for d in devices.values())),
        **{k: str(n) for k, n in counts.items()},
    }
    return {f"{PREFIX}/{k}": v for k, v in out.items()}


def expect(
    op: Operator, node: RealNode, targets: dict[int, tuple[str, list[Any]]], what: str
) -> None:
    """The Runtime's devices, the node's capacity, the plugin's NodeDevices object and its labels
    match ``targets`` (index → (mode, profiles or slices)); GPUs not named are whole on the
    driver. The labels are checked against the Runtime's state at this step: everything the
    plugin publishes from the inventory, not only the partitioning."""
    want = {i: targets.get(i, ("whole", [])) for i in range(8)}

    def devices_match() -> bool:
        devices = simulator_state(node)["devices"]
        for i, (mode, specs) in want.items():
            d = devices[f"gpu-{i}"]
            binding = "vfio" if mode == "vfio" else "driver"
            runtime_mode = mode if mode in ("mig", "tdm") else "none"
            if (d["mode"], d["binding"], len(d["partitions"])) != (
                runtime_mode,
                binding,
                len(specs),
            ):
                return False
        return True

    wait_for(f"{what}: the Runtime's devices", devices_match, 60)
    # The Runtime's state at this step, each partition with the profile the layout gave it (the
    # Runtime lists them in the layout's order; /state names only their ids).
    state = simulator_state(node)
    for i, (mode, specs) in want.items():
        profiles = [f"tdm-{s}" for s in specs] if mode == "tdm" else list(specs)
        state["devices"][f"gpu-{i}"]["profiles"] = profiles
    units = sum(len(s) if m in ("mig", "tdm") else 1 for m, s in want.values() if m != "vfio")
    vfio = sum(1 for m, _ in want.values() if m == "vfio")
    cap = {GPU: str(units), VFIO: str(vfio)}
    wait_for(
        f"{what}: capacity {cap}",
        lambda: {k: capacity(op, node).get(k, "0") for k in cap} == cap,
        90,
    )
    settle(f"{what}: NodeDevices", nodedevices_want(state), lambda: nodedevices(op, node), 60)

    labels_want = inventory_labels(state)
    # the labels above, and every profile count (one the layout does not make must be gone)
    keys = tuple(labels_want)

    def ours() -> dict[str, str]:
        have = op.node(node.name)["metadata"].get("labels", {})
        return {
            k: v
            for k, v in have.items()
            if k in keys or (k.startswith(PREFIX + "/") and k.endswith(".count"))
        }

    settle(f"{what}: labels", labels_want, ours, 60)


def nodedevices_want(state: dict[str, Any]) -> dict[str, Any]:
    """The parts of the NodeDevices status a layout decides, for the Runtime's ``state``."""
    devices = state["devices"]
    modes = sorted({d["mode"] for d in devices.values()})
    return {
        "deviceCount": len(devices),
        "partitioning": ",".join(modes),
        "devices": {
            i: {
                "partitionMode": d["mode"].upper(),
                "binding": d["binding"].upper(),
                "partitions": [
                    {"id": pid, "profile": profile, "resource": GPU}
                    for pid, profile in zip(d["partitions"], d["profiles"], strict=True)
                ],
            }
            for i, d in devices.items()
        },
    }


def nodedevices(op: Operator, node: RealNode) -> dict[str, Any]:
    """The same parts of the device plugin's NodeDevices object of ``node``."""
    found = op.json("get", "nodedevices", node.name)
    st = found.get("status") or {}
    return {
        "deviceCount": st.get("deviceCount"),
        "partitioning": (st.get("summary") or {}).get("partitioning"),
        "devices": {
            d["id"]: {
                "partitionMode": d.get("partitionMode"),
                "binding": d.get("binding"),
                "partitions": [
                    {k: p.get(k) for k in ("id", "profile", "resource")}
                    for p in d.get("partitions") or []
                ],
            }
            for d in st.get("devices") or []
        },
    }


@dataclass(frozen=True)
class Keeper:
    name: str
    uid: str
    gpus: list[int]
    allocations: list[str]


def keeper(op: Operator, node: RealNode, name: str) -> Keeper:
    pod = run_pod(op, name)
    ids = sorted(a["id"] for a in allocations(node) if a["pod"] == f"{WORK_NS}/{name}")
    return Keeper(name, pod["metadata"]["uid"], held_by(node, name), ids)


def undisturbed(op: Operator, node: RealNode, keepers: list[Keeper]) -> None:
    for k in keepers:
        pod = running(op, k.name)
        assert pod is not None, f"{k.name} no longer running"
        assert pod["metadata"]["uid"] == k.uid
        restarts = [c.get("restartCount", 0) for c in pod["status"]["containerStatuses"]]
        assert restarts == [0], f"{k.name} restarted: {restarts}"
        ids = sorted(a["id"] for a in allocations(node) if a["pod"] == f"{WORK_NS}/{k.name}")
        assert ids == k.allocations, f"{k.name}'s allocations changed: {ids} != {k.allocations}"


def events(op: Operator, node: RealNode, reason: str) -> list[dict[str, Any]]:
    return op.events(reason, node.name)


def fenced_while_waiting(op: Operator, node: RealNode, gpus: list[int]) -> None:
    """Issue 39, while step-mig waits for the holder: both GPUs it changes are fenced (not only
    the held one), with an Event; then the holder is deleted."""
    ids = [f"gpu-{i}" for i in sorted(gpus)]
    [fenced, *_] = wait_for(
        "PartitionFenced naming the GPUs and the holder",
        lambda: [
            ev
            for ev in events(op, node, "PartitionFenced")
            if f"{WORK_NS}/holder" in ev.get("message", "")
        ],
        60,
    )
    assert all(i in fenced["message"] for i in ids), fenced["message"]
    fence_holds(op, node, ids)
    # The device plugin restarted mid-change finds the fence on the node again.
    old = plugin_pod(op, node)
    assert old is not None
    op.kubectl("-n", NS, "delete", "pod", old["metadata"]["name"], "--wait=true")
    wait_for(
        "a new device plugin pod ready",
        lambda: (
            (p := plugin_pod(op, node)) is not None
            and p["metadata"]["uid"] != old["metadata"]["uid"]
            and all_running([p])
        ),
        120,
    )
    fence_holds(op, node, ids)
    # A new pod goes to a GPU the change does not wait for.
    run_pod(op, "newcomer")
    assert not set(held_by(node, "newcomer")) & set(gpus), held_by(node, "newcomer")
    op.kubectl("-n", WORK_NS, "delete", "pod", "newcomer", "--wait=true")
    op.kubectl("-n", WORK_NS, "delete", "pod", "holder", "--wait=true")


def unfenced(op: Operator, node: RealNode) -> None:
    """Issue 39, once the change converged: the fence is lifted, and an Event says so."""
    wait_for("PartitionUnfenced", lambda: events(op, node, "PartitionUnfenced"), 60)
    settle("allocatable back", capacity(op, node)[GPU], lambda: allocatable(op, node), 30)
    assert fenced_in_nodedevices(op, node) == []


def test_a_node_goes_whole_mig_tdm_vfio_whole_with_pods_on_other_gpus_undisturbed(
    setup: Setup,
) -> None:
    op, node = setup.op, setup.node
    keepers = [keeper(op, node, "keeper-a"), keeper(op, node, "keeper-b")]
    run_pod(op, "holder")
    held = held_by(node, "holder")
    kept = {g for k in keepers for g in k.gpus}
    free = [i for i in range(8) if i not in kept and i not in held]
    assert len(held) == 1
    assert len(free) >= 5, (kept, held)
    w, a, b, c, e, f = held[0], *free[:5]
    layouts(
        op,
        {
            "step-mig": f"- {{devices: [{w}, {a}], mig: [{', '.join(MIG)}]}}",
            "step-tdm": (
                f"- {{devices: [{w}, {a}], mig: [{', '.join(MIG)}]}}\n"
                f"- {{devices: [{b}, {c}], tdm: [{', '.join(map(str, TDM))}]}}"
            ),
            "mixed-on-one": (
                f"- {{devices: [{b}], mig: [1g.10gb]}}\n- {{devices: [{b}], tdm: [50]}}"
            ),
            "too-big": f"- {{devices: [{b}], mig: [4g.40gb, 3g.60gb]}}",
            "step-vfio": f"- {{devices: [{e}, {f}], vfio: true}}",
            "all-whole": "[]",
        },
    )

    # 1. MIG on a GPU a pod holds: waits, names the pod, converges once it is deleted.
    select(op, node, "step-mig")
    [waiting, *_] = wait_for(
        "PartitionWaiting naming the holder",
        lambda: [
            ev
            for ev in events(op, node, "PartitionWaiting")
            if f"{WORK_NS}/holder" in ev.get("message", "")
        ],
        200,
    )
    assert f"gpu-{w}" in waiting["message"]
    assert [simulator_state(node)["devices"][f"gpu-{i}"]["mode"] for i in (w, a)] == [
        "none",
        "none",
    ], "changed under a pod, or half a layout applied"
    fenced_while_waiting(op, node, [w, a])  # and then the holder is deleted
    wait_for("step-mig converged", lambda: converged(op, node, "step-mig"), 240)
    expect(op, node, {w: ("mig", MIG), a: ("mig", MIG)}, "step-mig")
    unfenced(op, node)
    undisturbed(op, node, keepers)

    # 2. TDM on two more GPUs; the MIG GPUs stay as they are.
    select(op, node, "step-tdm")
    wait_for("step-tdm converged", lambda: converged(op, node, "step-tdm"), 180)
    tdm_targets: dict[int, tuple[str, list[Any]]] = {
        w: ("mig", MIG),
        a: ("mig", MIG),
        b: ("tdm", TDM),
        c: ("tdm", TDM),
    }
    expect(op, node, tdm_targets, "step-tdm")
    undisturbed(op, node, keepers)

    # 3. Refused: MIG and TDM on one GPU (the controller; no Job), MIG over the GPU's memory (the
    # agent, against the Runtime's inventory). Each an Event; nothing changes.
    for layout, words in (
        ("mixed-on-one", "MIG and TDM"),
        ("too-big", "need 100 GiB, the GPU has 80"),
    ):
        select(op, node, layout)
        [refusal] = wait_for(
            f"{layout} refused",
            lambda layout=layout: [  # type: ignore[misc]
                ev
                for ev in events(op, node, "PartitionLayoutRefused")
                if layout in ev.get("message", "")
            ],
            180,
        )
        assert words in refusal["message"], refusal["message"]
        assert refusal["type"] == "Warning"
        assert pstatus(op, node)["result"] == "refused"
        expect(op, node, tdm_targets, f"{layout} refused")
    undisturbed(op, node, keepers)

    # 4. Two GPUs to vfio-pci; the MIG and TDM GPUs whole again: six advertised, two as vfio.
    select(op, node, "step-vfio")
    wait_for("step-vfio converged", lambda: converged(op, node, "step-vfio"), 180)
    expect(op, node, {e: ("vfio", []), f: ("vfio", [])}, "step-vfio")
    assert capacity(op, node) == {GPU: "6", VFIO: "2"}
    undisturbed(op, node, keepers)

    # 5. Whole again, everywhere — after the VM pod on a vfio GPU ends: the Runtime made no
    # allocation for it, the kubelet's pod-resources API names it.
    vm = workload("vm", WORK_NS, {VFIO: "1"}, scheduler=None)
    op.kubectl("create", "-f", write_json(op, "vm", vm))
    wait_for("the VM pod running", lambda: running(op, "vm"), 120)
    select(op, node, "all-whole")
    [on_vfio, *_] = wait_for(
        "PartitionWaiting naming the VM pod",
        lambda: [
            ev
            for ev in events(op, node, "PartitionWaiting")
            if f"{WORK_NS}/vm" in ev.get("message", "")
        ],
        200,
    )
    assert "aliyun.com/gpu-vfio" in on_vfio["message"], on_vfio["message"]
    states = simulator_state(node)["devices"]
    assert [states[f"gpu-{i}"]["binding"] for i in (e, f)] == ["vfio", "vfio"], "unbound under a VM"
    op.kubectl("-n", WORK_NS, "delete", "pod", "vm", "--wait=true")
    wait_for("all-whole converged", lambda: converged(op, node, "all-whole"), 180)
    expect(op, node, {}, "all-whole")
    undisturbed(op, node, keepers)
    assert len(events(op, node, "PartitionConverged")) >= 4
    assert not events(op, node, "PartitionFailed")
