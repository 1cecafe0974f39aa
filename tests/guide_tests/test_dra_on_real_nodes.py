"""DRA on a real node (#24, "Done when"): the suite deployed by deploy-all.sh from the built images
on a real node (kubelet + containerd + runc) with eight GPUs of the Runtime simulator, the node
labelled for DRA mode; kube-scheduler allocates the claims, the kubelet calls our DRA plugin.

A claim for one GPU and one for two GPUs on one NVLink island each give a pod that runs with the
Runtime's injection reaching the container through CDI (the env, the device nodes) and NRI (the
``xdm.amp.com*`` annotations, for the ``lj-runtime`` handler); deleting the
pods releases everything in the Runtime and removes their CDI specs; the exporter attributes the
claim's GPU to its pod. A restart of the plugin and
one of the kubelet while a pod holds a claim allocate nothing again and lose nothing: the pod's
deletion afterwards still releases. A device the Runtime reports unhealthy is tainted in the
ResourceSlice and a claim for seven GPUs avoids it; recovery clears the taint. The node never
advertises the devices as extended resources while in DRA mode. Two shares (30 % + 10 GiB and
50 % + 20 GiB, consumable capacity) run on one GPU with the Runtime's share limits reaching the
containers, while a whole-GPU claim gets another GPU. A pod asking
``aliyun.com/gpu: 1`` is served by DRA through the DeviceClass' extendedResourceName. A second
node with eight PPUs serves a PPU claim the same way."""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest

from lj_runtimekit_testkit.node import RealNode
from lj_runtimekit_testkit.suite import (
    NS,
    Operator,
    accelerator_capacity,
    all_running,
    allocations,
    injected,
    metrics,
    pod_series,
    simulator_control,
    wait_for,
    workload,
)

from .conftest import RealCluster
from .test_lifecycle_on_real_nodes import enabled

pytestmark = [pytest.mark.realnode, pytest.mark.images, pytest.mark.timeout(900)]

WORK_NS = "dra"
DRIVER = "lj-runtimekit.aliyun.com"
GPU_CLASS = "gpu.lj-runtimekit.aliyun.com"
PPU_CLASS = "ppu.lj-runtimekit.aliyun.com"
SHARE_CLASS = "gpu-share.lj-runtimekit.aliyun.com"
GIB = 1 << 30
MODE_LABEL = "lj_runtimekit_device_mode"
PLUGIN_APP = "lj-runtimekit-dra-plugin"
TAINT = "lj-runtimekit.aliyun.com/unhealthy"
EXTENDED_CLAIM = "resource.kubernetes.io/extended-resource-claim"


@pytest.fixture(scope="module")
def node(real_cluster: RealCluster) -> RealNode:
    rc = real_cluster
    node = rc.add_node("dra", "gpu-8x-nvlink")
    op = rc.operator
    op.label(node.name, True)
    op.kubectl("label", "node", node.name, f"{MODE_LABEL}=dra", "--overwrite")
    out = op.deploy_all("deploy")
    assert "all selected components are ready" in out.stdout, out.stdout
    op.kubectl("create", "namespace", WORK_NS)
    wait_for(f"{node.name} enabled", functools.partial(enabled, op, node.name), 240)
    wait_for("the DRA plugin running", lambda: plugin_pod(op, node), 180)
    wait_for("eight GPUs in the node's ResourceSlices", lambda: len(devices(op, node)) == 8, 120)
    wait_for(
        "the default service account",
        lambda: op.kubectl("-n", WORK_NS, "get", "sa", "default", check=False).returncode == 0,
        30,
        0.2,
    )
    return node


@pytest.fixture
def op(real_cluster: RealCluster) -> Operator:
    return real_cluster.operator


def plugin_pod(op: Operator, node: RealNode) -> dict[str, Any] | None:
    pods = op.json(
        "-n", NS, "get", "pods", "-l", f"app={PLUGIN_APP}", "--field-selector",
        f"spec.nodeName={node.name}",
    )["items"]  # fmt: skip
    return pods[0] if len(pods) == 1 and all_running(pods) else None


def slices(op: Operator, node: RealNode) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = op.json(
        "get", "resourceslices", "--field-selector",
        f"spec.nodeName={node.name},spec.driver={DRIVER}",
    )["items"]  # fmt: skip
    return items


def devices(op: Operator, node: RealNode) -> dict[str, dict[str, Any]]:
    """Device name → its entry in the node's ResourceSlices."""
    return {d["name"]: d for s in slices(op, node) for d in s["spec"].get("devices", [])}


