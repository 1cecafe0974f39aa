"""Attribution from the kubelet's pod-resources: every device under the container that holds
it, whatever pod the Runtime recorded; shares matched without guessing."""

from __future__ import annotations

from lj_runtimekit_exporter.attribution import GIB, attribute, join
from lj_runtimekit_exporter.snapshot import Allocation, Held

PLACEHOLDER = "lj-runtimekit-unattributed"


def whole(aid: str, devices: tuple[str, ...], resource: str = "aliyun.com/gpu") -> Allocation:
    """As an older device plugin recorded whole devices: under a placeholder pod."""
    return Allocation(aid, PLACEHOLDER, f"whole-{aid}", "u-x", "", resource, devices)


def share(aid: str, pod: str, device: str, core: int, mem_gib: int = 0) -> Allocation:
    return Allocation(
        aid, "ns", pod, f"uid-{pod}", "main", "aliyun.com/gpu-core", (device,), core, mem_gib * GIB
    )


def units(device: str, core: int, mem_gib: int = 0) -> tuple[str, ...]:
    return tuple(f"{device}::core-{i}" for i in range(core)) + tuple(
        f"{device}::mem-{i}" for i in range(mem_gib)
    )


def owners(allocs: tuple[Allocation, ...]) -> dict[str, tuple[str, str, tuple[str, ...]]]:
    return {a.id: (a.pod, a.container, a.device_ids) for a in allocs}


def test_whole_gpus_ppus_and_partitions_go_to_the_container_the_kubelet_names() -> None:
    allocs = (
        whole("a1", ("gpu-0", "gpu-1")),
        whole("a2", ("ppu-0",), "alibabacloud.com/ppu"),
        whole("a3", ("gpu-2-mig-1",)),
    )
    held = (
        Held("ns", "train", "trainer", "aliyun.com/gpu", ("gpu-1", "gpu-0")),
        Held("ns", "ppu-job", "main", "alibabacloud.com/ppu", ("ppu-0",)),
        Held("ns", "mig-job", "main", "aliyun.com/gpu", ("gpu-2-mig-1",)),
    )
    got = owners(join(allocs, held))
    assert got == {
        "a1": ("train", "trainer", ("gpu-0", "gpu-1")),
        "a2": ("ppu-job", "main", ("ppu-0",)),
        "a3": ("mig-job", "main", ("gpu-2-mig-1",)),
    }
    rows = attribute(join(allocs, held), None, None, {"gpu-0": 0.5}, {})
    assert {(r.pod, r.device_id) for r in rows} == {
        ("train", "gpu-0"),
        ("train", "gpu-1"),
        ("ppu-job", "ppu-0"),
        ("mig-job", "gpu-2-mig-1"),
    }
    assert all(r.allocated_core_ratio == 1.0 for r in rows)


def test_an_allocation_no_live_container_holds_is_not_attributed() -> None:
    allocs = (whole("leak", ("gpu-3",)), share("s", "gone", "gpu-4", 30))
    assert join(allocs, (Held("ns", "other", "main", "aliyun.com/gpu", ("gpu-5",)),)) == (
        Allocation("kubelet:gpu-5", "ns", "other", "", "main", "aliyun.com/gpu", ("gpu-5",)),
    )


def test_a_share_stays_under_its_recorded_container_when_that_one_holds_shares() -> None:
    allocs = (share("a", "p1", "gpu-0", 30, 8), share("b", "p2", "gpu-0", 30, 8))
    # the kubelet's units need not be on the GPU the Runtime gave: the label is what counts
    held = (
        Held("ns", "p1", "main", "aliyun.com/gpu-core", units("gpu-5", 30)),
        Held("ns", "p2", "main", "aliyun.com/gpu-core", units("gpu-6", 30)),
    )
    assert owners(join(allocs, held)) == {
        "a": ("p1", "main", ("gpu-0",)),
        "b": ("p2", "main", ("gpu-0",)),
    }


