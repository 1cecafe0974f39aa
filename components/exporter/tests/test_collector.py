"""The collector: what a scrape shows for a snapshot, parsed back as Prometheus would read it."""

from __future__ import annotations

from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om
from prometheus_client.parser import text_string_to_metric_families

from lj_runtimekit_exporter.collector import Exposition, State
from lj_runtimekit_exporter.snapshot import (
    Allocation,
    Device,
    DeviceSample,
    PartitionSample,
    Pod,
    RuntimeState,
    Snapshot,
    Usage,
)

NOW = 1_000_000.0
Sample = tuple[str, dict[str, str], float]


def devices() -> tuple[Device, ...]:
    return (
        Device("gpu-0", "GPU-aaa", 0, "gpu", "H800"),
        Device("gpu-1", "GPU-bbb", 1, "gpu", "H800", healthy=False),
        Device(
            "gpu-2",
            "GPU-ccc",
            2,
            "gpu",
            "A100",
            partition_mode="mig",
            partition_profiles={"gpu-2-mig-0": "1g.10gb"},
        ),
    )


def samples() -> tuple[DeviceSample, ...]:
    return (
        DeviceSample("gpu-0", utilization_ratio=0.9, memory_used_bytes=60, memory_total_bytes=80),
        DeviceSample("gpu-1", utilization_ratio=0.4, memory_used_bytes=10, memory_total_bytes=80),
        DeviceSample(
            "gpu-2",
            utilization_ratio=0.5,
            partitions=(PartitionSample("gpu-2-mig-0", "", 0.25, 3, 10),),
        ),
    )


def allocations() -> tuple[Allocation, ...]:
    return (
        Allocation("a1", "team", "p1", "u1", "train", "aliyun.com/gpu-core", ("gpu-0",), 30, 8),
        Allocation("a2", "team", "p2", "u2", "train", "aliyun.com/gpu-core", ("gpu-0",), 70, 8),
        Allocation("a3", "team", "p3", "u3", "eval", "aliyun.com/gpu", ("gpu-1",)),
        Allocation("a4", "team", "p4", "u4", "mig", "aliyun.com/gpu", ("gpu-2-mig-0",)),
    )


def pods(*gone: str) -> tuple[Pod, ...]:
    return tuple(
        Pod("team", f"p{i}", f"u{i}", "Succeeded" if f"p{i}" in gone else "Running")
        for i in range(1, 5)
    )


def runtime(usage: tuple[Usage, ...] | None = None) -> RuntimeState:
    return RuntimeState("v1.13.0", "v1", devices(), samples(), allocations(), usage)


def state(snap: Snapshot | None, max_age: float = 60.0) -> State:
    return State(node="node-a", pods_source="kubelet", max_age=max_age, snapshot=snap)


def scrape(st: State, now: float = NOW) -> list[Sample]:
    text = Exposition(st, clock=lambda: now).body(openmetrics=False).decode()
    families = text_string_to_metric_families(text)
    return [(s.name, s.labels, s.value) for f in families for s in f.samples]


def values(got: list[Sample], name: str, **match: str) -> list[float]:
    return [
        v for n, labels, v in got if n == name and all(labels.get(k) == x for k, x in match.items())
    ]


def test_device_series_carry_the_device_labels_and_values() -> None:
    got = scrape(state(Snapshot("node-a", NOW - 1, runtime(), pods())))
    util = [(labels, v) for n, labels, v in got if n == "lj_runtimekit_device_utilization_ratio"]
    assert {"node", "device", "uuid", "index", "kind", "model"} == set(util[0][0])
    assert values(got, "lj_runtimekit_device_utilization_ratio", device="gpu-0") == [0.9]
    assert values(got, "lj_runtimekit_device_memory_free_bytes", uuid="GPU-aaa") == [20.0]
    assert values(got, "lj_runtimekit_device_healthy", device="gpu-1") == [0.0]
    assert values(got, "lj_runtimekit_runtime_up") == [1.0]
    assert values(got, "lj_runtimekit_exporter_snapshot_age_seconds") == [1.0]


