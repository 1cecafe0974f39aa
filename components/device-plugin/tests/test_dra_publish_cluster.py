"""The node's ResourceSlices on the real apiserver (issue 24): accepted as built, written on change
only with a rising pool generation, tainted while a device is unhealthy, shrunk, continued after a
restart, withdrawn, and never another node's or driver's. The suite's DeviceClasses and a claim
for them pass the apiserver's validation too. With ``dra_partitions: dynamic`` the slices (a
counter set per GPU in a slice of its own, the whole GPU and every MIG instance that could be made
drawing on it) are accepted, and kube-scheduler never gives out more of a GPU than it holds; a
layout's partitions are published as themselves."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as sync_client
from kubernetes.client.exceptions import ApiException
from kubernetes_asyncio import client

from lj_runtimekit_device_plugin.dra.claims import claim_allocation
from lj_runtimekit_device_plugin.dra.offers import DYNAMIC
from lj_runtimekit_device_plugin.dra.publish import GROUP, PLURAL, VERSION, SlicePublisher
from lj_runtimekit_device_plugin.dra.slices import DEFAULT_DRIVER, UNHEALTHY_TAINT_KEY
from lj_runtimekit_device_plugin.kube import api_client
from lj_runtimekit_device_plugin.model import GIB, Device, Link, Partition, RuntimeInfo
from lj_runtimekit_device_plugin.runtime import DriverFacts

pytestmark = pytest.mark.cluster

DEPLOY = Path(__file__).parents[3] / "deploy"
DEVICE_CLASSES = DEPLOY / "deviceplugin" / "05-deviceclasses.yaml"
RUNTIME = RuntimeInfo(version="v1.14.0", api_version="v1")
OTHER_DRIVER = "other.example.com"
ISLAND_0 = 'device.attributes["lj-runtimekit.aliyun.com"].nvlinkIsland == 0'


def gpus(n: int, *, unhealthy: dict[int, str] | None = None, kind: str = "gpu") -> list[Device]:
    """``n`` devices in NVLink islands of four; ``unhealthy`` maps an index to its reason."""
    sick = unhealthy or {}
    return [
        Device(
            id=f"{kind}-{i}",
            uuid=f"{kind.upper()}-{i:04d}",
            index=i,
            kind=kind,
            vendor="NVIDIA",
            model="H800",
            memory_bytes=80 * GIB,
            numa_node=i % 2,
            pci_bus_id=f"0000:{i % 256:02x}:00.0",
            links=tuple(
                Link(f"{kind}-{j}", "nvlink", 300.0)
                for j in range(i - i % 4, i - i % 4 + 4)
                if j != i
            ),
            healthy=i not in sick,
            reason=sick.get(i, ""),
        )
        for i in range(n)
    ]


def facts(n: int) -> DriverFacts:
    return DriverFacts(
        driver_version="550.54.15", compute_capability={f"gpu-{i}": "9.0" for i in range(n)}
    )


@pytest.fixture
async def api(cluster: Any) -> AsyncIterator[client.ApiClient]:
    a = await api_client(cluster.kubeconfig)
    try:
        yield a
    finally:
        await a.close()


@pytest.fixture
def nodes(cluster: Any) -> Iterator[list[str]]:
    """Two fresh nodes; deleted afterwards with whatever slices a test left."""
    names = cluster.create_gpu_nodes(2, prefix="dra", wait_ready=False)
    yield names
    with cluster.api_client() as a:
        core, custom = sync_client.CoreV1Api(a), sync_client.CustomObjectsApi(a)
        for name in names:
            for s in slices_of(cluster, name, driver=None):
                custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, s["metadata"]["name"])
            core.delete_node(name)


def slices_of(cluster: Any, node: str, driver: str | None = DEFAULT_DRIVER) -> list[dict[str, Any]]:
    """The node's slices on the apiserver (of ``driver``, or of every driver), by name."""
    selector = f"spec.nodeName={node}" + (f",spec.driver={driver}" if driver else "")
    with cluster.api_client() as a:
        got: Any = sync_client.CustomObjectsApi(a).list_cluster_custom_object(
            GROUP, VERSION, PLURAL, field_selector=selector
        )
    items: list[dict[str, Any]] = got["items"]
    return sorted(items, key=lambda s: str(s["metadata"]["name"]))


