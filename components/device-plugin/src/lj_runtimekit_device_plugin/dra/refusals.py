"""A refused or failed ``NodePrepareResources`` shows where the user looks: a Warning Event on
each pod the claim is reserved for, with the reason.

``GpuClaimPrepareRefused``: the claim cannot be prepared as it stands (no allocation, no pod,
devices not on this node, the node in device-plugin mode) or the Runtime refused it; retrying the
same claim fails the same way. ``GpuClaimPrepareFailed``: a failure the kubelet's retry may get
past (the Runtime away or slow, a file not written). The Events go through
:class:`..pod_events.PodEvents`, as the refusals at Allocate do: one per pod and reason per 60 s,
a token bucket overall, the rest logged and counted. A claim that cannot be read, or whose uid is
not the one the kubelet asked for, names no pod that is surely this one: only the log says it.
"""

from __future__ import annotations

import structlog

from ..errors import DevicePluginError, PermanentError
from ..pod_events import PodEvents
from ..podview import PodView
from .claims import ClaimAllocation
from .plan import ClaimRef

log = structlog.get_logger(__name__)

PREPARE_REFUSED = "GpuClaimPrepareRefused"
PREPARE_FAILED = "GpuClaimPrepareFailed"


async def tell(
    events: PodEvents,
    ref: ClaimRef,
    error: DevicePluginError,
    claim: ClaimAllocation | None,
    where: str,
) -> None:
    """Log the refused or failed prepare of ``ref`` and warn each pod of ``claim`` (the claim as
    read, when it was, and it is the kubelet's). ``where``: the claim, node and driver, for the
    message."""
    permanent = isinstance(error, PermanentError)
    pods = [PodView(ref.namespace, n, u, "", {}, {}) for n, u in claim.pods] if claim else []
    log.warning(
        "dra_prepare_failed",
        claim=f"{ref.namespace}/{ref.name}",
        uid=ref.uid,
        error=str(error),
        retried="no" if permanent else "by the kubelet",
        pods=[p.name for p in pods] or "unknown: no Event",
    )
    if not pods:
        return
    if permanent:
        reason, message = PREPARE_REFUSED, f"{where} cannot be prepared: {error}"
    else:
        reason, message = PREPARE_FAILED, f"{where}: prepare failed, the kubelet retries: {error}"
    await events.warn(pods, reason, message)
