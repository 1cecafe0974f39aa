"""An enum number this build does not know (a newer Runtime) reads as ``unknown``, as in every
component (runtime_channel.enum_name), and never leaks into the NodeDevices schema."""

from __future__ import annotations

from lj_runtimekit_device_plugin.model import RuntimeInfo
from lj_runtimekit_device_plugin.nodedevices import status
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
