"""Allocation lifecycle on real nodes (#18, "Done when", first bullet): many pods through the same
eight GPUs of one real node and eight PPUs of another (kubelet + containerd + runc, the suite
deployed by deploy-all.sh from the built images), in waves — whole (1, 2, 4, 8 GPUs or PPUs) and
shared (gpu-core/gpu-memory pairs, some identical and submitted at the same moment, some
different), pods deleted, pods that fail on their own (the probe's ``apiserver`` mode without a
service account exits 2) — with the device-plugin pod deleted, the Runtime restarted and the
kubelet restarted at seeded random points.

After every wave, and at the end: the Runtime holds exactly the live containers' allocations (one
per Running pod's container, under its namespace/name and container), no pod was refused admission
(no UnexpectedAdmissionError, "held whole by" or Allocate error in statuses or Events), no two live
containers hold one whole GPU, no GPU is over 100 % core, and every container got the scheduler's
decision (the gpu-assignment devices == the Runtime allocation's == what reached the runtime).

The seed is printed; ``LJ_LIFECYCLE_SEED=<n>`` replays a run."""

from __future__ import annotations

import functools
import json
import os
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest

from lj_runtimekit_testkit.node import RealNode
from lj_runtimekit_testkit.suite import (
    LAST_ACTION,
    NS,
    Operator,
    accelerator_capacity,
    allocations,
    injected,
    wait_for,
    workload,
)

from .conftest import RealCluster

pytestmark = [pytest.mark.realnode, pytest.mark.images, pytest.mark.timeout(900)]

WORK_NS = "lifecycle"
GPU, CORE, MEM = "aliyun.com/gpu", "aliyun.com/gpu-core", "aliyun.com/gpu-memory"
PPU = "alibabacloud.com/ppu"
RESOURCES = {"gpu": (GPU, CORE, MEM), "ppu": (PPU,)}
"""What each node's device plugin registers with its kubelet."""
INVENTORIES = {"gpu": "gpu-8x-nvlink", "ppu": "ppu-8x"}
ASSIGNMENT = "lj-runtimekit-scheduler/gpu-assignment"
MARK = "lj-runtimekit-device-plugin/allocation"
GIB = 1 << 30
GPUS = PPUS = 8
SHARES = [(30, 10), (50, 20), (20, 8), (25, 16), (40, 30)]
"""gpu-core percent and gpu-memory GiB pairs the shared pods ask."""
LEAK_WORDS = ("UnexpectedAdmissionError", "held whole by", "Allocate", "refused", "Ambiguous")
# The scheduler waiting for a confirmation or room; the test node has no cluster DNS.
BENIGN_WARNINGS = {"FailedScheduling", "MissingClusterDNS"}
WAVES = 5
DISRUPTIONS = ("plugin", "runtime", "kubelet")


@dataclass(frozen=True)
class Spec:
    name: str
    whole: int = 0
    share: tuple[int, int] | None = None
    fails: bool = False
    resource: str = GPU

    @property
    def cost(self) -> int:
        """Devices the pod may take at worst (a share may get a GPU of its own)."""
        return self.whole or 1

    def body(self) -> dict[str, Any]:
        limits = {self.resource: str(self.whole)}
        if self.share:
            limits = {CORE: str(self.share[0]), MEM: str(self.share[1])}
        pod = workload(self.name, WORK_NS, limits)
        if self.fails:
            # The probe's apiserver mode without a service account token exits 2 at once.
            pod["spec"]["automountServiceAccountToken"] = False
            pod["spec"]["containers"][0]["args"] = ["apiserver"]
        return pod


@dataclass
class Tally:
    created: int = 0
    ran: int = 0
    failed_on_own: int = 0
    deleted: int = 0
    disruptions: Counter[str] = field(default_factory=Counter)
    checks: int = 0

    def line(self) -> str:
        d = ", ".join(f"{k} {v}" for k, v in sorted(self.disruptions.items()))
        return (
            f"pods created {self.created}, ran {self.ran}, failed on their own "
            f"{self.failed_on_own}, deleted {self.deleted}; disruptions: {d}; "
            f"checks {self.checks}"
        )


