"""The tasks that let a node change mode with GPU pods running (docs/dra.md, :mod:`.handover`).

- :func:`tracker`: what each reconcile pass tells the :class:`Handover` — in mode dra the devices
  device-plugin pods hold (tainted in the slices), in mode device-plugin the devices prepared
  claims hold (Unhealthy to the kubelet).
- :func:`withdraw_slices` (mode device-plugin): the node's ResourceSlices go, so no new claim is
  allocated here.
- :func:`dra_parts`: the DRA host (mode dra, or mode device-plugin after mode dra, to unprepare)
  and the handover between the modes.
- :func:`nri_plugin` (mode dra): the injection annotations onto containers through NRI.
- :func:`hand_back` (mode device-plugin): the kubelet's DRA API is served while the checkpoint
  holds claims, so that their pods' ends release them; then it goes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import structlog
from kubernetes_asyncio.config import ConfigException

from .dra_checkpoint import CheckpointStore, read_boot_id
from .dra_plugin import DraHost
from .dra_prepare import Preparer
from .dra_publish import SlicePublisher
from .dra_slices import DYNAMIC
from .handover import Handover, Split, holders
from .inventory import Inventory
from .kube import ApiserverUnavailable, read_claim, read_pod
from .model import Device
from .nri import NriPlugin
from .reclaim import Listed
from .resources import ResourceNames
from .runtime import RuntimeClient
from .runtime_partitions import PartitionClient
from .settings import Settings

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


def dra_host(
    s: Settings,
    client: RuntimeClient,
    api: Any,
    names: ResourceNames,
    inventory: Inventory,
    *,
    prepare: bool = True,
    on_unprepared: Callable[[], None] | None = None,
) -> DraHost:
    async def claim(ns: str, name: str) -> dict[str, Any]:
        return await read_claim(api, ns, name)

    async def pod(ns: str, name: str) -> dict[str, Any]:
        return await read_pod(api, ns, name)

    store = CheckpointStore(checkpoint_path(s), read_boot_id())
    preparer = Preparer(
        client,
        read_claim=claim,
        read_pod=pod,
        devices=lambda: inventory.view().devices,
        store=store,
        names=names,
        driver=s.dra_driver_name,
        pool=s.node_name,
        cdi_dir=Path(s.cdi_dir),
        cdi_kind=s.cdi_kind,
        partitions=(
            PartitionClient(s.socket_dir, s.rpc_timeout) if s.dra_partitions == DYNAMIC else None
        ),
        policy=s.dra_partitions,
    )
    return DraHost(
        preparer,
        driver=s.dra_driver_name,
        plugin_dir=s.dra_plugin_dir,
        registry_dir=s.dra_registry_dir,
        prepare=prepare,
        on_unprepared=on_unprepared,
    )


def nri_plugin(s: Settings) -> NriPlugin | None:
    """The NRI plugin that puts the injection annotations of prepared claims on containers
    (mode dra with --nri); None otherwise."""
    if s.mode != "dra" or not s.nri:
        return None
    return NriPlugin(s.nri_socket, Path(s.cdi_dir), s.cdi_kind)


def checkpoint_path(s: Settings) -> Path:
    return Path(s.dra_plugin_dir) / s.dra_driver_name / "checkpoint.json"


def dra_parts(
    s: Settings, client: RuntimeClient, api: Any, names: ResourceNames, inventory: Inventory
) -> tuple[DraHost | None, Handover | None, asyncio.Event]:
    """The DRA host (mode dra, or mode device-plugin after mode dra this boot, to unprepare) and
    the handover when the other mode may hold devices; the event is set after every unprepare."""
    unprepared = asyncio.Event()
    dra = s.mode == "dra"
    if dra and api is None:
        raise ConfigException("mode dra needs the apiserver (ResourceSlices, ResourceClaims)")
    if not dra and not checkpoint_path(s).exists():
        return None, None, unprepared  # this node never ran in mode dra
    host = dra_host(s, client, api, names, inventory, prepare=dra, on_unprepared=unprepared.set)
    keep = dra or bool(host.plugin.preparer.checkpoint.claims)
    return host, Handover() if keep else None, unprepared
