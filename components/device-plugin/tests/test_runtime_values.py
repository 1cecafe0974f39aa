"""No impossible number from the Runtime reaches the kubelet, NodeDevices, the ResourceSlices or
a share (issue 34 item 5; the rules are domains.py's table).

Property tests over generated Runtime replies (every numeric field at and past its extremes,
NaN and infinite bandwidths, repeated ids), each value left out counted in its field and never
clamped; the log of one left-out value once per change. The whole plugin against a Runtime that
reports such values on its real socket is test_hostile_runtime's.
"""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from lj_runtimekit_device_plugin import nodedevices
from lj_runtimekit_device_plugin.deviceplugin.assignment import Share
from lj_runtimekit_device_plugin.deviceplugin.headroom import share_error
from lj_runtimekit_device_plugin.deviceplugin.server import list_response
from lj_runtimekit_device_plugin.domains import (
    MAX_COMPUTE_UNITS,
    MAX_DEVICE_MEMORY_BYTES,
    MAX_LINK_GBPS,
    MAX_NUMA_NODE,
    Screening,
)
from lj_runtimekit_device_plugin.dra.slices import NodeFacts, resource_slices
from lj_runtimekit_device_plugin.model import (
    GIB,
    Allocation,
    Device,
    Injection,
    Partition,
    RuntimeInfo,
)
from lj_runtimekit_device_plugin.resources import ResourceNames, advertise
from lj_runtimekit_device_plugin.runtime import allocation_from_proto, device_from_proto
from lj_runtimekit_interface.runtime.v1 import device_pb2

FUZZ = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
U64 = (1 << 64) - 1
U32 = (1 << 32) - 1
TIB16 = MAX_DEVICE_MEMORY_BYTES

# ---------------------------------------------------------------- generated Runtime replies

ids = st.sampled_from(["gpu-0", "gpu-1", "gpu-2", "gpu-0", "gpu-0-p0", "gpu-1-p0", "gpu-1-p1"])
u64 = st.one_of(
    st.sampled_from([0, 1, GIB, 40 * GIB, 80 * GIB, TIB16, TIB16 + 1, U64]), st.integers(0, U64)
)
u32 = st.one_of(
    st.sampled_from([0, 1, 50, 100, 101, 108, MAX_COMPUTE_UNITS + 1, U32]), st.integers(0, U32)
)
gbps = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, 300.0, -1.0, MAX_LINK_GBPS, MAX_LINK_GBPS * 2, math.nan, math.inf]),
)
links = st.builds(
    device_pb2.Link,
    peer_id=ids,
    type=st.sampled_from([device_pb2.LINK_TYPE_NVLINK, device_pb2.LINK_TYPE_PCIE_SWITCH]),
    bandwidth_gbps=gbps,
)
partitions = st.builds(
    device_pb2.Partition,
    id=ids,
    profile=st.sampled_from(["1g.10gb", "tdm-50"]),
    memory_bytes=u64,
    compute_units=u32,
    time_percent=st.one_of(st.sampled_from([0, 25, 50, 100, 101]), u32),
    health=st.just(device_pb2.Health(state=device_pb2.HEALTH_STATE_HEALTHY)),
)
healthy = device_pb2.Health(state=device_pb2.HEALTH_STATE_HEALTHY)
devices = st.builds(
    device_pb2.Device,
    id=ids,
    index=st.integers(0, 8),
    kind=st.just(device_pb2.DEVICE_KIND_GPU),
    memory_bytes=u64,
    compute_units=u32,
    numa_node=st.one_of(
        st.sampled_from([-1, 0, 1, MAX_NUMA_NODE, MAX_NUMA_NODE + 1, -2]),
        st.integers(-(1 << 31), (1 << 31) - 1),
    ),
    links=st.lists(links, max_size=3),
    partition_mode=st.sampled_from(
        [
            device_pb2.PARTITION_MODE_NONE,
            device_pb2.PARTITION_MODE_MIG,
            device_pb2.PARTITION_MODE_TDM,
        ]
    ),
    partitions=st.lists(partitions, max_size=3),
    health=st.just(healthy),
)


def _assert_in_domain(dev: dict[str, Any]) -> None:
    """One NodeDevices device entry holds only numbers that can be true."""
    memory = dev["memoryBytes"]
    assert type(memory) is int, dev
    assert 0 <= memory <= TIB16, dev
    assert dev["numaNode"] == -1 or 0 <= dev["numaNode"] <= MAX_NUMA_NODE, dev
    assert 0 <= dev["computeUnits"] <= MAX_COMPUTE_UNITS, dev
    for lk in dev["links"]:
        assert math.isfinite(lk["bandwidthGBps"])
        assert 0 <= lk["bandwidthGBps"] <= MAX_LINK_GBPS
    parts = dev["partitions"]
    for p in parts:
        assert 0 <= p["memoryBytes"] <= TIB16, p
        assert not memory or p["memoryBytes"] <= memory, (dev, p)
        assert 0 <= p["timePercent"] <= 100, p
        assert not dev["computeUnits"] or p["computeUnits"] <= dev["computeUnits"], (dev, p)
    assert not memory or sum(p["memoryBytes"] for p in parts) <= memory, dev
    assert sum(p["timePercent"] for p in parts) <= 100, dev