def test_an_unlabelled_share_goes_to_the_one_container_of_that_size_never_a_guess() -> None:
    lone = Allocation("x", PLACEHOLDER, "shared", "", "", "aliyun.com/gpu-core", ("gpu-0",), 40)
    twin = Allocation("y", PLACEHOLDER, "shared2", "", "", "aliyun.com/gpu-core", ("gpu-1",), 20)
    held = (
        Held("ns", "forty", "c", "aliyun.com/gpu-core", units("gpu-0", 40)),
        Held("ns", "t1", "c", "aliyun.com/gpu-core", units("gpu-2", 20)),
        Held("ns", "t2", "c", "aliyun.com/gpu-core", units("gpu-3", 20)),
    )
    got = owners(join((lone, twin), held))
    assert got == {"x": ("forty", "c", ("gpu-0",))}  # y: two containers could hold it


def test_without_runtime_allocations_the_kubelet_alone_attributes_whole_devices_and_shares() -> (
    None
):
    held = (
        Held("ns", "w", "main", "aliyun.com/gpu", ("gpu-0",)),
        Held("ns", "s", "main", "aliyun.com/gpu-core", units("gpu-1", 25)),
        Held("ns", "s", "main", "aliyun.com/gpu-memory", units("gpu-1", 0, 4)),
    )
    rows = {r.pod: r for r in attribute(join(None, held), None, None, {}, {})}
    assert rows["w"].device_id == "gpu-0"
    assert rows["w"].allocated_core_ratio == 1.0
    assert (rows["s"].device_id, rows["s"].allocated_core_ratio) == ("gpu-1", 0.25)
    assert rows["s"].allocated_memory_bytes == 4 * GIB


def test_dra_allocations_go_to_the_live_container_the_driver_recorded() -> None:
    """DRA (issue 24): the kubelet's pod-resources lists a container's prepared claims under
    ``dynamic_resources``; the driver recorded that container with the Runtime at prepare."""
    allocs = (
        Allocation("d1", "ml", "train", "u1", "main", "aliyun.com/gpu", ("gpu-0", "gpu-1")),
        Allocation("d2", "ml", "infer", "u2", "main", "aliyun.com/gpu-core", ("gpu-2",), 30, GIB),
        Allocation("d3", "ml", "gone", "u3", "main", "aliyun.com/gpu", ("gpu-3",)),
    )
    held = (
        Held("ml", "train", "main", "dra:lj-runtimekit.aliyun.com", ("gpu-0",)),
        Held("ml", "train", "main", "dra:lj-runtimekit.aliyun.com", ("gpu-1",)),
        Held("ml", "infer", "main", "dra:lj-runtimekit.aliyun.com", ("gpu-2",)),
    )
    got = owners(join(allocs, held))
    assert got == {
        "d1": ("train", "main", ("gpu-0", "gpu-1")),
        "d2": ("infer", "main", ("gpu-2",)),
    }, "a pod no longer alive (gone) gets no row"
    # a DRA claim's device names never stand for device-plugin units of the same name
    assert all(not a.id.startswith("kubelet:") for a in join(allocs, held))


def test_pod_resources_dynamic_resources_become_dra_holdings() -> None:
    from lj_runtimekit_exporter.kubelet import held_from_proto
    from lj_runtimekit_interface.podresources.v1 import api_pb2

    resp = api_pb2.ListPodResourcesResponse(
        pod_resources=[
            api_pb2.PodResources(
                name="train",
                namespace="ml",
                containers=[
                    api_pb2.ContainerResources(
                        name="main",
                        dynamic_resources=[
                            api_pb2.DynamicResource(
                                claim_name="c",
                                claim_namespace="ml",
                                claim_resources=[
                                    api_pb2.ClaimResource(
                                        driver_name="lj-runtimekit.aliyun.com",
                                        pool_name="node-a",
                                        device_name="gpu-0",
                                    )
                                ],
                            )
                        ],
                    )
                ],
            )
        ]
    )
    assert held_from_proto(resp) == (
        Held("ml", "train", "main", "dra:lj-runtimekit.aliyun.com", ("gpu-0",)),
    )