@pytest.fixture(scope="module")
def nodes(real_cluster: RealCluster) -> tuple[Operator, dict[str, RealNode]]:
    """A GPU node and a PPU node, labelled, the suite deployed by deploy-all.sh, each node enabled
    by the controller's agent Job and its devices registered."""
    rc = real_cluster
    for role, inventory in INVENTORIES.items():
        rc.operator.label(rc.add_node(role, inventory).name, True)
    out = rc.operator.deploy_all("deploy")
    assert "all selected components are ready" in out.stdout, out.stdout
    op = rc.operator
    op.kubectl("create", "namespace", WORK_NS)
    for role, node in rc.named.items():
        resource = RESOURCES[role][0]
        wait_for(
            f"{node.name} enabled by the agent", functools.partial(enabled, op, node.name), 240
        )
        wait_for(f"{resource} registered", functools.partial(capacity, op, node, resource), 60)
    wait_for(
        "the default service account",
        lambda: op.kubectl("-n", WORK_NS, "get", "sa", "default", check=False).returncode == 0,
        30,
        0.2,
    )
    return op, dict(rc.named)


def capacity(op: Operator, node: RealNode, resource: str) -> str | None:
    return accelerator_capacity(op.node(node.name)).get(resource)


def enabled(op: Operator, node: str) -> bool:
    raw = op.node(node)["metadata"].get("annotations", {}).get(LAST_ACTION, "{}")
    status: dict[str, Any] = json.loads(raw or "{}")
    if status.get("action") == "enable" and status.get("result") == "failed":
        raise AssertionError(f"enable failed on {node}: {status}")
    return bool(status.get("action") == "enable" and status.get("result") == "succeeded")


# ---------------------------------------------------------------------------- the plan


def plan_wave(rng: random.Random, wave: int, free: int, free_ppu: int) -> list[Spec]:
    """Pods for one wave that fit in ``free`` GPUs whatever the scheduler picks: an identical
    shared pair (at the same moment), different shares, whole pods, and maybe one that fails;
    whole PPUs within ``free_ppu``, maybe one failing."""
    specs: list[Spec] = []
    pair = rng.choice(SHARES)
    if free >= 2:
        specs += [Spec(f"w{wave}-same-a", share=pair), Spec(f"w{wave}-same-b", share=pair)]
    if rng.random() < 0.7 and free - sum(s.cost for s in specs) >= 1:
        kind = rng.choice(["whole", "share"])
        share = rng.choice(SHARES) if kind == "share" else None
        specs.append(Spec(f"w{wave}-fails", whole=0 if share else 1, share=share, fails=True))
    for i, n in enumerate(rng.sample([1, 1, 2, 4], 4)):
        if sum(s.cost for s in specs) + n <= free:
            specs.append(Spec(f"w{wave}-whole{n}-{i}", whole=n))
    other = rng.choice([s for s in SHARES if s != pair])
    if sum(s.cost for s in specs) + 1 <= free:
        specs.append(Spec(f"w{wave}-share", share=other))
    for i, n in enumerate(rng.sample([1, 2, 4], rng.randint(1, 2))):
        if n <= free_ppu:
            free_ppu -= n
            fails = i == 1 and rng.random() < 0.5
            specs.append(Spec(f"w{wave}-ppu{n}-{i}", whole=n, fails=fails, resource=PPU))
    return specs


def plan_disruptions(rng: random.Random) -> dict[int, list[tuple[str, str, str]]]:
    """Wave → [(what, node role, when)]: each kind at least once on the GPU node, one more of
    any kind on either node. The Runtime may restart while the wave's pods are being admitted
    ("during"); the kubelet and the plugin only after the wave's deletions ("after": the kubelet
    refuses pods admitted before a plugin registers, its race, not ours), with releases still
    pending."""
    plan: dict[int, list[tuple[str, str, str]]] = {}
    extra = (rng.choice(DISRUPTIONS), rng.choice(list(INVENTORIES)))
    for what, role in (*((d, "gpu") for d in DISRUPTIONS), extra):
        wave = rng.randrange(WAVES)
        when = rng.choice(["during", "after"]) if what == "runtime" else "after"
        plan.setdefault(wave, []).append((what, role, when))
    return plan