def apply(op: Operator, name: str, *objs: dict[str, Any]) -> None:
    path = op.log_dir / f"dra-{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objs)}))
    op.kubectl("apply", "-f", str(path))


def gpus(count: int) -> dict[str, Any]:
    """A request (``exactly``) for ``count`` whole GPUs."""
    return {"deviceClassName": GPU_CLASS, "count": count}


def share(cores: int, memory: str, on: str = "") -> dict[str, Any]:
    """A request for a share of one GPU; ``on``: the GPU (Runtime device id) it must be on."""
    request: dict[str, Any] = {
        "deviceClassName": SHARE_CLASS,
        "capacity": {"requests": {"cores": str(cores), "memory": memory}},
    }
    if on:
        attr = f'device.attributes["{DRIVER}"].runtimeDeviceID'
        request["selectors"] = [{"cel": {"expression": f'{attr} == "{on}"'}}]
    return request


def claim_pod(
    op: Operator,
    node: RealNode,
    name: str,
    request: dict[str, Any],
    constraints: list[Any] | None = None,
) -> dict[str, Any]:
    """A ResourceClaimTemplate of one request (``exactly``) and a pod (default scheduler) using
    it; the pod once Running."""
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": WORK_NS},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [{"name": "gpus", "exactly": request}],
                    "constraints": constraints or [],
                }
            }
        },
    }
    pod = workload(name, WORK_NS, {}, node=node.name, scheduler=None)
    pod["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": name}]
    main = pod["spec"]["containers"][0]
    main["resources"] = {"claims": [{"name": "gpus"}]}
    apply(op, name, template, pod)
    return wait_for(f"pod {name} running", lambda: running(op, name), 180)


def running(op: Operator, name: str) -> dict[str, Any] | None:
    pod: dict[str, Any] = op.json("-n", WORK_NS, "get", "pod", name)
    if pod["status"].get("phase") == "Failed":
        raise AssertionError(f"pod {name} failed: {pod['status']}")
    return pod if all_running([pod]) else None


def held(node: RealNode, pod: str) -> list[dict[str, Any]]:
    return [a for a in allocations(node) if a["pod"] == f"{WORK_NS}/{pod}"]


def env_of(record: dict[str, Any]) -> dict[str, str]:
    return dict(e.split("=", 1) for e in record.get("env", []))


def pod_env(node: RealNode, pod: dict[str, Any]) -> dict[str, str]:
    (record,) = injected(node, pod["metadata"]["uid"])
    return env_of(record)


def claim_results(op: Operator, pod: dict[str, Any]) -> list[dict[str, Any]]:
    (status,) = pod["status"]["resourceClaimStatuses"]
    claim = op.json("-n", WORK_NS, "get", "resourceclaim", status["resourceClaimName"])
    results: list[dict[str, Any]] = claim["status"]["allocation"]["devices"]["results"]
    return results


def cdi_specs(node: RealNode) -> list[str]:
    d = node.host_path("/var/run/cdi")
    return sorted(p.name for p in d.glob("*.json")) if d.is_dir() else []


def delete_and_expect_release(op: Operator, node: RealNode, name: str) -> None:
    op.kubectl("-n", WORK_NS, "delete", "pod", name, "--wait=true", "--timeout=120s")
    wait_for(f"{name}'s allocations released", lambda: not held(node, name), 120)
    op.kubectl("-n", WORK_NS, "delete", "resourceclaimtemplate", name)


def test_the_node_serves_its_gpus_through_dra_only(op: Operator, node: RealNode) -> None:
    found = devices(op, node)
    assert len(found) == 8
    for d in found.values():
        attrs = d["attributes"]
        assert attrs["type"] == {"string": "gpu"}
        assert "nvlinkIsland" in attrs
        assert "memory" in d.get("capacity", {})
        assert not d.get("taints")
        # shares (consumable capacity): a request naming no capacity takes all of it
        assert d.get("allowMultipleAllocations") is True
        assert d["capacity"]["cores"]["value"] == "100"
        memory = d["capacity"]["memory"]
        assert memory["requestPolicy"]["default"] == memory["value"]
    assert not accelerator_capacity(op.node(node.name)).get("aliyun.com/gpu", "0").strip("0")
    classes = {c["metadata"]["name"] for c in op.json("get", "deviceclasses")["items"]}
    assert {GPU_CLASS, PPU_CLASS, SHARE_CLASS} <= classes