def generations(slices: list[dict[str, Any]]) -> set[int]:
    return {s["spec"]["pool"]["generation"] for s in slices}


def devices_in(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices for d in s["spec"]["devices"]}


def foreign_slice(node: str, driver: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 7, "resourceSliceCount": 1},
            "devices": [{"name": "dev-0"}],
        },
    }


async def test_first_publish_is_accepted_and_an_equal_one_writes_nothing(
    cluster: Any, api: client.ApiClient, nodes: list[str]
) -> None:
    node = nodes[0]
    publisher = SlicePublisher(api, node)
    assert await publisher.publish(gpus(8), RUNTIME, facts(8))
    (rs,) = slices_of(cluster, node)
    with cluster.api_client() as a:
        uid = sync_client.CoreV1Api(a).read_node(node).metadata.uid  # type: ignore[union-attr]
    assert rs["metadata"]["ownerReferences"][0]["uid"] == uid
    assert rs["spec"]["pool"] == {"name": node, "generation": 1, "resourceSliceCount": 1}
    gpu3 = devices_in([rs])["gpu-3"]
    assert gpu3["attributes"]["type"] == {"string": "gpu"}
    assert gpu3["attributes"]["computeCapability"] == {"version": "9.0.0"}
    assert gpu3["attributes"]["driverVersion"] == {"version": "550.54.15"}
    assert gpu3["attributes"]["runtimeVersion"] == {"version": "1.14.0"}
    assert gpu3["allowMultipleAllocations"] is True
    assert gpu3["capacity"] == {
        "cores": {
            "value": "100",
            "requestPolicy": {
                "default": "100",
                "validRange": {"min": "1", "max": "100", "step": "1"},
            },
        },
        "memory": {
            "value": "80Gi",
            "requestPolicy": {"default": "80Gi", "validRange": {"min": "1Mi"}},
        },
    }

    assert not await publisher.publish(gpus(8), RUNTIME, facts(8))
    assert publisher.writes == 1
    (again,) = slices_of(cluster, node)
    assert again["metadata"]["resourceVersion"] == rs["metadata"]["resourceVersion"]


async def test_an_unhealthy_device_is_tainted_under_a_new_generation_and_recovery_clears_it(
    cluster: Any, api: client.ApiClient, nodes: list[str]
) -> None:
    node = nodes[0]
    publisher = SlicePublisher(api, node)
    await publisher.publish(gpus(8), RUNTIME, facts(8))

    await publisher.publish(gpus(8, unhealthy={5: "XidError79"}), RUNTIME, facts(8))
    (now,) = slices_of(cluster, node)
    assert generations([now]) == {2}
    devices = devices_in([now])
    (taint,) = devices["gpu-5"]["taints"]
    assert (taint["key"], taint["value"], taint["effect"]) == (
        UNHEALTHY_TAINT_KEY,
        "XidError79",
        "NoSchedule",
    )
    assert "timeAdded" in taint  # the apiserver's stamp
    assert "taints" not in devices["gpu-4"]

    # A second device turns unhealthy: the first one's taint keeps the time it was added.
    devices["gpu-5"]["taints"][0]["timeAdded"] = "2020-01-01T00:00:00Z"
    with cluster.api_client() as a:
        sync_client.CustomObjectsApi(a).replace_cluster_custom_object(
            GROUP, VERSION, PLURAL, now["metadata"]["name"], now
        )
    await publisher.publish(
        gpus(8, unhealthy={5: "XidError79", 6: "XidError48"}), RUNTIME, facts(8)
    )
    devices = devices_in(slices_of(cluster, node))
    assert devices["gpu-5"]["taints"][0]["timeAdded"] == "2020-01-01T00:00:00Z"
    assert devices["gpu-6"]["taints"][0]["value"] == "XidError48"

    await publisher.publish(gpus(8), RUNTIME, facts(8))
    now_all = slices_of(cluster, node)
    assert generations(now_all) == {4}
    assert not [n for n, d in devices_in(now_all).items() if "taints" in d]
    assert publisher.writes == 4


