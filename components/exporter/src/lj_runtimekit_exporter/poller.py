"""The background poll: reads the Runtime and the pod list, publishes one snapshot per round.

Scrapes never call out; they render whatever this last published. While the Runtime is away
the snapshot carries ``runtime=None`` (device series drop out, ``runtime_up`` reads 0) and the
next attempt waits by the guide's backoff: 1 s, x2, at most 30 s (``runtime_channel.backoff_s``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Protocol

import structlog

from .collector import State
from .errors import TemporaryError
from .runtime import RuntimeGarbage
from .runtime_channel import backoff_s
from .snapshot import Held, Pod, RuntimeState, Snapshot

log = structlog.get_logger(__name__)


class RuntimeSource(Protocol):
    missing: set[str]

    async def version(self) -> tuple[str, str]: ...
    async def read(self, version: tuple[str, str]) -> RuntimeState: ...
    async def reconnect(self) -> None: ...


class PodSource(Protocol):
    async def pods(self) -> tuple[Pod, ...]: ...


class HeldSource(Protocol):
    socket: str

    async def held(self) -> tuple[Held, ...]: ...


class Poller:
    """Publishes a fresh :class:`Snapshot` into ``state`` every ``interval`` seconds."""

    def __init__(
        self,
        state: State,
        runtime: RuntimeSource,
        pods: PodSource | None,
        interval: float,
        *,
        clock: Callable[[], float] = time.time,
        held: HeldSource | None = None,
        fallback: str = "",
    ) -> None:
        self._state = state
        self._runtime = runtime
        self._pods = pods
        self._interval = interval
        self._clock = clock
        self._version: tuple[str, str] | None = None
        self._failures = 0
        self._pods_failing = False
        self._last_pods: tuple[Pod, ...] | None = None
        self._held = held
        self._held_up: bool | None = None
        """Whether pod-resources answered last time (None: not asked yet)."""
        self._fallback = fallback
        self.problems: dict[str, str] = {}
        """Source → why it failed in the last round (runtime, pods, pod_resources), for
        /healthz; empty when every source answered."""
        self.rounds = 0
        self.last_round_at = 0.0
        """Monotonic time the last round finished (for /healthz)."""

    async def poll_once(self) -> Snapshot:
        """One round: never raises for a peer's failure, always publishes a snapshot."""
        started = time.perf_counter()
        rt = await self._read_runtime()
        held = await self._read_held()
        # the pod list is the fallback: read only while pod-resources does not answer
        pods = await self._read_pods() if held is None else None
        snap = Snapshot(
            node=self._state.node,
            taken_at=self._clock(),
            runtime=rt,
            pods=pods if pods is not None else self._last_pods,
            pods_up=pods is not None,
            degraded=frozenset(self._runtime.missing) if rt is not None else frozenset(),
            held=held,
        )
        stats = self._state.stats
        stats.collections += 1
        stats.last_collection_seconds = time.perf_counter() - started
        self._state.snapshot = snap
        self.rounds += 1
        self.last_round_at = time.monotonic()
        return snap

    async def _read_runtime(self) -> RuntimeState | None:
        try:
            if self._version is None:
                if self._failures:
                    await self._runtime.reconnect()
                self._version = await self._runtime.version()
            rt = await self._runtime.read(self._version)
        except (TemporaryError, ValueError, TypeError) as e:
            # ValueError/TypeError: a Runtime answer our conversion could not take; counted and
            # retried like an outage rather than ending the poll loop.
            self._version = None
            self._failures += 1
            self._state.stats.errors["runtime"] += 1
            self.problems["runtime"] = str(e)
            if isinstance(e, RuntimeGarbage):
                self._count("runtime_invalid_reply")
            if self._failures == 1:
                log.warning(
                    "runtime_unreachable",
                    node=self._state.node,
                    error=str(e),
                    effect="device series dropped until it answers; retrying with backoff",
                )
            return None
        if self._failures:
            log.info("runtime_reconnected", node=self._state.node, after_attempts=self._failures)
        self._failures = 0
        invalid = sorted(getattr(self._runtime, "invalid", ()))
        if invalid:
            self._count("runtime_invalid_reply", len(invalid))
            self.problems["runtime"] = f"invalid replies from {', '.join(invalid)} (left out)"
        else:
            self.problems.pop("runtime", None)
        return rt

    def _count(self, source: str, n: int = 1) -> None:
        errors = self._state.stats.errors
        errors[source] = errors.get(source, 0) + n

    async def _read_held(self) -> tuple[Held, ...] | None:
        if self._held is None:
            return None
        try:
            held = await self._held.held()
        except TemporaryError as e:
            self._count("pod_resources")
            self.problems["pod_resources"] = str(e)
            if self._held_up is not False:
                log.warning(
                    "attribution_source",
                    source=self._fallback or "runtime",
                    node=self._state.node,
                    error=str(e),
                    effect="pod-resources unavailable: attributing with the fallback pod source "
                    "until it answers (whole devices recorded without a pod go unattributed)",
                )
            self._held_up = False
            return None
        if self._held_up is not True:
            log.info(
                "attribution_source",
                source="pod-resources",
                socket=self._held.socket,
                node=self._state.node,
                containers=len({(h.namespace, h.pod, h.container) for h in held}),
            )
        self._held_up = True
        self.problems.pop("pod_resources", None)
        return held

    async def _read_pods(self) -> tuple[Pod, ...] | None:
        if self._pods is None:
            return None
        try:
            pods = await self._pods.pods()
        except TemporaryError as e:
            self._state.stats.errors["pods"] += 1
            self.problems["pods"] = str(e)
            if not self._pods_failing:
                log.warning(
                    "pod_list_unavailable",
                    node=self._state.node,
                    error=str(e),
                    effect="attributing with the last pod list read until it answers",
                )
            self._pods_failing = True
            return None
        if self._pods_failing:
            log.info("pod_list_back", node=self._state.node, pods=len(pods))
        self._pods_failing = False
        self.problems.pop("pods", None)
        self._last_pods = pods
        return pods

    def next_delay(self) -> float:
        """The poll interval, or the reconnect backoff while the Runtime is away."""
        if self._failures:
            return backoff_s(self._failures)
        return self._interval

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.poll_once()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.next_delay())
