"""An enum number this build does not know (a newer Runtime) reads as ``unknown``, as in every
component (runtime_channel.enum_name), and never leaks into the NodeDevices schema."""

from __future__ import annotations

import pytest

from lj_runtimekit_device_plugin.model import RuntimeInfo
from lj_runtimekit_device_plugin.nodedevices import status
from lj_runtimekit_device_plugin.resources import ResourceNames, advertise
from lj_runtimekit_device_plugin.runtime import device_from_proto
from lj_runtimekit_interface.runtime.v1 import device_pb2


def test_a_newer_runtimes_enum_values_read_unknown_and_publish_as_the_schemas_fallbacks() -> None:
    raw = device_pb2.Device(
        id="gpu-0",
        kind=99,  # type: ignore[arg-type]
        partition_mode=99,  # type: ignore[arg-type]
        memory_bytes=1 << 33,
        links=[device_pb2.Link(peer_id="gpu-1", type=99)],  # type: ignore[arg-type]
    )
    d = device_from_proto(raw)
    # v1.13 read these as "unspecified" here while the exporter read "unknown"
    assert (d.kind, d.partition_mode, d.links[0].type) == ("unknown", "none", "unknown")
    published = status([d], RuntimeInfo())["devices"][0]
    assert (published["kind"], published["partitionMode"], published["links"]) == (
        "OTHER",
        "NONE",
        [],
    )


@pytest.mark.parametrize(
    "state",
    [99, device_pb2.HEALTH_STATE_UNSPECIFIED],
    ids=["a-newer-runtimes-value", "unset"],
)
def test_a_health_state_not_known_healthy_reads_unknown_and_the_device_is_withheld(
    state: int,
) -> None:
    raw = device_pb2.Device(
        id="gpu-0",
        memory_bytes=1 << 33,
        health=device_pb2.Health(state=state),  # type: ignore[arg-type]
        partition_mode=device_pb2.PARTITION_MODE_MIG,
        partitions=[
            device_pb2.Partition(
                id="gpu-0-mig-0",
                profile="1g.10gb",
                health=device_pb2.Health(state=state),  # type: ignore[arg-type]
            )
        ],
    )
    d = device_from_proto(raw)
    assert not d.healthy
    assert d.reason.startswith("health unknown")
    assert not d.partitions[0].healthy
    assert d.partitions[0].reason.startswith("health unknown")
    units = advertise([d], ResourceNames())
    assert units, "withheld, not hidden: the kubelet sees the device go Unhealthy"
    assert all(not u.healthy for us in units.values() for u in us)


def test_known_health_states_read_as_the_runtime_says() -> None:
    ok = device_from_proto(
        device_pb2.Device(id="a", health=device_pb2.Health(state=device_pb2.HEALTH_STATE_HEALTHY))
    )
    bad = device_from_proto(
        device_pb2.Device(
            id="b",
            health=device_pb2.Health(state=device_pb2.HEALTH_STATE_UNHEALTHY, reason="XID 79"),
        )
    )
    assert (ok.healthy, bad.healthy, bad.reason) == (True, False, "XID 79")