async def test_a_shrinking_pool_loses_its_surplus_slices_and_a_restart_continues_the_generation(
    cluster: Any, api: client.ApiClient, nodes: list[str]
) -> None:
    node, other = nodes
    with cluster.api_client() as a:  # what is not ours: the same node's other driver
        sync_client.CustomObjectsApi(a).create_cluster_custom_object(
            GROUP, VERSION, PLURAL, foreign_slice(node, OTHER_DRIVER, f"{node}-other")
        )
    neighbour = SlicePublisher(api, other)  # and another node's slices of our driver
    await neighbour.publish(gpus(130), RUNTIME, facts(130))
    before = slices_of(cluster, other)
    assert len(before) == 2

    publisher = SlicePublisher(api, node)
    await publisher.publish(gpus(130), RUNTIME, facts(130))
    two = slices_of(cluster, node)
    assert [s["spec"]["pool"]["resourceSliceCount"] for s in two] == [2, 2]
    assert [len(s["spec"]["devices"]) for s in two] == [128, 2]
    assert generations(two) == {1}

    await publisher.publish(gpus(100), RUNTIME, facts(100))
    (one,) = slices_of(cluster, node)
    assert one["spec"]["pool"] == {"name": node, "generation": 2, "resourceSliceCount": 1}
    assert len(one["spec"]["devices"]) == 100

    restarted = SlicePublisher(api, node)
    await restarted.publish(gpus(100), RUNTIME, facts(100))
    assert generations(slices_of(cluster, node)) == {3}

    assert await restarted.withdraw() == 1
    assert slices_of(cluster, node) == []
    assert await restarted.withdraw() == 0
    assert [s["metadata"]["name"] for s in slices_of(cluster, node, OTHER_DRIVER)] == [
        f"{node}-other"
    ]
    after = slices_of(cluster, other)
    assert [s["metadata"]["resourceVersion"] for s in after] == [
        s["metadata"]["resourceVersion"] for s in before
    ]


async def test_the_first_publish_after_a_restart_starts_above_the_existing_generation(
    cluster: Any, api: client.ApiClient, nodes: list[str]
) -> None:
    node = nodes[0]
    first = SlicePublisher(api, node)
    for sick in ({}, {1: "XidError48"}, {}, {2: "Lost"}):
        await first.publish(gpus(4, unhealthy=sick), RUNTIME, facts(4))
    assert generations(slices_of(cluster, node)) == {4}
    await SlicePublisher(api, node).publish(gpus(4, unhealthy={2: "Lost"}), RUNTIME, facts(4))
    assert generations(slices_of(cluster, node)) == {5}


async def test_a_node_without_publishable_devices_has_no_slices(
    cluster: Any, api: client.ApiClient, nodes: list[str]
) -> None:
    node = nodes[0]
    publisher = SlicePublisher(api, node)
    await publisher.publish(gpus(2), RUNTIME, None)
    assert len(slices_of(cluster, node)) == 1
    vfio = [Device(**{**d.__dict__, "binding": "vfio"}) for d in gpus(2)]
    await publisher.publish(vfio, RUNTIME, None)
    assert slices_of(cluster, node) == []


async def test_ppus_are_published_beside_gpus(
    cluster: Any, api: client.ApiClient, nodes: list[str]
) -> None:
    node = nodes[0]
    await SlicePublisher(api, node).publish(gpus(2) + gpus(2, kind="ppu"), RUNTIME, None)
    types = {
        n: d["attributes"]["type"]["string"]
        for n, d in devices_in(slices_of(cluster, node)).items()
    }
    assert types == {"gpu-0": "gpu", "gpu-1": "gpu", "ppu-0": "ppu", "ppu-1": "ppu"}


