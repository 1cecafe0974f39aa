"""Events as kube-scheduler's recorder writes them: aggregated into series, rate-limited per pod.

client-go's ``tools/events`` recorder keys an Event by what it is about (regarding object, type,
reason, action, note): the first occurrence creates an ``events.k8s.io/v1`` Event, repeats only
raise its ``series.count`` (written back at most once per interval), and a series silent for six
minutes is finished, so the next occurrence starts a new Event. Here the note is keyed with its
numbers blanked ("0/3 nodes are available" and "0/4 nodes ..." are the same story), because a
FailedScheduling note changes with the cluster while the reason does not; the Event keeps its first
note (the API refuses to change it) and the count says how often it happened.

Per pod, new Event objects are limited by a token bucket (as client-go's spam filter does for
core/v1 Events), so a pod whose notes keep changing cannot flood its namespace. Every structure is
bounded: series expire after ``series_idle_s`` and at most ``max_series`` are kept.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from .errors import SchedulerError
from .model import Pod

log = structlog.get_logger("lj_runtimekit_scheduler.events")

_NUMBERS = re.compile(r"\d+")


class EventSink(Protocol):
    """The apiserver side (kube.Kube): create an Event, raise a series' count."""

    async def event(self, pod: Pod, kind: str, reason: str, message: str, count: int = 1) -> str:
        """Create the Event; returns its name."""
        ...

    async def event_series(self, pod: Pod, name: str, count: int) -> None:
        """Set the Event's ``series.count`` (and ``lastObservedTime`` to now)."""
        ...


Key = tuple[str, str, str, str, str, str]


def series_key(pod: Pod, kind: str, reason: str, message: str) -> Key:
    """What makes two occurrences one series: the pod (uid too), type, reason, the note's words."""
    return (pod.namespace, pod.name, pod.uid, kind, reason, _NUMBERS.sub("#", message))


@dataclass
class _Series:
    pod: Pod
    kind: str
    reason: str
    note: str
    count: int = 1
    written: int = 0
    """The count the apiserver has (0: the Event is not created yet)."""
    name: str = ""
    last_seen: float = 0.0
    last_write: float = 0.0
    task: asyncio.Task[None] | None = field(default=None, repr=False)


@dataclass
class _Bucket:
    tokens: float
    at: float


class EventRecorder:
    """Best effort and never blocks the cycle: writes run as tasks; failures are logged."""

    def __init__(
        self,
        sink: EventSink,
        *,
        interval_s: float = 30.0,
        series_idle_s: float = 360.0,
        per_pod_burst: int = 10,
        per_pod_refill_s: float = 60.0,
        max_series: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sink = sink
        self.interval_s = interval_s
        self.series_idle_s = series_idle_s
        self.per_pod_burst = per_pod_burst
        self.per_pod_refill_s = per_pod_refill_s
        self.max_series = max_series
        self.clock = clock
        self.series: OrderedDict[Key, _Series] = OrderedDict()
        self.buckets: OrderedDict[tuple[str, str], _Bucket] = OrderedDict()
        self.pending: set[asyncio.Task[None]] = set()
        self.dropped = 0
        self.closed = False

    def event(self, pod: Pod, kind: str, reason: str, message: str) -> None:
        if self.closed:
            return  # shutting down: the apiserver client is about to close
        now = self.clock()
        self._expire(now)
        key = series_key(pod, kind, reason, message)
        found = self.series.get(key)
        if found is not None:
            found.count += 1
            found.last_seen = now
            self.series.move_to_end(key)
            if found.task is None:
                found.task = self._spawn(self._write_later(found))
            return
        if not self._allow(pod, now):
            self.dropped += 1
            log.debug("event_rate_limited", pod=pod.key, reason=reason)
            return
        fresh = _Series(pod, kind, reason, message[:1024], last_seen=now)
        self.series[key] = fresh
        while len(self.series) > self.max_series:
            self.series.popitem(last=False)
        fresh.task = self._spawn(self._write_later(fresh))

    def _allow(self, pod: Pod, now: float) -> bool:
        """The per-pod token bucket for new Event objects."""
        key = (pod.namespace, pod.name)
        bucket = self.buckets.get(key)
        if bucket is None:
            bucket = self.buckets[key] = _Bucket(float(self.per_pod_burst), now)
            while len(self.buckets) > self.max_series:
                self.buckets.popitem(last=False)
        self.buckets.move_to_end(key)
        bucket.tokens = min(
            float(self.per_pod_burst), bucket.tokens + (now - bucket.at) / self.per_pod_refill_s
        )
        bucket.at = now
        if bucket.tokens < 1:
            return False
        bucket.tokens -= 1
        return True

    def _expire(self, now: float) -> None:
        """Finish series silent for ``series_idle_s`` (oldest first: the dict is in touch order)."""
        while self.series:
            key, oldest = next(iter(self.series.items()))
            if now - oldest.last_seen <= self.series_idle_s or oldest.task is not None:
                return
            del self.series[key]

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(coro)
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)
        return task

    async def _write_later(self, s: _Series) -> None:
        """Write the series' count, no sooner than ``interval_s`` after its last write."""
        try:
            if s.written:
                await asyncio.sleep(max(0.0, s.last_write + self.interval_s - self.clock()))
            count = s.count
            if not s.written:
                s.name = await self.sink.event(s.pod, s.kind, s.reason, s.note, count)
            elif count > s.written:
                await self.sink.event_series(s.pod, s.name, count)
            s.written, s.last_write = count, self.clock()
        except SchedulerError as e:
            log.warning("event_not_recorded", pod=s.pod.key, reason=s.reason, error=str(e)[:200])
            s.last_write = self.clock()
        finally:
            s.task = None
        if s.count > max(s.written, 1) and s.name:  # more came while writing
            s.task = self._spawn(self._write_later(s))

    async def drain(self) -> None:
        """Wait for the writes in flight (tests)."""
        while self.pending:
            await asyncio.gather(*list(self.pending), return_exceptions=True)

    async def close(self) -> None:
        """End every write task before the client they write with is closed. Left running, a
        task asleep until its series' next write woke on a closed client, or outlived the loop
        ("Task was destroyed but it is pending"). Best effort like every write here: a count
        not yet written is dropped, as kube-scheduler's recorder drops what is queued at exit."""
        self.closed = True
        while self.pending:
            tasks = list(self.pending)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