def test_shared_device_shows_each_pods_share_never_the_device_value_copied() -> None:
    got = scrape(state(Snapshot("node-a", NOW, runtime(), pods())))
    core = "lj_runtimekit_container_allocated_core_ratio"
    assert values(got, core, pod="p1") == [0.3]
    assert values(got, core, pod="p2") == [0.7]
    # no measured usage for shared holders: no utilization series rather than the device's 0.9
    assert values(got, "lj_runtimekit_container_utilization_ratio", device="gpu-0") == []
    assert values(got, "lj_runtimekit_container_utilization_ratio", pod="p3") == [0.4]


def test_measured_usage_is_reported_per_pod() -> None:
    usage = (Usage("a1", "gpu-0", 0.2, 5), Usage("a2", "gpu-0", 0.6, 50))
    got = scrape(state(Snapshot("node-a", NOW, runtime(usage), pods())))
    util = "lj_runtimekit_container_utilization_ratio"
    assert values(got, util, pod="p1", container="train") == [0.2]
    assert values(got, util, pod="p2") == [0.6]
    assert values(got, "lj_runtimekit_container_memory_used_bytes", pod="p2") == [50.0]


def test_a_mig_partition_holder_is_attributed_to_its_parent_device_and_partition() -> None:
    got = scrape(state(Snapshot("node-a", NOW, runtime(), pods())))
    util = values(
        got, "lj_runtimekit_container_utilization_ratio", pod="p4", partition="gpu-2-mig-0"
    )
    assert util == [0.25]
    assert values(got, "lj_runtimekit_partition_utilization_ratio", profile="1g.10gb") == [0.25]


def test_a_terminated_pods_series_leave_at_the_next_snapshot() -> None:
    st = state(Snapshot("node-a", NOW, runtime(), pods()))
    assert values(scrape(st), "lj_runtimekit_container_allocated_core_ratio", pod="p3") == [1.0]
    st.snapshot = Snapshot("node-a", NOW, runtime(), pods("p3"))
    assert [labels for _, labels, _ in scrape(st) if labels.get("pod") == "p3"] == []


def test_unreachable_runtime_drops_device_series_and_says_so() -> None:
    got = scrape(state(Snapshot("node-a", NOW - 3, None, pods())))
    prefixes = ("lj_runtimekit_device", "lj_runtimekit_container")
    assert [n for n, _, _ in got if n.startswith(prefixes)] == []
    assert values(got, "lj_runtimekit_runtime_up") == [0.0]
    assert values(got, "lj_runtimekit_exporter_snapshot_age_seconds") == [3.0]


def test_a_snapshot_older_than_max_age_serves_no_device_numbers_as_fresh() -> None:
    got = scrape(state(Snapshot("node-a", NOW - 61, runtime(), pods()), max_age=60))
    assert [n for n, _, _ in got if n.startswith("lj_runtimekit_device")] == []
    assert values(got, "lj_runtimekit_exporter_snapshot_age_seconds") == [61.0]


def test_before_the_first_poll_only_self_metrics_are_served() -> None:
    got = scrape(state(None))
    assert values(got, "lj_runtimekit_exporter_collections_total") == [0.0]
    assert values(got, "lj_runtimekit_runtime_up") == []


def test_openmetrics_exposition_parses_and_ends_with_one_eof() -> None:
    st = state(Snapshot("node-a", NOW, runtime(), pods()))
    text = Exposition(st, clock=lambda: NOW).body(openmetrics=True).decode()
    assert text.endswith("# EOF\n")
    assert text.count("# EOF") == 1
    names = {f.name for f in parse_om(text)}  # type: ignore[no-untyped-call]
    assert {"lj_runtimekit_device_energy_joules", "lj_runtimekit_runtime_up"} <= names


def test_the_snapshot_part_is_rendered_once_per_snapshot_and_the_self_part_every_scrape() -> None:
    st = state(Snapshot("node-a", NOW, runtime(), pods()))
    clock = [NOW]
    exposition = Exposition(st, clock=lambda: clock[0])
    first = exposition.body(openmetrics=False)
    clock[0] = NOW + 2
    second = exposition.body(openmetrics=False)
    assert b'snapshot_age_seconds{node="node-a"} 2.0' in second
    assert (
        first.split(b"# HELP lj_runtimekit_runtime_up")[0]
        == second.split(b"# HELP lj_runtimekit_runtime_up")[0]
    )
    st.snapshot = Snapshot("node-a", NOW + 2, runtime(), pods("p1"))
    assert b'pod="p1"' not in exposition.body(openmetrics=False)
