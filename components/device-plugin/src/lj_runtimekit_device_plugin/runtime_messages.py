"""The Runtime's DeviceService messages as :mod:`model` data: converted here once, at the edge
(:mod:`runtime` calls these on every reply). Pure: a message in, plain data out; unknown enum
numbers (a newer Runtime's) read as ``unknown``. Which values can be believed is
:mod:`domains`' to say, after this.
"""

from __future__ import annotations

from lj_runtimekit_interface.runtime.v1 import device_pb2

from .model import Allocation, Device, Injection, Link, Partition
from .runtime_channel import UNKNOWN, enum_name

_enum = enum_name


def health_from_proto(h: device_pb2.Health) -> tuple[bool, str]:
    """(healthy, reason): healthy only when the Runtime says so. An unset state or a number
    this build does not know (a newer Runtime's) reads as unknown, and the device is withheld
    (Unhealthy to the kubelet) until its health is known."""
    state = _enum(device_pb2.HealthState, h.state, "HEALTH_STATE_")
    if state == "healthy":
        return True, h.reason
    if state == "unhealthy":
        return False, h.reason
    said = "no health state" if state == "unspecified" else f"health state {h.state}"
    known = f": {h.reason}" if h.reason else ""
    return False, f"health unknown (the Runtime reported {said}{known}); withheld until known"


def device_from_proto(d: device_pb2.Device) -> Device:
    """One Runtime device as domain data; unknown enum numbers read as ``unknown``."""
    mode = _enum(device_pb2.PartitionMode, d.partition_mode, "PARTITION_MODE_")
    binding = _enum(device_pb2.DeviceBinding, d.binding, "DEVICE_BINDING_")
    return Device(
        id=d.id,
        uuid=d.uuid,
        index=d.index,
        kind=_enum(device_pb2.DeviceKind, d.kind, "DEVICE_KIND_"),
        vendor=d.vendor,
        model=d.model,
        memory_bytes=d.memory_bytes,
        compute_units=d.compute_units,
        numa_node=d.numa_node,
        pci_bus_id=d.pci_bus_id,
        links=tuple(
            Link(lk.peer_id, _enum(device_pb2.LinkType, lk.type, "LINK_TYPE_"), lk.bandwidth_gbps)
            for lk in d.links
        ),
        partition_mode="none" if mode in ("unspecified", UNKNOWN) else mode,
        partitions=tuple(
            Partition(
                id=p.id,
                profile=p.profile,
                memory_bytes=p.memory_bytes,
                compute_units=p.compute_units,
                time_percent=p.time_percent,
                healthy=health_from_proto(p.health)[0],
                reason=health_from_proto(p.health)[1],
            )
            for p in d.partitions
        ),
        healthy=health_from_proto(d.health)[0],
        reason=health_from_proto(d.health)[1],
        device_nodes=tuple(d.device_nodes),
        # unset: a Runtime older than the field, whose devices are all on the vendor's driver
        binding="driver" if binding == "unspecified" else binding,
        pcie_root=d.pcie_root,
        partition_modes=frozenset(
            m
            for m in (
                _enum(device_pb2.PartitionMode, n, "PARTITION_MODE_")
                for n in d.supported_partition_modes
            )
            if m in ("mig", "tdm")
        ),
    )


def allocation_from_proto(a: device_pb2.Allocation) -> Allocation:
    inj = a.injection
    return Allocation(
        id=a.id,
        device_ids=tuple(a.device_ids),
        core_percent=a.core_percent,
        memory_bytes=a.memory_bytes,
        pod=(a.pod.namespace, a.pod.name, a.pod.uid),
        container=a.container,
        resource=a.resource_name,
        injection=Injection(
            envs=tuple(sorted(inj.envs.items())),
            annotations=tuple(sorted(inj.annotations.items())),
            device_nodes=tuple(
                (n.container_path, n.host_path, n.permissions) for n in inj.device_nodes
            ),
            mounts=tuple((m.container_path, m.host_path, m.read_only) for m in inj.mounts),
        ),
    )
