"""Attribution: each container its own usage or share, never the whole device copied."""

from __future__ import annotations

import pytest

from lj_runtimekit_exporter.attribution import attribute
from lj_runtimekit_exporter.snapshot import Allocation, Pod, Usage


def alloc(
    aid: str, pod: str, devices: tuple[str, ...], core: int = 0, mem: float = 0
) -> Allocation:
    return Allocation(aid, "ns", pod, f"uid-{pod}", "main", "aliyun.com/gpu", devices, core, mem)


def pod(name: str, phase: str = "Running") -> Pod:
    return Pod("ns", name, f"uid-{name}", phase)


DEV_UTIL = {"gpu-0": 0.9, "gpu-1": 0.4}
DEV_MEM = {"gpu-0": 50.0, "gpu-1": 20.0}


def test_shared_device_without_measured_usage_gives_each_pod_its_share_not_device_value() -> None:
    allocs = (alloc("a", "p1", ("gpu-0",), core=30, mem=10), alloc("b", "p2", ("gpu-0",), core=70))
    rows = attribute(allocs, None, (pod("p1"), pod("p2")), DEV_UTIL, DEV_MEM)
    by_pod = {r.pod: r for r in rows}
    assert by_pod["p1"].allocated_core_ratio == pytest.approx(0.3)
    assert by_pod["p2"].allocated_core_ratio == pytest.approx(0.7)
    assert by_pod["p1"].allocated_memory_bytes == 10
    assert all(r.utilization_ratio is None and r.memory_used_bytes is None for r in rows)


def test_shared_device_with_measured_usage_reports_each_pods_own_usage() -> None:
    allocs = (alloc("a", "p1", ("gpu-0",), core=30), alloc("b", "p2", ("gpu-0",), core=70))
    usage = (Usage("a", "gpu-0", 0.2, 5.0), Usage("b", "gpu-0", 0.65, 30.0))
    rows = {r.pod: r for r in attribute(allocs, usage, (pod("p1"), pod("p2")), DEV_UTIL, DEV_MEM)}
    assert (rows["p1"].utilization_ratio, rows["p1"].memory_used_bytes) == (0.2, 5.0)
    assert (rows["p2"].utilization_ratio, rows["p2"].memory_used_bytes) == (0.65, 30.0)


def test_whole_device_held_alone_reports_the_device_values() -> None:
    rows = attribute((alloc("a", "p1", ("gpu-1",)),), (), (pod("p1"),), DEV_UTIL, DEV_MEM)
    assert len(rows) == 1
    assert (rows[0].utilization_ratio, rows[0].memory_used_bytes) == (0.4, 20.0)
    assert rows[0].allocated_core_ratio == 1.0
    assert rows[0].allocated_memory_bytes is None


@pytest.mark.parametrize(
    ("pods", "expected"),
    [
        ((pod("p1"),), {"p1"}),
        ((pod("p1"), pod("p2", "Succeeded")), {"p1"}),
        ((pod("p1", "Failed"),), set()),
        ((), set()),
        (None, {"p1", "p2"}),
    ],
    ids=["gone-pod-dropped", "succeeded-dropped", "failed-dropped", "no-pods", "no-pod-source"],
)
def test_only_live_pods_get_rows(pods: tuple[Pod, ...] | None, expected: set[str]) -> None:
    allocs = (alloc("a", "p1", ("gpu-0",)), alloc("b", "p2", ("gpu-1",)))
    assert {r.pod for r in attribute(allocs, None, pods, DEV_UTIL, DEV_MEM)} == expected


def test_duplicate_allocations_and_device_ids_give_one_row_per_container_and_device() -> None:
    allocs = (alloc("a", "p1", ("gpu-0", "gpu-0")), alloc("a", "p1", ("gpu-0",)))
    rows = attribute(allocs, None, (pod("p1"),), DEV_UTIL, DEV_MEM)
    assert len(rows) == 1


def test_pod_matched_by_name_when_the_runtime_has_no_uid() -> None:
    a = Allocation("a", "ns", "p1", "", "main", "aliyun.com/gpu", ("gpu-0",))
    assert len(attribute((a,), None, (pod("p1"),), DEV_UTIL, DEV_MEM)) == 1
    assert attribute((a,), None, (pod("p2"),), DEV_UTIL, DEV_MEM) == []