def test_a_one_gpu_claim_runs_with_the_runtimes_injection_through_cdi_and_is_released(
    op: Operator, node: RealNode
) -> None:
    pod = claim_pod(op, node, "one-gpu", gpus(1))
    (alloc,) = held(node, "one-gpu")
    assert len(alloc["devices"]) == 1
    (record,) = injected(node, pod["metadata"]["uid"])
    env = env_of(record)
    assert env.get("LJ_ALLOCATION_ID") == alloc["id"], env
    assert env.get("LJ_VISIBLE_DEVICES") == alloc["devices"][0]
    assert "NVIDIA_VISIBLE_DEVICES" in env
    index = alloc["devices"][0].rsplit("-", 1)[1]
    paths = {d.get("path") for d in record.get("devices", [])}
    assert f"/dev/nvidia{index}" in paths, paths
    # the Runtime's injection annotations reach the lj-runtime handler too: CDI carries none,
    # the DRA plugin's NRI plugin adds them at CreateContainer (docs/dra.md)
    annotations = record.get("annotations", {})
    assert annotations.get("xdm.amp.com.allocation-id") == alloc["id"], annotations
    assert annotations.get("xdm.amp.com.devices") == ",".join(alloc["devices"]), annotations
    assert len(cdi_specs(node)) == 1
    # the exporter attributes the claim's GPU to the pod (pod-resources' dynamic_resources)
    wait_for("the exporter's series of the pod", lambda: pod_series(metrics(node), "one-gpu"), 60)
    delete_and_expect_release(op, node, "one-gpu")
    wait_for("the claim's CDI spec removed", lambda: not cdi_specs(node), 60)


def test_two_gpus_on_one_nvlink_island(op: Operator, node: RealNode) -> None:
    island = f"{DRIVER}/nvlinkIsland"
    claim_pod(op, node, "pair", gpus(2), [{"requests": ["gpus"], "matchAttribute": island}])
    (alloc,) = held(node, "pair")
    assert len(alloc["devices"]) == 2
    found = devices(op, node)
    by_runtime_id = {d["attributes"]["runtimeDeviceID"]["string"]: d for d in found.values()}
    islands = {json.dumps(by_runtime_id[i]["attributes"]["nvlinkIsland"]) for i in alloc["devices"]}
    assert len(islands) == 1, islands
    delete_and_expect_release(op, node, "pair")


def test_two_shares_run_on_one_gpu_with_the_runtimes_limits_and_a_whole_gpu_goes_elsewhere(
    op: Operator, node: RealNode
) -> None:
    first = claim_pod(op, node, "share-a", share(30, "10Gi"))
    (a,) = held(node, "share-a")
    (gpu,) = a["devices"]
    second = claim_pod(op, node, "share-b", share(50, "20Gi", on=gpu))
    (b,) = held(node, "share-b")
    assert b["devices"] == [gpu]
    on_gpu = [x for x in allocations(node) if gpu in x["devices"]]
    assert sorted(x["id"] for x in on_gpu) == sorted([a["id"], b["id"]])
    for pod, alloc, cores, memory in ((first, a, 30, 10 * GIB), (second, b, 50, 20 * GIB)):
        env = pod_env(node, pod)
        assert env.get("LJ_GPU_CORE_PERCENT") == str(cores), env
        assert env.get("LJ_GPU_MEMORY_LIMIT_BYTES") == str(memory), env
        assert env.get("LJ_ALLOCATION_ID") == alloc["id"]
        assert env.get("LJ_VISIBLE_DEVICES") == gpu
        (result,) = claim_results(op, pod)
        assert result["shareID"]
        assert result["consumedCapacity"] == {"cores": str(cores), "memory": f"{memory // GIB}Gi"}
    assert len(cdi_specs(node)) == 2
    # a claim for a whole GPU consumes all of one: never the shared one
    whole = claim_pod(op, node, "whole", gpus(1))
    (w,) = held(node, "whole")
    assert w["devices"] != [gpu]
    assert "LJ_GPU_CORE_PERCENT" not in pod_env(node, whole)
    for name in ("share-a", "share-b", "whole"):
        delete_and_expect_release(op, node, name)
    wait_for("their CDI specs removed", lambda: not cdi_specs(node), 60)


