"""No impossible number: a reading outside its metric's domain is left out and counted (issue 34).

A ratio within [0, 1], no negative counter or gauge (temperatures excepted), no NaN/Inf, no
memory above the device's total; what is left out is counted in
``lj_runtimekit_exporter_samples_dropped{metric}``.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from lj_runtimekit_exporter import naming, runtime
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
from lj_runtimekit_interface.runtime.v1 import device_pb2, monitor_pb2

NOW = 1_000_000.0
GIB = 2**30
DROPPED = "lj_runtimekit_exporter_samples_dropped"
SPECS = {m.exposed: m for m in naming.ALL}
MEMORY = {
    "lj_runtimekit_device_memory_used_bytes",
    "lj_runtimekit_partition_memory_used_bytes",
    "lj_runtimekit_partition_memory_total_bytes",
    "lj_runtimekit_container_memory_used_bytes",
    "lj_runtimekit_container_allocated_memory_bytes",
}
"""Memory series that can never exceed their device's total."""

Sample = tuple[str, dict[str, str], float]


def scrape(rt: RuntimeState, pods: tuple[Pod, ...] | None = None) -> list[Sample]:
    state = State(node="n", pods_source="kubelet", snapshot=Snapshot("n", NOW, rt, pods))
    text = Exposition(state, clock=lambda: NOW).body(openmetrics=False).decode()
    return [
        (s.name, s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples
    ]


def values(got: list[Sample], name: str, **match: str) -> list[float]:
    return [
        v for n, labels, v in got if n == name and all(labels.get(k) == x for k, x in match.items())
    ]


GPU = Device("gpu-0", "GPU-a", 0, "gpu", "H800", memory_bytes=80 * GIB)
GOOD = DeviceSample(
    "gpu-0",
    utilization_ratio=0.5,
    memory_utilization_ratio=0.25,
    memory_used_bytes=40 * GIB,
    memory_total_bytes=80 * GIB,
    energy_joules_total=10.0,
)


def one_device(sample: DeviceSample) -> RuntimeState:
    return RuntimeState("v1.13.0", "v1", (GPU,), (sample,), (), None)


@pytest.mark.parametrize(
    ("bad", "metric"),
    [
        (replace(GOOD, utilization_ratio=1e308), "lj_runtimekit_device_utilization_ratio"),
        (replace(GOOD, utilization_ratio=1.5), "lj_runtimekit_device_utilization_ratio"),
        (replace(GOOD, utilization_ratio=-0.1), "lj_runtimekit_device_utilization_ratio"),
        (replace(GOOD, utilization_ratio=math.nan), "lj_runtimekit_device_utilization_ratio"),
        (
            replace(GOOD, memory_utilization_ratio=math.inf),
            "lj_runtimekit_device_memory_utilization_ratio",
        ),
        (replace(GOOD, energy_joules_total=-5.0), "lj_runtimekit_device_energy_joules_total"),
        (
            replace(GOOD, memory_used_bytes=81 * GIB),
            "lj_runtimekit_device_memory_used_bytes",
        ),
        (
            replace(GOOD, memory_used_bytes=90 * GIB, memory_total_bytes=0),
            "lj_runtimekit_device_memory_used_bytes",
        ),
    ],
    ids=[
        "ratio-1e308",
        "ratio-1.5",
        "ratio-negative",
        "ratio-nan",
        "ratio-inf",
        "counter-negative",
        "memory-above-sample-total",
        "memory-above-inventory-total",
    ],
)
def test_a_reading_outside_its_domain_is_left_out_and_counted(
    bad: DeviceSample, metric: str
) -> None:
    got = scrape(one_device(bad))
    assert values(got, metric, device="gpu-0") == []
    assert values(got, DROPPED, metric=metric) == [1.0]
    # the device's other readings stay
    assert values(got, "lj_runtimekit_device_healthy", device="gpu-0") == [1.0]
    assert len(values(got, DROPPED)) == 1


def test_readings_within_their_domain_are_served_and_nothing_is_counted() -> None:
    edge = replace(GOOD, utilization_ratio=1.0, memory_used_bytes=80 * GIB)
    got = scrape(one_device(edge))
    assert values(got, "lj_runtimekit_device_utilization_ratio") == [1.0]
    assert values(got, "lj_runtimekit_device_memory_used_bytes") == [80.0 * GIB]
    assert values(got, DROPPED) == []


def test_a_partitions_and_a_containers_impossible_readings_are_left_out() -> None:
    gpu = replace(GPU, partition_profiles={"gpu-0-mig-0": "1g.10gb"})
    sample = replace(
        GOOD, partitions=(PartitionSample("gpu-0-mig-0", "", 2.0, 11 * GIB, 10 * GIB),)
    )
    allocs = (
        Allocation("a1", "t", "p1", "u1", "c", "aliyun.com/gpu-core", ("gpu-0",), 250, 8 * GIB),
        Allocation("a2", "t", "p2", "u2", "c", "aliyun.com/gpu-memory", ("gpu-0",), 10, 99 * GIB),
    )
    usage = (Usage("a1", "gpu-0", 7.0, 200 * GIB), Usage("a2", "gpu-0", 0.1, GIB))
    rt = RuntimeState("v1.13.0", "v1", (gpu,), (sample,), allocs, usage)
    got = scrape(rt, (Pod("t", "p1", "u1"), Pod("t", "p2", "u2")))
    assert values(got, "lj_runtimekit_partition_utilization_ratio") == []
    assert values(got, "lj_runtimekit_partition_memory_used_bytes") == []
    assert values(got, "lj_runtimekit_partition_memory_total_bytes") == [10.0 * GIB]
    assert values(got, "lj_runtimekit_container_allocated_core_ratio", pod="p1") == []
    assert values(got, "lj_runtimekit_container_utilization_ratio", pod="p1") == []
    assert values(got, "lj_runtimekit_container_memory_used_bytes", pod="p1") == []
    assert values(got, "lj_runtimekit_container_allocated_memory_bytes", pod="p2") == []
    assert values(got, "lj_runtimekit_container_allocated_core_ratio", pod="p2") == [0.1]
    assert values(got, "lj_runtimekit_container_memory_used_bytes", pod="p2") == [float(GIB)]
    dropped = {labels["metric"]: v for n, labels, v in got if n == DROPPED}
    assert dropped == {
        "lj_runtimekit_partition_utilization_ratio": 1.0,
        "lj_runtimekit_partition_memory_used_bytes": 1.0,
        "lj_runtimekit_container_allocated_core_ratio": 1.0,
        "lj_runtimekit_container_utilization_ratio": 1.0,
        "lj_runtimekit_container_memory_used_bytes": 1.0,
        "lj_runtimekit_container_allocated_memory_bytes": 1.0,
    }


# --- the property: every exported sample is within its domain, whatever the Runtime says ----

U64 = 2**64 - 1
floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(0.0, 1.0),
    st.sampled_from([0.0, -0.0, 1.0, 1.0000001, -1.0, 1e308, -1e308, 5e-324]),
)
memory = st.one_of(st.integers(0, U64), st.integers(0, 100 * GIB), st.just(80 * GIB))
device_ids = st.sampled_from(["gpu-0", "gpu-1", "gpu-0-mig-0"])


