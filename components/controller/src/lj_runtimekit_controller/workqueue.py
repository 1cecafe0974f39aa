"""A work queue of node names, as client-go's: each name at most once, never in two workers."""

from __future__ import annotations

import asyncio


class WorkQueue:
    """``add`` dedups; a name added while it is processed is queued again once ``done``."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._pending: set[str] = set()
        self._processing: set[str] = set()
        self._dirty: set[str] = set()
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, key: str) -> None:
        if key in self._processing:
            self._dirty.add(key)
            return
        if key not in self._pending:
            self._pending.add(key)
            self._queue.put_nowait(key)

    def add_after(self, key: str, delay_s: float) -> None:
        """Add ``key`` after ``delay_s``; an earlier pending timer wins."""
        loop = asyncio.get_running_loop()
        old = self._timers.get(key)
        when = loop.time() + delay_s
        if old is not None and old.when() <= when:
            return
        if old is not None:
            old.cancel()
        self._timers[key] = loop.call_at(when, self._fire, key)

    def _fire(self, key: str) -> None:
        self._timers.pop(key, None)
        self.add(key)

    async def get(self) -> str:
        key = await self._queue.get()
        self._pending.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: str) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