def test_plugin_and_kubelet_restarts_repeat_nothing_and_lose_nothing(
    op: Operator, node: RealNode
) -> None:
    claim_pod(op, node, "survivor", gpus(1))
    before = held(node, "survivor")
    assert len(before) == 1
    old = plugin_pod(op, node)
    assert old is not None
    op.kubectl("-n", NS, "delete", "pod", old["metadata"]["name"], "--wait=true")
    wait_for(
        "a new DRA plugin pod",
        lambda: (p := plugin_pod(op, node)) and p["metadata"]["uid"] != old["metadata"]["uid"],
        180,
    )
    node.restart("kubelet")
    wait_for("the pod still running", lambda: running(op, "survivor"), 120)
    assert held(node, "survivor") == before
    assert len(allocations(node)) == 1
    delete_and_expect_release(op, node, "survivor")
    # the kubelet deletes every ResourceSlice of its node when it starts: the plugin sees them go
    # and writes them again (before, the node had none until its next health change)
    wait_for(
        "eight GPUs in the node's ResourceSlices again", lambda: len(devices(op, node)) == 8, 60
    )


def test_an_unhealthy_gpu_is_tainted_avoided_and_cleared_on_recovery(
    op: Operator, node: RealNode
) -> None:
    sick = "gpu-7"
    simulator_control(node, "/health", {"device": sick, "healthy": False, "reason": "xid-79"})

    def tainted() -> bool:
        d = next((d for d in devices(op, node).values() if d["attributes"]["runtimeDeviceID"] == {
            "string": sick}), None)  # fmt: skip
        assert d is not None, f"{sick} is not in the node's ResourceSlices"
        return any(t["key"] == TAINT for t in d.get("taints", []))

    try:
        wait_for(f"{sick} tainted", tainted, 60)
        claim_pod(op, node, "seven", gpus(7))
        (alloc,) = held(node, "seven")
        assert sick not in alloc["devices"]
        delete_and_expect_release(op, node, "seven")
    finally:
        simulator_control(node, "/health", {"device": sick, "healthy": True})
    wait_for(f"{sick}'s taint cleared", lambda: not tainted(), 60)


def test_a_pod_asking_the_extended_resource_is_served_by_dra_through_the_mapping(
    op: Operator, node: RealNode
) -> None:
    """``aliyun.com/gpu: 1`` and no claim: kube-scheduler makes the claim from the DeviceClass
    whose extendedResourceName it is (the node does not advertise the resource itself)."""
    body = workload("mapped", WORK_NS, {"aliyun.com/gpu": "1"}, node=node.name, scheduler=None)
    apply(op, "mapped", body)
    pod = wait_for("pod mapped running", lambda: running(op, "mapped"), 180)
    (alloc,) = held(node, "mapped")
    assert len(alloc["devices"]) == 1
    (record,) = injected(node, pod["metadata"]["uid"])
    assert env_of(record).get("LJ_ALLOCATION_ID") == alloc["id"]
    # the driver records the mapped container with the Runtime: the exporter attributes it
    wait_for("the exporter's series of mapped", lambda: pod_series(metrics(node), "mapped"), 60)
    op.kubectl("-n", WORK_NS, "delete", "pod", "mapped", "--wait=true", "--timeout=120s")
    wait_for("mapped's allocation released", lambda: not held(node, "mapped"), 120)


def test_pods_asking_gpu_core_and_gpu_memory_are_placed_by_our_scheduler_with_a_claim(
    op: Operator, node: RealNode
) -> None:
    """``gpu-core: 30`` + ``gpu-memory: 10`` unchanged, scheduled by lj-runtimekit-scheduler onto
    the DRA node: it writes the pod's claim (a share of one GPU) and extendedResourceClaimStatus,
    the kubelet prepares the claim through the driver, the Runtime holds 30 % and 10 GiB; a
    second pod shares the GPU; deleting the pods releases both and the claims go with them."""
    limits = {"aliyun.com/gpu-core": "30", "aliyun.com/gpu-memory": "10"}
    names = ("core-a", "core-b")
    pods = []
    for name in names:
        apply(op, name, workload(name, WORK_NS, limits, node=node.name))
        pods.append(wait_for(f"pod {name} running", functools.partial(running, op, name), 180))
    (a,), (b,) = held(node, "core-a"), held(node, "core-b")
    assert a["devices"] == b["devices"], (a, b)  # binpack: one GPU
    for pod, alloc in zip(pods, (a, b), strict=True):
        env = pod_env(node, pod)
        assert env.get("LJ_GPU_CORE_PERCENT") == "30", env
        assert env.get("LJ_GPU_MEMORY_LIMIT_BYTES") == str(10 * GIB), env
        assert env.get("LJ_ALLOCATION_ID") == alloc["id"]
        mapping = pod["status"]["extendedResourceClaimStatus"]
        claim = op.json("-n", WORK_NS, "get", "resourceclaim", mapping["resourceClaimName"])
        assert claim["metadata"]["annotations"][EXTENDED_CLAIM] == "true"
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert result["consumedCapacity"] == {"cores": "30", "memory": "10Gi"}
        assert {m["resourceName"] for m in mapping["requestMappings"]} == set(limits)
    # the exporter attributes the claim's GPU to the pod (pod-resources lists the claim's device)
    wait_for("the exporter's series of core-a", lambda: pod_series(metrics(node), "core-a"), 60)
    for name in names:
        op.kubectl("-n", WORK_NS, "delete", "pod", name, "--wait=true", "--timeout=120s")
        wait_for(f"{name}'s allocation released", functools.partial(no_hold, node, name), 120)

    def claims_left() -> list[str]:
        items = op.json("-n", WORK_NS, "get", "resourceclaims")["items"]
        return [c["metadata"]["name"] for c in items if c["metadata"]["name"].startswith("core-")]

    wait_for("the pods' claims gone with them", lambda: not claims_left(), 60)


