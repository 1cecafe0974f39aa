"""Odd Runtime data never breaks the exposition: it always parses back, and nothing crashes."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.openmetrics import exposition as om_exposition
from prometheus_client.openmetrics import parser as om_parser
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from lj_runtimekit_exporter import runtime
from lj_runtimekit_exporter.collector import Exposition, State, all_families
from lj_runtimekit_exporter.snapshot import Pod, RuntimeState, Snapshot
from lj_runtimekit_interface.runtime.v1 import device_pb2, monitor_pb2

U64 = 2**64 - 1
odd_floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, -1.0, 1e308, -1e308, 5e-324]),
)
odd_text = st.one_of(
    st.text(max_size=300),
    st.sampled_from(["", "gpu-0", 'quote"back\\slash', "new\nline", "模型 H800 ✓", "\x00\x7f"]),
)
ids = st.one_of(st.sampled_from(["gpu-0", "gpu-1", "gpu-0-mig-0", ""]), odd_text)


@st.composite
def device(draw: st.DrawFn) -> device_pb2.Device:
    return device_pb2.Device(
        id=draw(ids),
        uuid=draw(odd_text),
        index=draw(st.integers(0, 2**32 - 1)),
        kind=draw(st.sampled_from(device_pb2.DeviceKind.values())),
        model=draw(odd_text),
        vendor=draw(odd_text),
        memory_bytes=draw(st.integers(0, U64)),
        partition_mode=draw(st.sampled_from(device_pb2.PartitionMode.values())),
        partitions=[
            device_pb2.Partition(id=draw(ids), profile=draw(odd_text))
            for _ in range(draw(st.integers(0, 2)))
        ],
        health=device_pb2.Health(
            state=draw(st.sampled_from(device_pb2.HealthState.values())), reason=draw(odd_text)
        ),
    )


@st.composite
def metrics(draw: st.DrawFn) -> monitor_pb2.DeviceMetrics:
    def f() -> float:
        return draw(odd_floats)

    def n() -> int:
        return draw(st.integers(0, U64))

    return monitor_pb2.DeviceMetrics(
        device_id=draw(ids),
        utilization_ratio=f(),
        memory_utilization_ratio=f(),
        memory_used_bytes=n(),
        memory_total_bytes=n(),
        temperature_celsius=f(),
        power_watts=f(),
        energy_joules_total=f(),
        sm_clock_hertz=f(),
        errors=monitor_pb2.ErrorCounters(xid_total=n(), last_xid=draw(st.integers(0, 2**32 - 1))),
        links=[monitor_pb2.LinkThroughput(peer_id=draw(ids), tx_bytes_total=n())],
        partitions=[monitor_pb2.PartitionMetrics(partition_id=draw(ids), utilization_ratio=f())],
    )


@st.composite
def allocation(draw: st.DrawFn) -> device_pb2.Allocation:
    return device_pb2.Allocation(
        id=draw(ids),
        pod=device_pb2.PodRef(namespace=draw(odd_text), name=draw(odd_text), uid=draw(ids)),
        container=draw(odd_text),
        device_ids=draw(st.lists(ids, max_size=3)),
        core_percent=draw(st.integers(0, 2**32 - 1)),
        memory_bytes=draw(st.integers(0, U64)),
    )


def parse_text(text: str) -> list[Any]:
    return list(text_string_to_metric_families(text))


def parse_om(text: str) -> list[Any]:
    return list(om_parser.text_string_to_metric_families(text))  # type: ignore[no-untyped-call]


def series(families: Iterable[Any]) -> set[tuple[str, tuple[tuple[str, str], ...], float]]:
    return {(s.name, tuple(sorted(s.labels.items())), s.value) for f in families for s in f.samples}


class ClientPython(Collector):
    """The same families through client_python's own exposition: the reference renderer."""

    def __init__(self, state: State, now: float) -> None:
        self.state, self.now = state, now

    def collect(self) -> Iterator[Metric]:
        return (f.build() for f in all_families(self.state, self.now))

    def describe(self) -> Iterator[Metric]:
        return iter(())


def render(rt: RuntimeState, pods: tuple[Pod, ...] | None) -> None:
    """Our exposition parses, in both formats, to exactly client_python's series."""
    state = State(node="node-ü", pods_source="kubelet", snapshot=Snapshot("node-ü", 10.0, rt, pods))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ClientPython(state, 11.0))
    exposition = Exposition(state, clock=lambda: 11.0)
    ours = series(parse_text(exposition.body(False).decode()))
    theirs = generate_latest(registry).decode()
    assert ours == series(parse_text(theirs))
    assert all(math.isfinite(value) for _, _, value in ours)
    ours_om = series(parse_om(exposition.body(True).decode()))
    om = om_exposition.generate_latest(registry)  # type: ignore[no-untyped-call]
    assert ours_om == series(parse_om(om.decode()))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    devices=st.lists(device(), max_size=6),
    samples=st.lists(metrics(), max_size=6),
    allocations=st.lists(allocation(), max_size=6),
    with_pods=st.booleans(),
)
def test_odd_runtime_data_always_renders_a_parseable_exposition(
    devices: list[device_pb2.Device],
    samples: list[monitor_pb2.DeviceMetrics],
    allocations: list[device_pb2.Allocation],
    with_pods: bool,
) -> None:
    allocs = tuple(runtime.allocation_from_proto(a) for a in allocations)
    rt = RuntimeState(
        "v1.13.0",
        "v1",
        tuple(runtime.device_from_proto(d) for d in devices),
        tuple(runtime.sample_from_proto(m) for m in samples),
        allocs,
        None,
    )
    pods = tuple(Pod(a.namespace, a.pod, a.pod_uid) for a in allocs) if with_pods else None
    render(rt, pods)


def test_thousands_of_devices_with_duplicate_ids_render_one_series_each() -> None:
    devices = [
        device_pb2.Device(id=f"gpu-{i % 2500}", uuid=f"GPU-{i % 2500}", index=i % 2500)
        for i in range(3000)
    ]
    samples = [monitor_pb2.DeviceMetrics(device_id=d.id, utilization_ratio=0.5) for d in devices]
    rt = RuntimeState(
        "v",
        "v1",
        tuple(runtime.device_from_proto(d) for d in devices),
        tuple(runtime.sample_from_proto(m) for m in samples),
        (),
        (),
    )
    state = State(node="n", pods_source="none", snapshot=Snapshot("n", 10.0, rt, None))
    text = Exposition(state, clock=lambda: 11.0).body(False).decode()
    assert text.count("lj_runtimekit_device_utilization_ratio{") == 2500
    families = {f.name: f for f in parse_text(text)}
    assert len(families["lj_runtimekit_device_healthy"].samples) == 2500