# ---------------------------------------------------------------------------- cluster reads


def pods(op: Operator, node: str = "") -> list[dict[str, Any]]:
    """The workload pods (on ``node`` if given)."""
    items: list[dict[str, Any]] = op.json("-n", WORK_NS, "get", "pods")["items"]
    return [p for p in items if not node or p["spec"].get("nodeName") == node]


def live(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        p
        for p in items
        if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    ]


def create(op: Operator, specs: list[Spec]) -> None:
    """All of ``specs`` in one request: the scheduler sees them at the same moment."""
    path = op.log_dir / f"lifecycle-{specs[0].name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"apiVersion": "v1", "kind": "List", "items": [s.body() for s in specs]}
    path.write_text(json.dumps(body))
    op.kubectl("create", "-f", str(path))


def settled(op: Operator, specs: list[Spec]) -> list[dict[str, Any]] | None:
    """The wave's pods once each is Running (or Failed, for the ones meant to fail)."""
    by_name = {p["metadata"]["name"]: p for p in pods(op)}
    for s in specs:
        pod = by_name[s.name]
        phase = pod["status"].get("phase")
        if not s.fails and phase in ("Failed", "Succeeded"):
            raise AssertionError(f"pod {s.name} ended {phase}: {json.dumps(pod['status'])[:2000]}")
        if phase != ("Failed" if s.fails else "Running"):
            return None
    return [by_name[s.name] for s in specs]


def registrations(op: Operator, node: str) -> tuple[str, Counter[str]]:
    """The device-plugin pod on ``node`` and how often it registered each resource (its log)."""
    items = op.json("-n", NS, "get", "pods", "-l", "app=lj-runtimekit-device-plugin")["items"]
    mine = [
        p
        for p in items
        if p["spec"].get("nodeName") == node and not p["metadata"].get("deletionTimestamp")
    ]
    if len(mine) != 1:
        return "", Counter()
    name = mine[0]["metadata"]["name"]
    text = op.kubectl("-n", NS, "logs", name, check=False).stdout
    seen: Counter[str] = Counter()
    for line in text.splitlines():
        if '"event": "registered"' in line:
            seen.update(r for rs in RESOURCES.values() for r in rs if f'"resource": "{r}"' in line)
    return name, seen


def disrupt(op: Operator, node: RealNode, what: str, resources: tuple[str, ...]) -> None:
    """One restart; returns when the node takes new pods of ``resources`` again."""
    pod, before = registrations(op, node.name)
    if what == "runtime":
        node.restart("runtime")
        return
    if what == "kubelet":
        node.restart("kubelet")
    else:
        op.kubectl("-n", NS, "delete", "pod", pod, "--wait=true", "--timeout=120s")

    def registered_again() -> bool:
        now, seen = registrations(op, node.name)
        if what == "plugin" and now == pod:
            return False
        base = before if now == pod else Counter[str]()
        return all(seen[r] > base[r] for r in resources)

    wait_for(f"the device plugin registered again after the {what} restart", registered_again, 120)


# ---------------------------------------------------------------------------- the checks


def refusals(op: Operator) -> list[str]:
    """Admissions refused or Allocates failed (any node): pod statuses and Warning Events."""
    found = []
    for p in pods(op):
        status = p["status"]
        text = f"{status.get('reason', '')} {status.get('message', '')}"
        if any(w in text for w in LEAK_WORDS):
            found.append(f"pod {p['metadata']['name']}: {text.strip()}")
    for e in op.json("-n", WORK_NS, "get", "events")["items"]:
        if e.get("type") == "Warning" and e.get("reason") not in BENIGN_WARNINGS:
            found.append(
                f"event {e['reason']} on {e['involvedObject'].get('name')}: {e.get('message')}"
            )
    return found


def decisions(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        p["metadata"]["name"]: {
            k: v for k, v in p["metadata"].get("annotations", {}).items() if k in (ASSIGNMENT, MARK)
        }
        for p in live(items)
    }


