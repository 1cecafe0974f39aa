"""Domain data of the simulator to and from the Runtime interface's protobuf messages."""

from __future__ import annotations

from lj_runtimekit_interface.runtime.v1 import device_pb2 as pb
from lj_runtimekit_testkit.simulator.inventory import (
    Binding,
    Device,
    Health,
    Kind,
    LinkKind,
    Mode,
    Partition,
)
from lj_runtimekit_testkit.simulator.ledger import Allocation, PodRef, Request

_KINDS = {
    Kind.GPU: pb.DEVICE_KIND_GPU,
    Kind.PPU: pb.DEVICE_KIND_PPU,
    Kind.AMD: pb.DEVICE_KIND_AMD,
    Kind.OTHER: pb.DEVICE_KIND_OTHER,
}
_LINKS = {
    LinkKind.NVLINK: pb.LINK_TYPE_NVLINK,
    LinkKind.PCIE_SWITCH: pb.LINK_TYPE_PCIE_SWITCH,
    LinkKind.PCIE_HOST_BRIDGE: pb.LINK_TYPE_PCIE_HOST_BRIDGE,
    LinkKind.SYSTEM: pb.LINK_TYPE_SYSTEM,
}
_MODES = {
    Mode.NONE: pb.PARTITION_MODE_NONE,
    Mode.MIG: pb.PARTITION_MODE_MIG,
    Mode.TDM: pb.PARTITION_MODE_TDM,
}

BINDINGS = {
    Binding.DRIVER: pb.DEVICE_BINDING_DRIVER,
    Binding.VFIO: pb.DEVICE_BINDING_VFIO,
}


def health_pb(health: Health) -> pb.Health:
    state = pb.HEALTH_STATE_HEALTHY if health.healthy else pb.HEALTH_STATE_UNHEALTHY
    return pb.Health(state=state, reason=health.reason)


def partition_pb(part: Partition) -> pb.Partition:
    return pb.Partition(
        id=part.id,
        profile=part.profile,
        memory_bytes=part.memory_bytes,
        compute_units=part.compute_units,
        time_percent=part.time_percent,
        health=health_pb(part.health),
    )


def device_pb(device: Device, *, binding: bool = True) -> pb.Device:
    """The device as ListDevices shows it; ``binding=False``: as a Runtime older than
    Device.binding does (the field left unset)."""
    return pb.Device(
        id=device.id,
        uuid=device.uuid,
        index=device.index,
        kind=_KINDS[device.kind],
        vendor=device.vendor,
        model=device.model,
        memory_bytes=device.memory_bytes,
        compute_units=device.compute_units,
        numa_node=device.numa_node,
        pci_bus_id=device.pci_bus_id,
        links=[
            pb.Link(
                peer_id=link.peer_id,
                type=_LINKS[link.kind],
                bandwidth_gbps=link.bandwidth_gbps,
                lanes=link.lanes,
            )
            for link in device.links
        ],
        partition_mode=_MODES[device.mode],
        partitions=[partition_pb(p) for p in device.partitions],
        health=health_pb(device.health),
        device_nodes=list(device.nodes),
        compute_capability=device.compute_capability,
        supported_partition_modes=[_MODES[m] for m in (Mode.MIG, Mode.TDM) if m in device.supports],
        binding=BINDINGS[device.binding] if binding else pb.DEVICE_BINDING_UNSPECIFIED,
        pcie_root=device.pcie_root,
    )


def pod_pb(pod: PodRef) -> pb.PodRef:
    return pb.PodRef(namespace=pod.namespace, name=pod.name, uid=pod.uid)


def allocation_pb(alloc: Allocation) -> pb.Allocation:
    inj = alloc.injection
    return pb.Allocation(
        id=alloc.id,
        pod=pod_pb(alloc.pod),
        container=alloc.container,
        resource_name=alloc.resource_name,
        device_ids=list(alloc.device_ids),
        core_percent=alloc.core_percent,
        memory_bytes=alloc.memory_bytes,
        injection=pb.Injection(
            envs=inj.envs,
            annotations=inj.annotations,
            device_nodes=[
                pb.DeviceNode(container_path=c, host_path=h, permissions=p)
                for c, h, p in inj.device_nodes
            ],
            mounts=[
                pb.Mount(container_path=c, host_path=h, read_only=ro) for c, h, ro in inj.mounts
            ],
        ),
    )


def request_from_pb(req: pb.AllocateRequest) -> Request:
    return Request(
        pod=PodRef(req.pod.namespace, req.pod.name, req.pod.uid),
        container=req.container,
        resource_name=req.resource_name,
        device_ids=tuple(req.device_ids),
        core_percent=req.core_percent,
        memory_bytes=req.memory_bytes,
    )
