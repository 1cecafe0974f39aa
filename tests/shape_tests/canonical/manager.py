"""The leader-elected host: one replica serves, leads or waits, and works while it leads.

Shared by the controller and the operator (controller-runtime's manager, small). The component
subclasses :class:`Manager`: its ``run()`` opens its clients and its HTTP server, builds the
elector with :func:`elector`, and hands :meth:`Manager.lead` what to start once it leads. The
module-level :func:`run` is the daemon's ``app.run``: logging, the noted deprecations, the
effective settings, then the lifecycle with the component's exit codes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Protocol, cast

import structlog

from . import lifecycle, logs
from .leader import Elector, LeaseApi


class LeaderSettings(Protocol):
    """The shared flags of a leader-elected daemon (docs/shape.md, the shared flags)."""

    @property
    def identity(self) -> str: ...
    @property
    def leader_elect(self) -> bool: ...
    @property
    def leader_elect_lease_duration(self) -> float: ...
    @property
    def leader_elect_renew_deadline(self) -> float: ...
    @property
    def leader_elect_retry_period(self) -> float: ...
    @property
    def leader_elect_resource_namespace(self) -> str: ...
    @property
    def leader_elect_resource_name(self) -> str: ...


def elector(s: LeaderSettings, lease: Callable[[str, str], LeaseApi]) -> Elector | None:
    """The elector of ``--leader-elect`` (None when off), on the Lease ``lease(namespace, name)``
    gives; built only when used, since its timing checks concern only the Lease."""
    if not s.leader_elect:
        return None
    namespace, name = s.leader_elect_resource_namespace, s.leader_elect_resource_name
    return Elector(
        lease(namespace, name),
        s.identity,
        namespace=namespace,
        name=name,
        lease_duration=s.leader_elect_lease_duration,
        renew_deadline=s.leader_elect_renew_deadline,
        retry_period=s.leader_elect_retry_period,
    )


class Manager:
    """One replica's tasks under ``tasks``, whose guard records a failed one and sets ``stop``."""

    def __init__(self, name: str, tasks: lifecycle.Tasks | None = None) -> None:
        self.log = structlog.get_logger(f"lj_runtimekit_{name}")
        self.tasks = tasks if tasks is not None else lifecycle.Tasks()
        self.stop = self.tasks.stop
        self.running: dict[str, asyncio.Task[None]] = {}
        self.port = 0

    @property
    def crashed(self) -> list[str]:
        """Tasks that ended with an exception: the process then exits 1, never 0."""
        return [self.tasks.fatal] if self.tasks.fatal else []

    def health(self) -> str | None:
        for name, task in self.running.items():
            if task.done():
                return f"task {name} ended"
        return None

    def _spawn(self, name: str, coro: Coroutine[Any, Any, None]) -> None:
        self.running[name] = self.tasks.spawn(name, coro)

    async def run(self) -> int:
        """The replica's life: the component's (serve, :meth:`lead`, close); the exit code."""
        raise NotImplementedError

    async def lead(
        self,
        elector: Elector | None,
        start: Callable[[], None],
        leading: Callable[[bool], None],
    ) -> int:
        """Wait for the Lease (none: lead at once), ``start()`` the work, and hold it until
        ``stop`` or the Lease is lost; then cancel the tasks and release the Lease.

        Returns 0 after ``stop``, 1 when the Lease was lost or a task failed. ``leading(True)``
        once it leads, ``leading(False)`` at the end (the leader gauge)."""
        code = lifecycle.EXIT_OK
        try:
            if elector is not None:
                self._spawn("leader", elector.run())
                await first(elector.leading.wait(), self.stop.wait())
            if not self.stop.is_set():
                leading(True)
                start()
                if elector is not None:
                    await first(elector.lost.wait(), self.stop.wait())
                else:
                    await self.stop.wait()
                if elector is not None and elector.lost.is_set():
                    self.log.error("leadership_lost_exiting")
                    code = lifecycle.EXIT_FAILED
        finally:
            await self.tasks.cancel()
            if elector is not None:
                await elector.release()  # logs and swallows its own errors
            leading(False)
        return code

    def exit_code(self, code: int) -> int:
        """``code``, or 1 when a task crashed (said in the log)."""
        if self.crashed:
            self.log.error("exiting_after_crash", tasks=self.crashed)
            return lifecycle.EXIT_FAILED
        return code


async def first(*waits: Coroutine[Any, Any, Any]) -> None:
    """Until the first of ``waits`` is done; the others are cancelled."""
    pending = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for p in pending:
            p.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await p


class _DaemonSettings(Protocol):
    @property
    def log_level(self) -> str: ...
    @property
    def log_format(self) -> str: ...


def run(
    settings: _DaemonSettings,
    deprecations: Sequence[str],
    *,
    name: str,
    version: str,
    error: type[Exception],
    manager: Callable[[lifecycle.Tasks], Manager],
) -> int:
    """The daemon's ``app.run``: exit 0 after a signal; 1 when a task failed, the Lease was lost
    or the manager's ``run()`` raised (``error``: said as ``<name>_failed``; anything else is a
    bug, logged as ``<name>_crashed``); a second signal exits 130 at once (lifecycle)."""
    log = structlog.get_logger(f"lj_runtimekit_{name}")
    logs.configure(settings.log_level, settings.log_format)
    for note in deprecations:
        log.warning("deprecated_setting", note=note)
    log.info("starting", version=version, settings=dataclasses.asdict(cast(Any, settings)))
    code = lifecycle.EXIT_OK

    async def main(tasks: lifecycle.Tasks) -> None:
        nonlocal code
        try:
            code = await manager(tasks).run()
        except error as e:
            log.error(f"{name}_failed", error=str(e), exit_code=lifecycle.EXIT_FAILED)
            code = lifecycle.EXIT_FAILED
        except Exception:  # a bug: say so, and never exit 0 ("Completed") after it
            log.exception(f"{name}_crashed", exit_code=lifecycle.EXIT_FAILED)
            code = lifecycle.EXIT_FAILED

    return max(lifecycle.run(main, name=name), code)