@pytest.fixture
def device_classes(cluster: Any) -> Iterator[dict[str, Any]]:
    """The suite's DeviceClasses as the apiserver stored them, by name; deleted afterwards, so
    that the session's other tests meet no extended-resource mapping."""
    classes = [d for d in yaml.safe_load_all(DEVICE_CLASSES.read_text()) if d]
    with cluster.api_client() as a:
        custom = sync_client.CustomObjectsApi(a)
        stored: dict[str, Any] = {}
        try:
            for body in classes:
                name = body["metadata"]["name"]
                custom.create_cluster_custom_object(GROUP, VERSION, "deviceclasses", body)
                stored[name] = custom.get_cluster_custom_object(
                    GROUP, VERSION, "deviceclasses", name
                )
            yield stored
        finally:
            for body in classes:
                try:
                    custom.delete_cluster_custom_object(
                        GROUP, VERSION, "deviceclasses", body["metadata"]["name"]
                    )
                except ApiException as e:
                    if e.status != 404:
                        raise


def pod(name: str, node: str, *, claim: str = "", gpus: int = 0) -> Any:
    container: dict[str, Any] = {"name": "main", "image": "busybox"}
    spec: dict[str, Any] = {
        "nodeSelector": {"kubernetes.io/hostname": node},
        "containers": [container],
    }
    if claim:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
        container["resources"] = {"claims": [{"name": "gpu"}]}
    if gpus:
        container["resources"] = {"limits": {"aliyun.com/gpu": str(gpus)}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


async def scheduled(cluster: Any, namespace: str, name: str) -> Any:
    """The pod once kube-scheduler bound it (30 s at most)."""
    deadline = time.monotonic() + 30
    with cluster.api_client() as a:
        core = sync_client.CoreV1Api(a)
        while True:
            got: Any = core.read_namespaced_pod(name, namespace)
            if got.spec.node_name:
                return got
            assert time.monotonic() < deadline, f"pod {name} not scheduled: {got.status}"
            await asyncio.sleep(0.2)


async def test_kube_scheduler_allocates_from_the_slices_through_the_device_classes(
    cluster: Any, api: client.ApiClient, namespace: str, device_classes: dict[str, Any]
) -> None:
    gpu_class = device_classes["gpu.lj-runtimekit.aliyun.com"]
    assert gpu_class["spec"]["extendedResourceName"] == "aliyun.com/gpu"
    ppu_class = device_classes["ppu.lj-runtimekit.aliyun.com"]
    assert ppu_class["spec"]["extendedResourceName"] == "alibabacloud.com/ppu"
    # a node in DRA mode: it advertises no aliyun.com/gpu, its GPUs are in its slices
    (node,) = cluster.create_gpu_nodes(1, prefix="dra-mode", gpus=0)
    try:
        await SlicePublisher(api, node).publish(
            gpus(8, unhealthy={0: "XidError79"}), RUNTIME, facts(8)
        )
        with cluster.api_client() as a:
            custom = sync_client.CustomObjectsApi(a)
            core = sync_client.CoreV1Api(a)
            custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, "resourceclaims", CLAIM
            )
            core.create_namespaced_pod(namespace, pod("with-claim", node, claim="one-gpu"))
            assert (await scheduled(cluster, namespace, "with-claim")).spec.node_name == node
            claim: Any = custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, "resourceclaims", "one-gpu"
            )
            (result,) = claim["status"]["allocation"]["devices"]["results"]
            assert (result["driver"], result["pool"]) == (DEFAULT_DRIVER, node)
            # island 0 is gpu-0..3, and the tainted gpu-0 is avoided
            assert result["device"] in ("gpu-1", "gpu-2", "gpu-3"), result

            # a pod that still asks the device plugin's resource gets a GPU through the mapping
            core.create_namespaced_pod(namespace, pod("asks-aliyun-gpu", node, gpus=2))
            got = await scheduled(cluster, namespace, "asks-aliyun-gpu")
            assert got.spec.node_name == node
            listed: Any = custom.list_namespaced_custom_object(
                GROUP, VERSION, namespace, "resourceclaims"
            )
            (extended,) = [c for c in listed["items"] if c["metadata"]["name"] != "one-gpu"]
            results = extended["status"]["allocation"]["devices"]["results"]
            taken = {r["device"] for r in results}
            assert len(taken) == 2
            assert "gpu-0" not in taken
            assert result["device"] not in taken
    finally:
        with cluster.api_client() as a:
            for s in slices_of(cluster, node):
                sync_client.CustomObjectsApi(a).delete_cluster_custom_object(
                    GROUP, VERSION, PLURAL, s["metadata"]["name"]
                )
            core = sync_client.CoreV1Api(a)
            for name in ("with-claim", "asks-aliyun-gpu"):
                try:
                    core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
                except ApiException as e:
                    if e.status != 404:
                        raise
            core.delete_node(node)


