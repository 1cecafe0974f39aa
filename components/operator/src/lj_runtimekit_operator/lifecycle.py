"""The lifecycle every LJ RuntimeKit daemon shares: named tasks, signals, ordered shutdown.

Shape file (docs/shape.md): every daemon carries this file as ``lifecycle.py``, byte for byte;
``tests/shape_tests/test_drift.py`` fails when a copy differs from
``tests/shape_tests/canonical/lifecycle.py``. Change the reference and copy it in the same commit.

Exit codes, the same in every daemon: 0 after SIGTERM/SIGINT (the only clean end), 1 when a task
fails or the daemon cannot start (never 0: a crashed pod must not read "Completed"), 2 for bad
settings (the ``__main__`` returns it), 130 when a second signal forces the exit at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, Coroutine
from typing import Any

import structlog

log = structlog.get_logger("lifecycle")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_FORCED = 130


class Tasks:
    """Named tasks under one guard: a task that raises logs ``task_failed``, records why in
    ``fatal`` and sets ``stop``, so the daemon shuts down and exits 1; ``stop`` also ends with a
    signal (``fatal`` then stays empty)."""

    def __init__(self, stop: asyncio.Event | None = None) -> None:
        self.stop = stop if stop is not None else asyncio.Event()
        self.fatal = ""
        self._tasks: list[asyncio.Task[None]] = []

    def spawn(self, name: str, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[None]:
        task = asyncio.create_task(self._guard(name, coro), name=name)
        self._tasks.append(task)
        return task

    async def _guard(self, name: str, coro: Coroutine[Any, Any, Any]) -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.exception("task_failed", task=name, next="shutting down; exit 1")
            if not self.stop.is_set() and not self.fatal:
                self.fatal = f"task {name} failed: {e!r}"
            self.stop.set()
            return
        log.info("task_ended", task=name)

    async def wait(self) -> None:
        """Until ``stop`` is set (a signal or a failed task)."""
        await self.stop.wait()

    async def cancel(self) -> None:
        """Cancel every task, the last started first, and wait for each to end."""
        for task in reversed(self._tasks):
            task.cancel()
        for task in reversed(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()


def on_signals(stop: asyncio.Event, forced: Callable[[int], Any] = os._exit) -> None:
    """SIGTERM/SIGINT set ``stop``; a second one exits 130 at once: it is sent because the
    shutdown hangs, so waiting for tasks to finish their cancellation is what it must not do."""
    loop = asyncio.get_running_loop()
    received = 0

    def handler(signum: int) -> None:
        nonlocal received
        received += 1
        if received > 1:
            log.warning("forced_exit", signal=signal.Signals(signum).name, exit_code=EXIT_FORCED)
            forced(EXIT_FORCED)
            return
        log.info("stopping", signal=signal.Signals(signum).name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, handler, sig)


def run(main: Callable[[Tasks], Coroutine[Any, Any, None]], *, name: str) -> int:
    """Run ``main(tasks)`` with the signal handlers installed; its exit code (0 or 1). A failed
    task is logged once more at the end as ``<name>_failed``.

    ``main`` spawns its tasks, waits for ``tasks.stop``, then shuts down in its own order and
    calls ``tasks.cancel()``. An error ``main`` raises itself propagates (the caller says which
    start failure it was, e.g. a port in use)."""
    tasks: Tasks | None = None

    async def body() -> None:
        nonlocal tasks
        tasks = Tasks()
        on_signals(tasks.stop)
        await main(tasks)

    asyncio.run(body())
    if tasks is not None and tasks.fatal:
        log.error(f"{name}_failed", error=tasks.fatal, exit_code=EXIT_FAILED)
        return EXIT_FAILED
    return EXIT_OK
