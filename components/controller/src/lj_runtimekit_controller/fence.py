"""Fencing the GPUs a waiting partition layout needs (issue 39; docs/partitioning.md). Pure.

A layout change waits until every GPU it changes is free at once. While it waits, new pods must
go elsewhere, or a busy node never drains: so when the agent reports ``waiting`` the controller
records a fence on the node, the annotation ``lj-runtimekit-controller/partition-fence``, naming
those GPUs (and the pods holding them). The device plugin of the node reads it and withholds the
fenced GPUs: Unhealthy to the kubelet (no new container gets them, whatever scheduler placed the
pod) and unhealthy in NodeDevices (the suite's scheduler places nothing on them). Pods already
on them run on. Only those GPUs: the rest of the node keeps serving, unlike a cordon.

The fence is in the cluster, not in memory, so it outlives a restart of the controller or the
device plugin. It goes when the change is done or abandoned (:func:`lift_reason`): the layout
converged, was refused or failed (it no longer waits for pods), or the node's label or the
layout's text changed. A status this controller cannot vouch for (one written before it
started) lifts nothing: the next agent run decides.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from .partitioning import Desired, PartitionStatus, annotation_object

#: At most this many GPUs and pods are recorded (a node has far fewer).
MAX_ITEMS: Final = 64
MAX_ITEM: Final = 253


@dataclass(frozen=True)
class Fence:
    """The GPUs a waiting layout needs free, as recorded on the node."""

    layout: str
    digest: str
    devices: tuple[str, ...]
    """Runtime device ids of the GPUs the change waits for (the device plugin's unit parents)."""
    held_by: tuple[str, ...] = ()
    """``gpu-0 by ns/pod/container (allocation)`` for each pod the change waits for."""
    since: str = ""

    def to_json(self) -> str:
        return json.dumps(
            {
                "layout": self.layout,
                "digest": self.digest,
                "devices": list(self.devices),
                "heldBy": list(self.held_by),
                "since": self.since,
            },
            separators=(",", ":"),
        )

    def same_as(self, other: Fence | None) -> bool:
        """Whether ``other`` fences the same GPUs for the same layout and pods (``since`` aside)."""
        return other is not None and (
            self.layout,
            self.digest,
            self.devices,
            self.held_by,
        ) == (other.layout, other.digest, other.devices, other.held_by)


def _items(value: object) -> tuple[str, ...]:
    if not isinstance(value, list):
        return ()
    return tuple(str(v)[:MAX_ITEM] for v in value[:MAX_ITEMS] if isinstance(v, str) and v)


def parse(text: str | None) -> Fence | None:
    """The node's fence annotation; None when absent or not one the controller writes."""
    data = annotation_object(text)
    if data is None:
        return None
    layout, digest = data.get("layout"), data.get("digest")
    if not isinstance(layout, str) or not isinstance(digest, str):
        return None
    return Fence(
        layout=layout[:MAX_ITEM],
        digest=digest[:MAX_ITEM],
        devices=_items(data.get("devices")),
        held_by=_items(data.get("heldBy")),
        since=str(data.get("since", ""))[:MAX_ITEM],
    )


def gpu_of(block: str) -> str:
    """The GPU of one ``blocked_by`` entry (``gpu-0 by ns/pod/container (id)``)."""
    return block.split(" by ", 1)[0].strip()


def for_waiting(
    status: PartitionStatus, waited: Sequence[str], blocked_by: Sequence[str], now_text: str
) -> Fence:
    """The fence of a layout the agent reported ``waiting``: every GPU it waits for (``waited``;
    from an agent that does not report them, the GPUs of ``blocked_by``), in the agent's order."""
    devices = list(dict.fromkeys(waited))
    for gpu in (gpu_of(b) for b in blocked_by):
        if gpu and gpu not in devices:
            devices.append(gpu)
    return Fence(
        layout=status.layout,
        digest=status.digest,
        devices=tuple(devices[:MAX_ITEMS]),
        held_by=tuple(blocked_by[:MAX_ITEMS]),
        since=now_text,
    )


def lift_reason(
    fence: Fence | None, want: Desired | None, status: PartitionStatus | None
) -> str | None:
    """Why the node's ``fence`` goes now; None while it stays (or there is none).

    ``status`` is the partition status this controller vouches for (None when it cannot).
    Guarantees: a fence stays while its layout is the node's desired one and no vouched status
    says the change ended; it goes once the label is gone, names another layout or the layout's
    text changed, or the change converged, was refused or failed."""
    if fence is None:
        return None
    if want is None:
        return "the node's partition layout label was removed"
    if (want.name, want.digest) != (fence.layout, fence.digest):
        if want.name != fence.layout:
            return f"the node now asks for layout {want.name!r}"
        return f"layout {want.name!r} was edited"
    if status is None or (status.layout, status.digest) != (fence.layout, fence.digest):
        return None
    return {
        "succeeded": f"layout {fence.layout!r} converged",
        "refused": f"layout {fence.layout!r} was refused",
        "failed": f"layout {fence.layout!r} failed (a retry fences again if it waits)",
    }.get(status.result)


def _pods(held_by: Iterable[str]) -> str:
    return "; ".join(held_by) or "no pod any more (the next try changes them)"


def fenced_message(fence: Fence) -> str:
    """The ``PartitionFenced`` Event: which GPUs, for which layout, waiting for which pods."""
    return (
        f"layout {fence.layout} waits for {', '.join(fence.devices)} to be free: fenced from new "
        "pods (the device plugin reports them Unhealthy to the kubelet and in NodeDevices) until "
        f"the change is done or abandoned; the other GPUs keep serving. Waiting for: "
        f"{_pods(fence.held_by)}"
    )


def lifted_message(fence: Fence, why: str) -> str:
    """The ``PartitionUnfenced`` Event."""
    return f"{', '.join(fence.devices)} serve new pods again: {why}"
