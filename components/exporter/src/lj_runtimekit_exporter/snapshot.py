"""What one poll saw: plain, frozen data converted once at the edges, read by every scrape."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class PartitionSample:
    """One MIG/TDM partition's usage."""

    partition_id: str
    profile: str
    utilization_ratio: float
    memory_used_bytes: float
    memory_total_bytes: float


@dataclass(frozen=True)
class LinkSample:
    """Cumulative traffic over one interconnect link."""

    peer_id: str
    tx_bytes_total: float
    rx_bytes_total: float


@dataclass(frozen=True)
class Device:
    """One accelerator as the Runtime lists it (inventory and health)."""

    id: str
    uuid: str
    index: int
    kind: str
    model: str
    vendor: str = ""
    memory_bytes: float = 0.0
    healthy: bool = True
    partition_mode: str = "none"
    partition_profiles: dict[str, str] = field(default_factory=dict)
    """partition id → profile name."""


@dataclass(frozen=True)
class DeviceSample:
    """One device's metrics from MonitorService.GetDeviceMetrics."""

    device_id: str
    utilization_ratio: float = 0.0
    memory_utilization_ratio: float = 0.0
    memory_used_bytes: float = 0.0
    memory_total_bytes: float = 0.0
    temperature_celsius: float = 0.0
    memory_temperature_celsius: float = 0.0
    power_watts: float = 0.0
    power_limit_watts: float = 0.0
    energy_joules_total: float = 0.0
    sm_clock_hertz: float = 0.0
    memory_clock_hertz: float = 0.0
    ecc_single_bit_total: float = 0.0
    ecc_double_bit_total: float = 0.0
    retired_pages_total: float = 0.0
    xid_total: float = 0.0
    link_errors_total: float = 0.0
    last_xid: float = 0.0
    pcie_tx_bytes_total: float = 0.0
    pcie_rx_bytes_total: float = 0.0
    links: tuple[LinkSample, ...] = ()
    partitions: tuple[PartitionSample, ...] = ()


@dataclass(frozen=True)
class Allocation:
    """One live allocation from DeviceService.ListAllocations."""

    id: str
    namespace: str
    pod: str
    pod_uid: str
    container: str
    resource_name: str
    device_ids: tuple[str, ...]
    core_percent: int = 0
    """Shared use: percent of one device's compute; 0 means whole devices."""
    memory_bytes: float = 0.0
    """Shared use: memory granted on the device; 0 means whole devices."""


@dataclass(frozen=True)
class Usage:
    """What one allocation uses on one device (MonitorService.GetAllocationUsage)."""

    allocation_id: str
    device_id: str
    utilization_ratio: float
    memory_used_bytes: float


@dataclass(frozen=True)
class Pod:
    """A pod on this node, from the kubelet's /pods or the apiserver."""

    namespace: str
    name: str
    uid: str
    phase: str = "Running"

    @property
    def terminated(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


DRA_RESOURCE_PREFIX = "dra:"
"""How :class:`Held` names a DRA claim's devices: resource ``dra:<driver>`` (pod-resources'
``dynamic_resources``), devices the driver's ResourceSlice device names."""


@dataclass(frozen=True)
class Held:
    """What the kubelet says one container holds of one resource (pod-resources ``List``)."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]
    """The device plugin's unit ids: a device or partition id for whole devices,
    ``<device id>::core-<n>`` / ``<device id>::mem-<n>`` for shares."""


@dataclass(frozen=True)
class RuntimeState:
    """Everything read from the Runtime in one poll."""

    version: str
    api_version: str
    devices: tuple[Device, ...]
    samples: tuple[DeviceSample, ...]
    allocations: tuple[Allocation, ...] | None
    """None when the Runtime lacks ListAllocations (older Runtime)."""
    usage: tuple[Usage, ...] | None
    """None when the Runtime lacks GetAllocationUsage (older Runtime)."""


@dataclass(frozen=True)
class Snapshot:
    """The latest poll's result. ``runtime`` is None while the Runtime is unreachable."""

    node: str
    taken_at: float
    """Wall-clock time (seconds since the epoch) the poll finished."""
    runtime: RuntimeState | None
    pods: tuple[Pod, ...] | None
    """The last pod list read (this poll's, or an earlier one while the source is away); None
    when there is no pod source or it was never read: attribution then trusts the Runtime."""
    pods_up: bool = True
    """Whether this poll read the pod list."""
    degraded: frozenset[str] = frozenset()
    """Runtime methods this Runtime lacks, e.g. "MonitorService.GetAllocationUsage"."""
    held: tuple[Held, ...] | None = None
    """The kubelet's pod-resources answer of this poll; None when it is not read or did not
    answer (attribution then uses ``pods``, the fallback source)."""