CLAIM = {
    "apiVersion": f"{GROUP}/{VERSION}",
    "kind": "ResourceClaim",
    "metadata": {"name": "one-gpu"},
    "spec": {
        "devices": {
            "requests": [
                {
                    "name": "gpu",
                    "exactly": {
                        "deviceClassName": "gpu.lj-runtimekit.aliyun.com",
                        "count": 1,
                        "selectors": [{"cel": {"expression": ISLAND_0}}],
                    },
                }
            ]
        }
    },
}


GPU_0 = 'device.attributes["lj-runtimekit.aliyun.com"].index == 0'


def claim_for(name: str, device_class: str, **exactly: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {
            "devices": {
                "requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": device_class, **exactly}}
                ]
            }
        },
    }


def share(name: str, cores: str, memory: str) -> dict[str, Any]:
    """A share of GPU 0 (the selector makes the test independent of the allocator's order)."""
    return claim_for(
        name,
        "gpu-share.lj-runtimekit.aliyun.com",
        selectors=[{"cel": {"expression": GPU_0}}],
        capacity={"requests": {"cores": cores, "memory": memory}},
    )


async def unschedulable(cluster: Any, namespace: str, name: str) -> str:
    """The scheduler's message once it found no place for the pod (30 s at most)."""
    deadline = time.monotonic() + 30
    with cluster.api_client() as a:
        core = sync_client.CoreV1Api(a)
        while True:
            got: Any = core.read_namespaced_pod(name, namespace)
            assert not got.spec.node_name, f"pod {name} was scheduled to {got.spec.node_name}"
            for c in got.status.conditions or []:
                if c.type == "PodScheduled" and c.reason == "Unschedulable":
                    return str(c.message)
            assert time.monotonic() < deadline, f"pod {name} neither scheduled nor refused"
            await asyncio.sleep(0.2)