@st.composite
def replies(draw: st.DrawFn) -> RuntimeState:
    devices = [
        device_pb2.Device(
            id=i,
            index=n,
            memory_bytes=draw(memory),
            partitions=[device_pb2.Partition(id=f"{i}-mig-0", profile="1g.10gb")],
        )
        for n, i in enumerate(["gpu-0", "gpu-1"])
    ]
    samples = [
        monitor_pb2.DeviceMetrics(
            device_id=draw(device_ids),
            utilization_ratio=draw(floats),
            memory_utilization_ratio=draw(floats),
            memory_used_bytes=draw(memory),
            memory_total_bytes=draw(memory),
            temperature_celsius=draw(floats),
            power_watts=draw(floats),
            energy_joules_total=draw(floats),
            sm_clock_hertz=draw(floats),
            partitions=[
                monitor_pb2.PartitionMetrics(
                    partition_id=draw(device_ids),
                    utilization_ratio=draw(floats),
                    memory_used_bytes=draw(memory),
                    memory_total_bytes=draw(memory),
                )
            ],
        )
        for _ in range(draw(st.integers(0, 3)))
    ]
    allocations = [
        device_pb2.Allocation(
            id=f"a{n}",
            pod=device_pb2.PodRef(namespace="t", name=f"p{n}", uid=f"u{n}"),
            container="c",
            device_ids=[draw(device_ids)],
            core_percent=draw(st.one_of(st.integers(0, 2**32 - 1), st.integers(0, 150))),
            memory_bytes=draw(memory),
        )
        for n in range(draw(st.integers(0, 3)))
    ]
    usage = [  # as RuntimeClient converts GetAllocationUsage's reply
        Usage(f"a{n}", draw(device_ids), draw(floats), float(draw(memory)))
        for n in range(draw(st.integers(0, 3)))
    ]
    return RuntimeState(
        "v1.13.0",
        "v1",
        tuple(runtime.device_from_proto(d) for d in devices),
        tuple(runtime.sample_from_proto(m) for m in samples),
        tuple(runtime.allocation_from_proto(a) for a in allocations),
        tuple(usage),
    )


def device_total(rt: RuntimeState, device_id: str) -> float | None:
    sample = next((s for s in rt.samples if s.device_id == device_id), None)
    inventory = next(d for d in rt.devices if d.id == device_id)
    for total in (sample.memory_total_bytes if sample else 0.0, inventory.memory_bytes):
        if total > 0:
            return total
    return None


def in_domain(rt: RuntimeState, name: str, labels: dict[str, str], value: float) -> bool:
    spec = SPECS[name]
    if not math.isfinite(value) or (value < 0 and not spec.signed):
        return False
    if spec.unit in ("ratio", "bool") and value > 1.0:
        return False
    total = device_total(rt, labels["device"]) if name in MEMORY else None
    return total is None or value <= total


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rt=replies(), with_pods=st.booleans())
def test_every_exported_sample_is_within_its_metrics_domain(
    rt: RuntimeState, with_pods: bool
) -> None:
    pods = tuple(Pod(a.namespace, a.pod, a.pod_uid) for a in rt.allocations or ()) or None
    got = scrape(rt, pods if with_pods else None)
    for name, labels, value in got:
        assert in_domain(rt, name, labels, value), (name, labels, value)
    # a reading within its domain is served, not dropped with the impossible ones
    first: dict[str, Any] = {}
    for s in rt.samples:
        first.setdefault(s.device_id, s)
    for device_id, s in first.items():
        if device_id in ("gpu-0", "gpu-1") and 0.0 <= s.utilization_ratio <= 1.0:
            assert values(got, "lj_runtimekit_device_utilization_ratio", device=device_id) == [
                s.utilization_ratio
            ]
