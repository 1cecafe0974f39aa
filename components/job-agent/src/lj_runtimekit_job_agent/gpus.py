"""A node's GPUs and who holds them, as the Runtime and the kubelet report them. Plain data.

:mod:`.runtime` converts the Runtime's ListDevices and ListAllocations replies into these once, at
its edge, and :mod:`.podresources` the kubelet's pod-resources List (the pods given vfio-bound
GPUs, for which the Runtime allocates nothing); :mod:`.partition_plan` decides on them without
knowing protobuf.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

#: The bindings a device reports; a Runtime older than Device.binding leaves it unset, which the
#: interface defines as the vendor's driver.
DRIVER: Final = "driver"
VFIO: Final = "vfio"


@dataclass(frozen=True)
class Gpu:
    """One GPU of the node (ListDevices' device of kind GPU)."""

    id: str
    index: int
    memory_bytes: int
    binding: str = DRIVER
    """``driver`` or ``vfio`` (``unknown``: a binding newer than this agent)."""
    mode: str = "none"
    """``none``, ``mig``, ``tdm`` (``unknown``: a mode newer than this agent)."""
    profiles: tuple[str, ...] = ()
    """MIG: the partitions' profiles, in the Runtime's order."""
    slices: tuple[int, ...] = ()
    """TDM: the partitions' time percents, in the Runtime's order."""
    partition_ids: tuple[str, ...] = ()
    supported_modes: frozenset[str] = frozenset()
    """``mig``/``tdm`` it can be switched to; empty from a Runtime older than the field."""


@dataclass(frozen=True)
class Holding:
    """Who holds which devices or partitions: a live Runtime allocation (ListAllocations), or a
    container the kubelet gave units of ``resource`` without one (pod-resources; a vfio-bound GPU,
    whose unit id is its device id, passed through to a VM)."""

    allocation_id: str
    """Empty for a holding the Runtime does not know (pod-resources)."""
    namespace: str
    pod: str
    container: str
    device_ids: tuple[str, ...]
    resource: str = ""
    """The extended resource of a pod-resources holding; empty for a Runtime allocation."""

    def owner(self) -> str:
        return (
            f"{self.namespace}/{self.pod}/{self.container} ({self.allocation_id or self.resource})"
        )