async def test_two_shares_land_on_one_gpu_and_whole_claims_never_join_them(
    cluster: Any, api: client.ApiClient, namespace: str, device_classes: dict[str, Any]
) -> None:
    assert "extendedResourceName" not in device_classes["gpu-share.lj-runtimekit.aliyun.com"]
    (node,) = cluster.create_gpu_nodes(1, prefix="dra-shares", gpus=0)
    pods = ("share-a", "share-b", "whole", "whole-too", "share-too-big")
    try:
        await SlicePublisher(api, node).publish(gpus(2), RUNTIME, facts(2))
        with cluster.api_client() as a:
            custom = sync_client.CustomObjectsApi(a)
            core = sync_client.CoreV1Api(a)

            def create(claim: dict[str, Any], pod_name: str) -> None:
                custom.create_namespaced_custom_object(
                    GROUP, VERSION, namespace, "resourceclaims", claim
                )
                core.create_namespaced_pod(
                    namespace, pod(pod_name, node, claim=claim["metadata"]["name"])
                )

            def results(claim_name: str) -> list[dict[str, Any]]:
                got: Any = custom.get_namespaced_custom_object(
                    GROUP, VERSION, namespace, "resourceclaims", claim_name
                )
                found: list[dict[str, Any]] = got["status"]["allocation"]["devices"]["results"]
                return found

            create(share("a", "30", "10Gi"), "share-a")
            await scheduled(cluster, namespace, "share-a")
            create(share("b", "30.5", "20Gi"), "share-b")
            await scheduled(cluster, namespace, "share-b")
            (ra,) = results("a")
            (rb,) = results("b")
            assert ra["device"] == rb["device"] == "gpu-0"
            assert ra["shareID"] != rb["shareID"]
            assert ra["consumedCapacity"] == {"cores": "30", "memory": "10Gi"}
            # 30.5 % is rounded up to the policy's step of whole percents
            assert rb["consumedCapacity"] == {"cores": "31", "memory": "20Gi"}
            stored: Any = custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, "resourceclaims", "a"
            )
            (parsed,) = claim_allocation(stored).results
            assert parsed.share_id == ra["shareID"]
            assert parsed.consumed == {"cores": 30, "memory": 10 * GIB}

            # A claim for a whole GPU names no capacity: it consumes all of one, so only gpu-1
            create(claim_for("whole", "gpu.lj-runtimekit.aliyun.com", count=1), "whole")
            await scheduled(cluster, namespace, "whole")
            (rw,) = results("whole")
            assert rw["device"] == "gpu-1"
            assert rw["consumedCapacity"] == {"cores": "100", "memory": "80Gi"}
            # ... and a second one finds none: gpu-0 is shared, gpu-1 is taken whole
            create(claim_for("whole-too", "gpu.lj-runtimekit.aliyun.com", count=1), "whole-too")
            assert "cannot allocate all claims" in await unschedulable(
                cluster, namespace, "whole-too"
            )
            # a share over what is left of gpu-0 (39 % free) finds no place either
            create(share("too-big", "40", "1Gi"), "share-too-big")
            await unschedulable(cluster, namespace, "share-too-big")
    finally:
        with cluster.api_client() as a:
            for s in slices_of(cluster, node):
                sync_client.CustomObjectsApi(a).delete_cluster_custom_object(
                    GROUP, VERSION, PLURAL, s["metadata"]["name"]
                )
            core = sync_client.CoreV1Api(a)
            for name in pods:
                try:
                    core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
                except ApiException as e:
                    if e.status != 404:
                        raise
            core.delete_node(node)


MIG_CLASS = "mig.lj-runtimekit.aliyun.com"
GPU_CLASS = "gpu.lj-runtimekit.aliyun.com"
ON_GPU_0 = 'device.attributes["lj-runtimekit.aliyun.com"].runtimeDeviceID == "gpu-0"'


def profile(p: str) -> str:
    return f'device.attributes["lj-runtimekit.aliyun.com"].profile == "{p}"'


def mig_claim(name: str, p: str, *, on_gpu_0: bool = True) -> dict[str, Any]:
    selectors = [{"cel": {"expression": profile(p)}}]
    if on_gpu_0:
        selectors.append({"cel": {"expression": ON_GPU_0}})
    return claim_for(name, MIG_CLASS, selectors=selectors)


class Objects:
    """Claims and pods a test made, deleted afterwards with the node's slices and the node."""

    def __init__(self, cluster: Any, namespace: str, node: str) -> None:
        self.cluster, self.namespace, self.node = cluster, namespace, node
        self.pods: list[str] = []
        self.claims: list[str] = []

    def claim_and_pod(self, body: dict[str, Any]) -> str:
        name = str(body["metadata"]["name"])
        with self.cluster.api_client() as a:
            sync_client.CustomObjectsApi(a).create_namespaced_custom_object(
                GROUP, VERSION, self.namespace, "resourceclaims", body
            )
            self.claims.append(name)
            sync_client.CoreV1Api(a).create_namespaced_pod(
                self.namespace, pod(name, self.node, claim=name)
            )
            self.pods.append(name)
        return name

    def devices_of(self, claim: str) -> list[str]:
        with self.cluster.api_client() as a:
            got: Any = sync_client.CustomObjectsApi(a).get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, "resourceclaims", claim
            )
        return [r["device"] for r in got["status"]["allocation"]["devices"]["results"]]

    def clean(self) -> None:
        with self.cluster.api_client() as a:
            core, custom = sync_client.CoreV1Api(a), sync_client.CustomObjectsApi(a)
            for name in self.pods:
                try:
                    core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)
                except ApiException as e:
                    if e.status != 404:
                        raise
            for name in self.claims:
                try:
                    custom.delete_namespaced_custom_object(
                        GROUP, VERSION, self.namespace, "resourceclaims", name
                    )
                except ApiException as e:
                    if e.status != 404:
                        raise
            for s in slices_of(self.cluster, self.node):
                custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, s["metadata"]["name"])
            core.delete_node(self.node)