def plugin_log(op: Operator, node: RealNode) -> str:
    """The device plugin's releases and warnings on ``node`` (this pod's log and the previous
    container's); the whole log goes to the deploy log directory."""
    pod, _ = registrations(op, node.name)
    if not pod:
        return "(no device-plugin pod)"
    text = op.kubectl("-n", NS, "logs", pod, check=False).stdout
    (op.log_dir / f"lifecycle-{pod}.log").write_text(text)
    words = ("allocation_released", '"warning"', '"error"', "registered", "reconcile")
    return "\n".join(ln for ln in text.splitlines() if any(w in ln for w in words))[-20000:]


def decision(pod: dict[str, Any]) -> list[dict[str, Any]]:
    raw = pod["metadata"].get("annotations", {}).get(ASSIGNMENT)
    assert raw, f"pod {pod['metadata']['name']} has no {ASSIGNMENT}"
    (container,) = [c for c in json.loads(raw)["containers"] if c["name"] == "main"]
    devices: list[dict[str, Any]] = container["devices"]
    return devices


def injected_devices(node: RealNode, pod: dict[str, Any]) -> list[str]:
    records = injected(node, pod["metadata"]["uid"])
    assert records, f"pod {pod['metadata']['name']}: the lj-runtime handler never ran for it"
    value = records[-1]["annotations"].get("xdm.amp.com.devices", "")
    return sorted(value.split(",")) if value else []


def expected_owners(items: list[dict[str, Any]]) -> Counter[tuple[str, str]]:
    return Counter((f"{WORK_NS}/{p['metadata']['name']}", "main") for p in live(items))


def check_node(op: Operator, node: RealNode, tally: Tally, ended: list[dict[str, Any]]) -> None:
    """The invariants of #18 on the node as it is now (the Runtime's releases may lag the pods'
    end by the plugin's two passes and grace: polled)."""
    tally.checks += 1
    items: list[dict[str, Any]] = []
    held: list[dict[str, Any]] = []

    def runtime_equals_live() -> bool:
        nonlocal items, held
        items, held = pods(op, node.name), allocations(node)
        return Counter((a["pod"], a["container"]) for a in held) == expected_owners(items)

    try:
        wait_for(
            "the Runtime holds exactly the live containers' allocations", runtime_equals_live, 60
        )
    except TimeoutError:
        got = Counter((a["pod"], a["container"]) for a in held)
        want = expected_owners(items)
        raise AssertionError(
            f"{node.name}: Runtime != live containers: extra {sorted((got - want).elements())}, "
            f"missing {sorted((want - got).elements())}\nallocations: {json.dumps(held)}\n"
            f"live pods' decisions and marks: {json.dumps(decisions(items))}\n"
            f"device plugin's releases:\n{plugin_log(op, node)}"
        ) from None
    refused = refusals(op)
    assert not refused, "\n".join(refused)
    whole = [d for a in held if not (a["core_percent"] or a["memory_bytes"]) for d in a["devices"]]
    assert len(whole) == len(set(whole)), f"a whole GPU held twice: {held}"
    core: Counter[str] = Counter()
    for a in held:
        if a["core_percent"] or a["memory_bytes"]:
            assert a["devices"][0] not in whole, f"{a['devices']} shared and held whole: {held}"
            core[a["devices"][0]] += a["core_percent"]
    assert all(v <= 100 for v in core.values()), f"a GPU over 100 % core: {core}"
    by_pod = {a["pod"]: a for a in held}
    for pod in live(items):
        alloc = by_pod[f"{WORK_NS}/{pod['metadata']['name']}"]
        check_decision(pod, alloc["devices"], alloc["core_percent"], alloc["memory_bytes"])
        assert injected_devices(node, pod) == sorted(alloc["devices"]), (pod["metadata"], alloc)
    for pod in [p for p in ended if p["spec"].get("nodeName") == node.name]:
        # failed on their own: they got their decision while they ran
        check_decision(pod, injected_devices(node, pod), None, None)


