"""Whether a share may still be given on a device: the plugin's own guard against over-commit.

The assignment a shared Allocate follows is an annotation on the pod, which the pod's owner can
write too. So before asking the Runtime, the plugin checks the share against the device itself
(on this node, unpartitioned, healthy) and against what live Runtime allocations already hold,
and never relies on the Runtime alone to refuse. Pure: data in, data out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from ..domains import allocation_error
from ..model import Allocation, Device
from ..resources import CORE_UNITS_PER_GPU
from .assignment import Share


def share_error(
    share: Share,
    devices: Mapping[str, Device],
    live: Iterable[Allocation],
    *,
    also: Sequence[Share] = (),
) -> str | None:
    """Why ``share`` cannot be given now, or None when it fits.

    Guarantees: with None, every live allocation on the device is one that can be true
    (:func:`..domains.allocation_error`), and the cores (<= 100) and the memory (<= the
    device's) that they hold on the device, plus ``also`` (shares of the same request given just
    before), plus this share, stay within the device; the device is on this node, a GPU, not
    partitioned, healthy, and held by no whole-device allocation.
    """
    d = devices.get(share.id)
    if d is None:
        return f"device {share.id!r} is not on this node (known: {sorted(devices)})"
    if d.kind != "gpu" or d.partition_mode in ("mig", "tdm"):
        return f"device {share.id} is a {d.kind} in partition mode {d.partition_mode}: not shared"
    if not d.healthy:
        return f"device {share.id} is unhealthy ({d.reason or 'no reason given'})"
    if share.core <= 0 and share.memory_gib <= 0:
        return f"device {share.id}: a share of nothing"
    core, memory = share.core, share.memory_gib
    for s in also:
        if s.id == share.id:
            core, memory = core + s.core, memory + s.memory_gib
    for a in live:
        if share.id not in a.device_ids:
            continue
        impossible = allocation_error(a, d)
        if impossible:
            # what the Runtime holds on the device cannot be known: no room can be counted
            return (
                f"device {share.id}: the Runtime reports that {impossible}, which cannot be "
                "true: no share is given on it until the Runtime reports its allocations sanely"
            )
        if not a.shared:
            return f"device {share.id} is held whole by allocation {a.id}"
        core += a.core_percent
        memory += -(-a.memory_bytes // (1 << 30))  # whole GiB, rounded up
    if core > CORE_UNITS_PER_GPU:
        return f"device {share.id}: {core} gpu-core units would exceed {CORE_UNITS_PER_GPU}"
    if memory > d.memory_gib:
        return f"device {share.id}: {memory} GiB would exceed its {d.memory_gib} GiB"
    return None