def mig_gpus(n: int) -> list[Any]:
    return [replace(d, partition_modes=frozenset({"mig", "tdm"})) for d in gpus(n)]


async def test_kube_scheduler_never_gives_out_more_of_a_gpu_than_it_holds(
    cluster: Any,
    api: client.ApiClient,
    namespace: str,
    device_classes: dict[str, Any],
) -> None:
    assert MIG_CLASS in device_classes
    (node,) = cluster.create_gpu_nodes(1, prefix="dra-mig", gpus=0)
    objs = Objects(cluster, namespace, node)
    try:
        publisher = SlicePublisher(api, node, partitions=DYNAMIC)
        assert await publisher.publish(mig_gpus(2), RUNTIME, facts(2))
        slices = slices_of(cluster, node)
        counters = [s for s in slices if "sharedCounters" in s["spec"]]
        (counter_slice,) = counters
        assert [c["name"] for c in counter_slice["spec"]["sharedCounters"]] == [
            "gpu-0-counters",
            "gpu-1-counters",
        ]
        assert counter_slice["spec"]["sharedCounters"][0]["counters"] == {
            "compute-slices": {"value": "7"},
            "memory": {"value": "80Gi"},
        }
        devices = {d["name"]: d for s in slices for d in s["spec"].get("devices", [])}
        assert len(devices) == 2 * 15
        assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {len(slices)}
        assert devices["gpu-0-mig-3g-40gb-1"]["consumesCounters"] == [
            {
                "counterSet": "gpu-0-counters",
                "counters": {"compute-slices": {"value": "3"}, "memory": {"value": "40Gi"}},
            }
        ]

        a = objs.claim_and_pod(mig_claim("mig-a", "3g.40gb"))
        b = objs.claim_and_pod(mig_claim("mig-b", "3g.40gb"))
        for name in (a, b):
            await scheduled(cluster, namespace, name)
        taken = objs.devices_of(a) + objs.devices_of(b)
        assert sorted(taken) == ["gpu-0-mig-3g-40gb-0", "gpu-0-mig-3g-40gb-1"]
        # gpu-0's memory is all taken: a 1g.10gb has no room there, nor has the whole GPU
        c = objs.claim_and_pod(mig_claim("mig-c", "1g.10gb"))
        assert "cannot allocate" in await unschedulable(cluster, namespace, c)
        whole_0 = claim_for(
            "whole-0",
            GPU_CLASS,
            selectors=[{"cel": {"expression": ON_GPU_0}}],
        )
        w0 = objs.claim_and_pod(whole_0)
        await unschedulable(cluster, namespace, w0)
        # the whole-GPU claim without a selector gets gpu-1; then gpu-1 has no MIG room either
        w = objs.claim_and_pod(claim_for("whole", GPU_CLASS))
        await scheduled(cluster, namespace, w)
        assert objs.devices_of(w) == ["gpu-1"]
        d = objs.claim_and_pod(mig_claim("mig-d", "1g.10gb", on_gpu_0=False))
        await unschedulable(cluster, namespace, d)
        # making a partition changes nothing the scheduler reads: the slices stay as they are
        held = replace(
            mig_gpus(2)[0],
            partition_mode="mig",
            partitions=(Partition("gpu-0-mig-3g.40gb-0", "3g.40gb", 40 * GIB),),
        )
        assert not await publisher.publish([held, mig_gpus(2)[1]], RUNTIME, facts(2))
    finally:
        objs.clean()


