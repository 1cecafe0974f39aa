"""An informer: list, replay the list as events, watch from its resourceVersion, forever.

client-go's reflector, small: the list's items reach ``on_event`` as ``ADDED`` (after
``on_relist``, where the component drops what the list no longer holds); the watch then starts
from the list's resourceVersion and resumes from the last one seen whenever a stream ends by
itself (its timeout). An expired resourceVersion (410, one of ``gone``) lists again at once; any
of ``retry`` is logged, shown in ``failing`` (for ``/healthz``) and retried with the suite's
backoff (1 s, ×2, 30 s at most), listing again unless ``resume_after_error``. Anything else
propagates: the task guard reports it.

The component owns the transport: ``list_()`` returns ``(items, resourceVersion)`` and
``watch(rv)`` yields ``(type, object)`` pairs, converting its client's errors to its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

import structlog

T = TypeVar("T")

BACKOFF_INITIAL_S = 1.0
BACKOFF_MULTIPLIER = 2.0
BACKOFF_MAX_S = 30.0


def backoff_s(failures: int) -> float:
    """The suite's retry delay after ``failures`` failures in a row (1, 2, 4, … 30 s)."""
    exponent = min(max(failures - 1, 0), 16)
    return min(BACKOFF_INITIAL_S * BACKOFF_MULTIPLIER**exponent, BACKOFF_MAX_S)


def resource_version(obj: object) -> str | None:
    """``metadata.resourceVersion`` of a JSON object or of a Kubernetes client model."""
    if isinstance(obj, dict):
        meta = obj.get("metadata")
        version = meta.get("resourceVersion") if isinstance(meta, dict) else None
    else:
        version = getattr(getattr(obj, "metadata", None), "resource_version", None)
    return str(version) if version else None


class Informer(Generic[T]):
    """One kind, listed and watched by :meth:`run` until cancelled."""

    def __init__(
        self,
        kind: str,
        list_: Callable[[], Awaitable[tuple[Sequence[T], str]]],
        watch: Callable[[str], AsyncIterator[tuple[str, T]]],
        on_event: Callable[[str, T], None],
        *,
        on_relist: Callable[[Sequence[T]], None] | None = None,
        gone: tuple[type[BaseException], ...] = (),
        retry: tuple[type[BaseException], ...] = (),
        on_error: Callable[[BaseException], None] | None = None,
        resume_after_error: bool = False,
        version: Callable[[T], str | None] = resource_version,
        log: Any = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.kind = kind
        self._list, self._watch, self._on_event = list_, watch, on_event
        self._on_relist, self._on_error = on_relist, on_error
        self._gone, self._retry = gone, retry
        self._resume = resume_after_error
        self._version = version
        self._log = log if log is not None else structlog.get_logger("informer")
        self._sleep = sleep
        self.synced = asyncio.Event()
        """Set once the first list has been replayed (and stays set)."""
        self.failing: str | None = None
        """Why the list or watch fails now (None: it works); ``/healthz`` shows it."""
        self.lists = 0
        """Lists made so far (the first one included)."""

    async def run(self) -> None:
        failures = 0
        rv = ""
        while True:
            try:
                if not rv:
                    rv = await self.relist()
                async for kind_of_event, obj in self._watch(rv):
                    self.failing = None
                    rv = self._version(obj) or rv
                    if kind_of_event != "BOOKMARK":
                        self._on_event(kind_of_event, obj)
                failures = 0  # the stream ended by itself: watch on from the last version
            except self._gone:
                self._log.info("watch_expired", kind=self.kind)
                rv = ""
            except self._retry as e:
                failures += 1
                delay = backoff_s(failures)
                self._log.warning(
                    "watch_failed", kind=self.kind, error=str(e)[:300], retry_in_s=delay
                )
                self.failing = str(e)[:300]
                if self._on_error is not None:
                    self._on_error(e)
                if not self._resume:
                    rv = ""
                await self._sleep(delay)

    async def relist(self) -> str:
        """List, replay the items as ``ADDED``; returns the list's resourceVersion."""
        items, rv = await self._list()
        self.lists += 1
        if self._on_relist is not None:
            self._on_relist(items)
        for obj in items:
            self._on_event("ADDED", obj)
        self.synced.set()
        self.failing = None
        self._log.info("informer_synced", kind=self.kind, objects=len(items))
        return rv