@FUZZ
@given(reply=st.lists(devices, max_size=5), strategy=st.sampled_from(["single", "mixed", "none"]))
def test_nothing_out_of_domain_reaches_node_devices_the_kubelet_or_the_slices(
    reply: list[device_pb2.Device], strategy: str
) -> None:
    counted: list[str] = []
    kept = Screening(counted.append).devices([device_from_proto(d) for d in reply])
    names = ResourceNames(mig_strategy=strategy)

    body = nodedevices.status(kept, RuntimeInfo(), names)
    json.dumps(body, allow_nan=False)  # what the apiserver takes: no NaN, no Infinity
    for dev in body["devices"]:
        _assert_in_domain(dev)

    units = [u for us in advertise(kept, names).values() for u in us]
    assert len({u.id for u in units}) == len(units), "a unit id twice: the kubelet counts it twice"
    for u in units:
        assert u.numa_node == -1 or 0 <= u.numa_node <= MAX_NUMA_NODE
    for node in (n for d in list_response(units).devices for n in d.topology.nodes):
        assert 0 <= node.ID <= MAX_NUMA_NODE, "a NUMA node the kubelet's topology manager lacks"

    json.dumps(resource_slices(kept, NodeFacts(node="n1")), allow_nan=False)

    # never clamped: a kept value is the Runtime's own, or withheld (unknown) and counted
    reported = {d.id: d for d in reply}
    for d in kept:
        r = reported[d.id]
        assert d.memory_bytes == r.memory_bytes
        assert [(p.id, p.memory_bytes, p.time_percent) for p in d.partitions] == [
            (p.id, p.memory_bytes, p.time_percent) for p in r.partitions
        ]
        assert d.numa_node == r.numa_node or (d.numa_node == -1 and "numa_node" in counted)
        assert d.compute_units == r.compute_units or (
            d.compute_units == 0 and "compute_units" in counted
        )
        for got, sent in zip(d.links, r.links, strict=True):
            assert got.bandwidth_gbps == sent.bandwidth_gbps or (
                got.bandwidth_gbps == 0.0 and "link.bandwidth_gbps" in counted
            )
    if len(kept) < len(reply):
        assert counted, "a device left out is counted"


allocations = st.builds(
    device_pb2.Allocation,
    id=st.sampled_from(["a-1", "a-2", "a-3"]),
    device_ids=st.lists(st.sampled_from(["gpu-0", "gpu-1"]), max_size=2),
    core_percent=st.one_of(st.sampled_from([0, 30, 70, 100, 101]), u32),
    memory_bytes=st.one_of(st.sampled_from([0, GIB, 16 * GIB, 17 * GIB]), u64),
    resource_name=st.just("aliyun.com/gpu-core"),
)


@FUZZ
@given(live=st.lists(allocations, max_size=4), core=st.integers(1, 100))
def test_a_share_is_never_given_beside_an_allocation_that_cannot_be_true(
    live: list[device_pb2.Allocation], core: int
) -> None:
    device = Device(id="gpu-0", memory_bytes=16 * GIB)
    counted: list[str] = []
    held = [allocation_from_proto(a) for a in live]
    Screening(counted.append).allocations(held, complete=True)
    error = share_error(Share("gpu-0", core, 0), {"gpu-0": device}, held)
    on_it = [a for a in held if "gpu-0" in a.device_ids]
    if error is None:
        assert all(0 <= a.core_percent <= 100 for a in on_it)
        assert all(a.memory_bytes <= device.memory_bytes for a in on_it)
        assert sum(a.core_percent for a in on_it) + core <= 100
    if any(a.core_percent > 100 for a in held):
        assert "allocation.core_percent" in counted


def test_a_share_beside_an_impossible_allocation_is_refused_naming_it() -> None:
    device = Device(id="gpu-0", memory_bytes=16 * GIB)
    liar = Allocation("a-9", ("gpu-0",), Injection(), core_percent=250)
    error = share_error(Share("gpu-0", 10, 0), {"gpu-0": device}, [liar])
    assert error is not None
    assert "allocation a-9 holds 250 %" in error
    assert "cannot be true" in error


def _bad(value: int = 250) -> Device:
    return Device(
        id="gpu-1",
        memory_bytes=80 * GIB,
        partition_mode="tdm",
        partitions=(Partition("gpu-1-tdm-0", "tdm-50", time_percent=value),),
    )


def test_a_value_left_out_is_logged_once_per_change_and_counted_every_time() -> None:
    counted: list[str] = []
    screening = Screening(counted.append)
    good = Device(id="gpu-0", memory_bytes=80 * GIB)
    with capture_logs() as logs:
        for _ in range(5):  # a Runtime polled every health_interval, misreporting each time
            assert screening.devices([good, _bad()]) == [good]
        assert screening.devices([good, _bad(300)]) == [good]  # another value: a change
        assert len(screening.devices([good, _bad(50)])) == 2  # sane again
        assert screening.devices([good, _bad()]) == [good]
    dropped = [e for e in logs if e["event"] == "runtime_values_dropped"]
    assert [e["dropped"][0]["value"] for e in dropped] == ["250", "300", "250"]
    assert dropped[0]["subject"] == "gpu-1"
    assert dropped[0]["dropped"][0]["withheld"] == "device"
    assert [e["subject"] for e in logs if e["event"] == "runtime_values_sane"] == ["gpu-1"]
    assert counted == ["partition.time_percent"] * 7