async def test_a_layouts_partitions_are_published_as_themselves(
    cluster: Any,
    api: client.ApiClient,
    namespace: str,
    device_classes: dict[str, Any],
) -> None:
    (node,) = cluster.create_gpu_nodes(1, prefix="dra-layout", gpus=0)
    objs = Objects(cluster, namespace, node)
    try:
        parts = tuple(
            Partition(f"gpu-0-mig-3g.40gb-{i}", "3g.40gb", 40 * GIB, 42) for i in range(2)
        )
        layout = [replace(gpus(2)[0], partition_mode="mig", partitions=parts), gpus(2)[1]]
        assert await SlicePublisher(api, node).publish(layout, RUNTIME, facts(2))
        slices = slices_of(cluster, node)
        devices = {d["name"]: d for s in slices for d in s["spec"].get("devices", [])}
        # the partition ids have dots: their device names are DNS labels with a digest
        assert sorted(n for n in devices if n != "gpu-1") == sorted(
            n for n in devices if n.startswith("gpu-0-mig-3g-40gb-")
        )
        assert len(devices) == 3
        assert "gpu-0" not in devices
        m = objs.claim_and_pod(mig_claim("mig", "3g.40gb"))
        await scheduled(cluster, namespace, m)
        (got,) = objs.devices_of(m)
        assert devices[got]["attributes"]["partitionID"]["string"].startswith("gpu-0-mig-3g.40gb-")
    finally:
        objs.clean()


async def test_the_nodes_topology_labels_are_published_as_attributes(
    cluster: Any, api: client.ApiClient, nodes: list[str]
) -> None:
    node = nodes[0]
    with cluster.api_client() as a:
        labels = {"network.topology/block": "block-7", "network.topology/rack": None}
        sync_client.CoreV1Api(a).patch_node(node, {"metadata": {"labels": labels}})
    publisher = SlicePublisher(
        api, node, topology_labels=("network.topology/block", "network.topology/rack")
    )
    try:
        assert await publisher.publish(gpus(2), RUNTIME, facts(2))
        (rs,) = slices_of(cluster, node)
        for d in devices_in([rs]).values():
            assert d["attributes"]["network.topology/block"] == {"string": "block-7"}
            assert "network.topology/rack" not in d["attributes"]  # the node has no such label
    finally:
        await publisher.withdraw()
        with cluster.api_client() as a:
            unlabel = {"metadata": {"labels": {"network.topology/block": None}}}
            sync_client.CoreV1Api(a).patch_node(node, unlabel)


async def test_slices_the_kubelet_wipes_are_noticed_and_written_again(
    cluster: Any, api: client.ApiClient, nodes: list[str]
) -> None:
    """The kubelet deletes every slice of its node when it starts (and a driver's after its
    plugin stayed away): the watch notices, the next publish writes the pool again; the
    publisher's own deletions (a shrinking pool) are not a loss."""
    node = nodes[0]
    publisher = SlicePublisher(api, node)
    watching = asyncio.create_task(publisher.watch())
    try:
        assert await publisher.publish(gpus(130), RUNTIME, facts(130))  # two slices
        assert await publisher.publish(gpus(8), RUNTIME, facts(8))  # shrinks to one
        await asyncio.sleep(1)
        assert not publisher.lost.is_set()
        with cluster.api_client() as a:
            # as the kubelet does it: one DeleteCollection of the node's slices
            sync_client.ResourceV1Api(a).delete_collection_resource_slice(
                field_selector=f"spec.nodeName={node}"
            )
        await asyncio.wait_for(publisher.lost.wait(), 30)
        assert not slices_of(cluster, node)
        assert await publisher.publish(gpus(8), RUNTIME, facts(8))
        (rs,) = slices_of(cluster, node)
        assert len(rs["spec"]["devices"]) == 8
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
        await publisher.withdraw()
