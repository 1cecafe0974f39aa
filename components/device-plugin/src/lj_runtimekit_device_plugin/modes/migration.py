"""The tasks that let a node change mode with GPU pods running (docs/dra.md, :mod:`..handover`).

- :func:`tracker`: what each reconcile pass tells the :class:`Handover` — in mode dra the devices
  device-plugin pods hold (tainted in the slices), in mode device-plugin the devices prepared
  claims hold (Unhealthy to the kubelet).
- :func:`slice_publisher`: the node's ResourceSlices; :func:`withdraw_slices` (mode device-plugin):
  they go, so no new claim is allocated here.
- :func:`dra_host`: the DRA kubelet plugin (mode dra, or mode device-plugin after mode dra, to
  unprepare), over the checkpoint at :func:`checkpoint_path`.
- :func:`hand_back` (mode device-plugin): the kubelet's DRA API is served while the checkpoint
  holds claims, so that their pods' ends release them; then it goes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import structlog

from ..dra.checkpoint import CheckpointStore, read_boot_id
from ..dra.offers import DYNAMIC
from ..dra.plugin import DraHost
from ..dra.prepare import Preparer
from ..dra.publish import SlicePublisher
from ..dra.runtime_partitions import PartitionClient
from ..handover import Handover, Split, held_taints, holders
from ..kube import ApiserverUnavailable, read_claim, read_pod
from ..model import Device
from ..node import Node, Parts
from ..reclaim import Listed
from ..settings import Settings

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


def slice_publisher(node: Node, handover: Handover | None = None) -> SlicePublisher:
    """The node's ResourceSlices of the driver; with ``handover`` (mode dra), the devices
    device-plugin pods hold are tainted in them."""
    s = node.settings
    return SlicePublisher(
        node.api,
        s.node_name,
        driver=s.dra_driver_name,
        partitions=s.dra_partitions,
        taints=lambda: held_taints(handover.held if handover is not None else {}),
        topology_labels=s.topology_labels,
    )


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
    if not host.claims:
        return
    log.info(
        "dra_claims_served_until_unprepared",
        claims=sorted(f"{r.namespace}/{r.name}" for r in host.claims.values()),
        prepare="refused for new claims",
    )
    await host.start()
    try:
        while host.claims:
            await unprepared.wait()
            unprepared.clear()
            wake()
    finally:
        await host.stop()
    log.info("dra_plugin_withdrawn", reason="no prepared claim left")


def dra_host(
    parts: Parts,
    *,
    prepare: bool = True,
    on_unprepared: Callable[[], None] | None = None,
) -> DraHost:
    s, api, inventory = parts.settings, parts.api, parts.inventory

    async def claim(ns: str, name: str) -> dict[str, Any]:
        return await read_claim(api, ns, name)

    async def pod(ns: str, name: str) -> dict[str, Any]:
        return await read_pod(api, ns, name)

    store = CheckpointStore(checkpoint_path(s), read_boot_id())
    preparer = Preparer(
        parts.client,
        read_claim=claim,
        read_pod=pod,
        devices=lambda: inventory.view().devices,
        store=store,
        names=parts.names,
        driver=s.dra_driver_name,
        pool=s.node_name,
        cdi_dir=Path(s.cdi_dir),
        cdi_kind=s.cdi_kind,
        partitions=(
            PartitionClient(s.socket_dir, s.rpc_timeout) if s.dra_partitions == DYNAMIC else None
        ),
        policy=s.dra_partitions,
        events=parts.events,
    )
    return DraHost(
        preparer,
        driver=s.dra_driver_name,
        plugin_dir=s.dra_plugin_dir,
        registry_dir=s.dra_registry_dir,
        prepare=prepare,
        on_unprepared=on_unprepared,
    )


def checkpoint_path(s: Settings) -> Path:
    return Path(s.dra_plugin_dir) / s.dra_driver_name / "checkpoint.json"