def check_decision(
    pod: dict[str, Any], devices: list[str], core: int | None, memory: int | None
) -> None:
    name = pod["metadata"]["name"]
    chosen = decision(pod)
    assert sorted(d["id"] for d in chosen) == sorted(devices), (
        f"pod {name}: the scheduler chose {chosen}, the container got {devices}"
    )
    if core is not None and not chosen[0].get("whole"):
        assert (core, memory) == (chosen[0]["core"], chosen[0]["memoryGiB"] * GIB), (
            f"pod {name}: the scheduler chose {chosen}, the Runtime gave {core} % {memory} B"
        )
    mark = json.loads(pod["metadata"].get("annotations", {}).get(MARK, "{}"))
    reported = {d for ids in mark.get("devices", {}).get("main", {}).values() for d in ids}
    assert reported == set(devices), f"pod {name}: the plugin reported {mark}"


# ---------------------------------------------------------------------------- the test


def test_many_pods_through_the_same_devices_with_restarts_at_random(
    nodes: tuple[Operator, dict[str, RealNode]],
) -> None:
    op, by_role = nodes
    seed = int(os.environ.get("LJ_LIFECYCLE_SEED") or random.SystemRandom().randrange(1 << 32))
    rng = random.Random(seed)
    disruptions = plan_disruptions(rng)
    print(f"lifecycle seed {seed} (LJ_LIFECYCLE_SEED={seed} replays it); plan {disruptions}")
    tally = Tally()
    ended: list[dict[str, Any]] = []
    started = time.monotonic()

    def disrupt_at(wave: int, moment: str) -> None:
        for what, role, when in disruptions.get(wave, []):
            if when == moment:
                disrupt(op, by_role[role], what, RESOURCES[role])
                tally.disruptions[f"{what}@{role}"] += 1

    def check() -> None:
        for node in by_role.values():
            check_node(op, node, tally, ended)

    for wave in range(WAVES + 1):
        if wave == WAVES:  # every device back: all eight to one pod, after everything is deleted
            delete(op, [p["metadata"]["name"] for p in pods(op)], tally)
            specs = [Spec("last-gpu8", whole=GPUS), Spec("last-ppu8", whole=PPUS, resource=PPU)]
        else:
            specs = plan_wave(rng, wave, GPUS - held_cost(op, GPU), PPUS - held_cost(op, PPU))
        create(op, specs)
        tally.created += len(specs)
        disrupt_at(wave, "during")
        done = wait_for(f"wave {wave} settled", functools.partial(settled, op, specs), 180)
        tally.ran += sum(1 for s in specs if not s.fails)
        tally.failed_on_own += sum(1 for s in specs if s.fails)
        for pod in done:
            if pod["status"]["phase"] == "Failed":
                (state,) = pod["status"]["containerStatuses"]
                assert state["state"]["terminated"]["exitCode"] == 2, state
        ended += [p for p in done if p["status"]["phase"] == "Failed"]
        check()
        running = [p["metadata"]["name"] for p in live(pods(op))]
        delete(op, [n for n in running if rng.random() < 0.6], tally)
        disrupt_at(wave, "after")
        print(f"wave {wave} at {time.monotonic() - started:.0f} s: {[s.name for s in specs]}")
    delete(op, [p["metadata"]["name"] for p in live(pods(op))], tally)
    check()
    for node in by_role.values():
        assert allocations(node) == [], node.name
    print(f"lifecycle seed {seed}: {tally.line()} in {time.monotonic() - started:.0f} s")


def held_cost(op: Operator, resource: str) -> int:
    """Devices of ``resource`` the live pods may hold at worst (a share counted as a GPU)."""
    total = 0
    for p in live(pods(op)):
        limits = p["spec"]["containers"][0]["resources"]["limits"]
        shared = resource == GPU and (CORE in limits or MEM in limits)
        total += int(limits.get(resource, 0)) or int(shared)
    return total


def delete(op: Operator, names: list[str], tally: Tally) -> None:
    if names:
        op.kubectl("-n", WORK_NS, "delete", "pod", *names, "--wait=true", "--timeout=120s")
        tally.deleted += len(names)
