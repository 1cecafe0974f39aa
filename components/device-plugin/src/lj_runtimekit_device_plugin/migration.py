"""The tasks that let a node change mode with GPU pods running (docs/dra.md, :mod:`.handover`).

- :func:`tracker`: what each reconcile pass tells the :class:`Handover` — in mode dra the devices
  device-plugin pods hold (tainted in the slices), in mode device-plugin the devices prepared
  claims hold (Unhealthy to the kubelet).
- :func:`withdraw_slices` (mode device-plugin): the node's ResourceSlices go, so no new claim is
  allocated here.
- :func:`hand_back` (mode device-plugin): the kubelet's DRA API is served while the checkpoint
  holds claims, so that their pods' ends release them; then it goes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import structlog

from .dra_plugin import DraHost
from .dra_publish import SlicePublisher
from .handover import Handover, Split, holders
from .kube import ApiserverUnavailable
from .model import Device
from .reclaim import Listed

log = structlog.get_logger(__name__)

RETRY_S = 5.0


def tracker(handover: Handover, devices: Callable[[], Sequence[Device]], *, dra: bool) -> Listed:
    """The reconciler's ``on_listed``: the other mode's holdings into ``handover``."""

    async def listed(split: Split) -> None:
        other = split.device_plugin if dra else split.claims
        if await handover.set(holders(other, devices())):
            log.info(
                "handover_holdings_changed",
                held_by="device-plugin pods" if dra else "prepared DRA claims",
                devices={d: f"{p[0]}/{p[1]}" for d, p in sorted(handover.held.items())},
                effect="tainted in the ResourceSlices"
                if dra
                else "Unhealthy to the kubelet until unprepared",
            )

    return listed


async def withdraw_slices(publisher: SlicePublisher) -> None:
    """Delete the node's slices of the driver; retried until the apiserver answers."""
    while True:
        try:
            n = await publisher.withdraw()
        except ApiserverUnavailable as e:
            log.warning(
                "resource_slices_withdraw_failed", error=str(e), next=f"retry in {RETRY_S}s"
            )
            await asyncio.sleep(RETRY_S)
            continue
        if n:
            log.info("dra_slices_withdrawn_in_device_plugin_mode", node=publisher.node, slices=n)
        return


async def hand_back(host: DraHost, unprepared: asyncio.Event, wake: Callable[[], None]) -> None:
    """Serve the kubelet's DRA API until the checkpoint holds no claim; ``unprepared`` is set after
    every ``NodeUnprepareResources``, and ``wake`` (a reconcile pass) then lets the kubelet have
    the released devices again."""
    preparer = host.plugin.preparer
    if not preparer.checkpoint.claims:
        return
    log.info(
        "dra_claims_served_until_unprepared",
        claims=sorted(f"{r.namespace}/{r.name}" for r in preparer.checkpoint.claims.values()),
        prepare="refused for new claims",
    )
    await host.start()
    try:
        while preparer.checkpoint.claims:
            await unprepared.wait()
            unprepared.clear()
            wake()
    finally:
        await host.stop()
    log.info("dra_plugin_withdrawn", reason="no prepared claim left")