def no_hold(node: RealNode, pod: str) -> bool:
    return not held(node, pod)


@pytest.fixture(scope="module")
def ppu_node(real_cluster: RealCluster, node: RealNode) -> RealNode:
    """A second node in DRA mode, with eight PPUs (the suite is deployed by ``node``)."""
    rc = real_cluster
    ppu = rc.add_node("dra-ppu", "ppu-8x")
    op = rc.operator
    op.label(ppu.name, True)
    op.kubectl("label", "node", ppu.name, f"{MODE_LABEL}=dra", "--overwrite")
    wait_for(f"{ppu.name} enabled", functools.partial(enabled, op, ppu.name), 240)
    wait_for("the DRA plugin running there", lambda: plugin_pod(op, ppu), 180)
    wait_for("eight PPUs in its ResourceSlices", lambda: len(devices(op, ppu)) == 8, 120)
    return ppu


def test_a_ppu_claim_runs_and_is_released(op: Operator, ppu_node: RealNode) -> None:
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-ppu", "namespace": WORK_NS},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "ppus",
                            "exactly": {"deviceClassName": PPU_CLASS, "count": 1},
                        }
                    ]
                }
            }
        },
    }
    pod = workload("one-ppu", WORK_NS, {}, node=ppu_node.name, scheduler=None)
    pod["spec"]["resourceClaims"] = [{"name": "ppus", "resourceClaimTemplateName": "one-ppu"}]
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "ppus"}]}
    apply(op, "one-ppu", template, pod)
    live = wait_for("pod one-ppu running", lambda: running(op, "one-ppu"), 180)
    (alloc,) = held(ppu_node, "one-ppu")
    assert alloc["devices"][0].startswith("ppu-")
    (record,) = injected(ppu_node, live["metadata"]["uid"])
    env = env_of(record)
    assert env.get("LJ_ALLOCATION_ID") == alloc["id"]
    assert "ALIXPU_VISIBLE_DEVICES" in env, env
    delete_and_expect_release(op, ppu_node, "one-ppu")


@pytest.mark.parametrize("scheduler", [None, "lj-runtimekit-scheduler"], ids=["mapping", "ours"])
def test_a_pod_asking_alibabacloud_ppu_lands_on_the_dra_node(
    op: Operator, ppu_node: RealNode, scheduler: str | None
) -> None:
    """``alibabacloud.com/ppu: 1`` and no claim: kube-scheduler serves it through the PPU
    class's extendedResourceName, lj-runtimekit-scheduler by making the pod's claim itself."""
    name = f"ppu-{'mapped' if scheduler is None else 'ours'}"
    body = workload(name, WORK_NS, {"alibabacloud.com/ppu": "1"}, node=ppu_node.name)
    if scheduler is None:
        del body["spec"]["schedulerName"]
    apply(op, name, body)
    pod = wait_for(f"pod {name} running", functools.partial(running, op, name), 180)
    (alloc,) = held(ppu_node, name)
    assert alloc["devices"][0].startswith("ppu-")
    assert pod["status"]["extendedResourceClaimStatus"]["requestMappings"][0]["resourceName"] == (
        "alibabacloud.com/ppu"
    )
    (record,) = injected(ppu_node, pod["metadata"]["uid"])
    assert env_of(record).get("LJ_ALLOCATION_ID") == alloc["id"]
    op.kubectl("-n", WORK_NS, "delete", "pod", name, "--wait=true", "--timeout=120s")
    wait_for(f"{name}'s allocation released", functools.partial(no_hold, ppu_node, name), 120)
