"""What every mode implements (:mod:`.device_plugin`, :mod:`.dra`, :mod:`.hand_back`), and the
one wait they share."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, Protocol

from .. import lifecycle
from ..node import Node, Reclaiming

Registration = tuple[set[str], dict[str, str]]
"""(registered with the kubelet, refused with the kubelet's reason): what /healthz reports."""


class Mode(Protocol):
    """How the node serves its devices to the kubelet: the device plugin API, or DRA."""

    reclaiming: Reclaiming
    """Its part in every reconcile pass (given to the reclaimer before :meth:`start`)."""

    async def start(self, node: Node, tasks: lifecycle.Tasks) -> None:
        """Spawn its tasks, wait for the first inventory, then open its kubelet sockets; return
        early when the tasks stop."""

    def registration(self) -> Registration:
        """Its registration with the kubelet now, for /healthz."""

    async def stop(self) -> None:
        """Close the sockets and clients it owns (its tasks are cancelled before)."""


async def first(awaitable: Coroutine[Any, Any, Any], tasks: lifecycle.Tasks) -> None:
    """Wait for ``awaitable`` or for the tasks to stop, whichever comes first."""
    done = asyncio.create_task(awaitable)
    stopping = asyncio.create_task(tasks.wait())
    await asyncio.wait({done, stopping}, return_when=asyncio.FIRST_COMPLETED)
    done.cancel()
    stopping.cancel()
