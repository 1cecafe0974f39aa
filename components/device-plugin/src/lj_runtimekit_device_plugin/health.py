"""Keeps the :class:`Inventory` current: the Runtime's WatchDevices stream plus a periodic check.

A health event reaches the inventory as soon as the stream delivers it (well within a second);
the periodic ListDevices catches anything a stream missed and is the only source against an
older Runtime without WatchDevices. Every health flip is logged with its reason.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog

from .inventory import Inventory
from .model import Device
from .runtime import WATCH_DEVICES, MethodMissing, RuntimeClient, RuntimeUnavailable, retrying

log = structlog.get_logger(__name__)


def _log_changes(changes: list[tuple[Device | None, Device]]) -> None:
    for old, new in changes:
        if old is None:
            log.info("device_added", device=new.id, uuid=new.uuid, healthy=new.healthy)
        elif old.healthy != new.healthy:
            log.warning(
                "device_health_changed",
                device=new.id,
                uuid=new.uuid,
                healthy=new.healthy,
                reason=new.reason,
            )


class HealthFollower:
    """Feeds one Inventory from one RuntimeClient until cancelled."""

    def __init__(
        self,
        client: RuntimeClient,
        inventory: Inventory,
        interval_s: float,
        *,
        on_connect: Callable[[], None] | None = None,
    ) -> None:
        self.on_connect = on_connect or (lambda: None)
        self.client = client
        self.inventory = inventory
        self.interval_s = interval_s
        self.connected = asyncio.Event()
        self.last_error = ""
        """Why the Runtime last failed us (empty once it answers again), for /healthz."""

    async def refresh(self) -> None:
        """One full check: version and ListDevices into the inventory."""
        try:
            info = await self.client.version()
            await self.inventory.set_runtime(info)
            _log_changes(await self.inventory.replace(await self.client.list_devices()))
        except RuntimeUnavailable as e:
            self.last_error = str(e)
            raise
        self.last_error = ""
        if not self.connected.is_set():
            self.connected.set()
            self.on_connect()

    async def watch(self) -> None:
        """Follow WatchDevices forever, reconnecting with the guide's backoff."""
        async for attempt in retrying("watch_devices"):
            with attempt:
                await self.refresh()
                info = self.inventory.view().runtime
                if info.capabilities and WATCH_DEVICES not in info.capabilities:
                    log.warning(
                        "runtime_lacks_watch",
                        runtime_version=info.version,
                        fallback=f"periodic ListDevices every {self.interval_s}s",
                    )
                    return
                try:
                    await self._follow()
                except MethodMissing as e:
                    log.warning("runtime_lacks_watch", error=str(e))
                    return
                except RuntimeUnavailable as e:
                    self.connected.clear()
                    self.last_error = str(e)
                    raise

    async def _follow(self) -> None:
        async for kind, devices in self.client.watch():
            if kind == "snapshot":
                _log_changes(await self.inventory.replace(devices))
            elif kind == "removed":
                await self.inventory.remove(d.id for d in devices)
                log.info("device_removed", devices=[d.id for d in devices])
            else:
                _log_changes(await self.inventory.update(devices))

    async def poll(self) -> None:
        """The periodic check; failures are logged and the last known devices kept."""
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.refresh()
            except RuntimeUnavailable as e:
                self.connected.clear()
                self.last_error = str(e)
                log.warning("runtime_check_failed", error=str(e), keeping="last known devices")
