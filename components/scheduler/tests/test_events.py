"""Events aggregated as kube-scheduler's recorder does (issue 20): one Event per pod, reason and
note (numbers aside) whose series count grows, new objects rate-limited per pod, memory bounded."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from lj_runtimekit_scheduler.errors import TemporaryError
from lj_runtimekit_scheduler.events import EventRecorder
from lj_runtimekit_scheduler.model import Pod


@dataclass
class Sink:
    """The apiserver's events: name → (pod, reason, note, count)."""

    objects: dict[str, list[Any]] = field(default_factory=dict)
    writes: int = 0
    fail: bool = False

    async def event(self, pod: Pod, kind: str, reason: str, message: str, count: int = 1) -> str:
        self.writes += 1
        if self.fail:
            raise TemporaryError("apiserver unreachable")
        name = f"{pod.name}.{len(self.objects)}"
        self.objects[name] = [pod.name, reason, message, count]
        return name

    async def event_series(self, pod: Pod, name: str, count: int) -> None:
        self.writes += 1
        assert count > self.objects[name][3], "a series count only grows"
        self.objects[name][3] = count


def pods(n: int) -> list[Pod]:
    return [Pod(uid=f"u{i}", namespace="ns", name=f"p{i}") for i in range(n)]


async def test_n_failed_attempts_on_six_pods_give_six_events_with_their_counts() -> None:
    sink = Sink()
    rec = EventRecorder(sink, interval_s=0.01)
    six = pods(6)
    for attempt in range(40):  # the 39-Events-in-5-minutes case of issue 20, and more
        for pod in six:
            nodes = 3 + attempt % 2  # the note's numbers change with the cluster
            rec.event(pod, "Warning", "FailedScheduling", f"0/{nodes} nodes are available")
        await asyncio.sleep(0)
    await rec.drain()
    assert len(sink.objects) == 6
    assert sorted(o[0] for o in sink.objects.values()) == [p.name for p in six]
    assert all(o[3] == 40 for o in sink.objects.values()), sink.objects
    assert sink.writes < 6 * 40 / 2, "repeats are batched into few series writes"


async def test_another_reason_or_story_is_another_event() -> None:
    sink = Sink()
    rec = EventRecorder(sink, interval_s=0.01)
    (pod,) = pods(1)
    rec.event(pod, "Warning", "FailedScheduling", "0/3 nodes are available: Insufficient cpu")
    rec.event(pod, "Warning", "FailedScheduling", "0/3 nodes are available: Insufficient cpu")
    rec.event(pod, "Warning", "FailedScheduling", "binding to n1: conflict")
    rec.event(pod, "Warning", "GangIncomplete", "2 of 4 members")
    await rec.drain()
    counts = sorted((o[1], o[3]) for o in sink.objects.values())
    assert counts == [("FailedScheduling", 1), ("FailedScheduling", 2), ("GangIncomplete", 1)]


async def test_new_event_objects_are_rate_limited_per_pod() -> None:
    sink = Sink()
    rec = EventRecorder(sink, interval_s=0.01, per_pod_burst=5, per_pod_refill_s=3600)
    a, b = pods(2)
    for i in range(50):
        rec.event(a, "Warning", "FailedScheduling", f"story {chr(65 + i % 26)}{chr(97 + i // 26)}")
    rec.event(b, "Warning", "FailedScheduling", "its own")
    await rec.drain()
    per_pod = [o[0] for o in sink.objects.values()]
    assert per_pod.count("p0") == 5
    assert per_pod.count("p1") == 1, "another pod has its own budget"


async def test_series_end_after_silence_and_memory_stays_bounded() -> None:
    now = [0.0]
    sink = Sink()
    rec = EventRecorder(
        sink, interval_s=0.01, series_idle_s=360, max_series=100, clock=lambda: now[0]
    )
    for pod in pods(1000):
        rec.event(pod, "Warning", "FailedScheduling", "0/3 nodes are available")
    await rec.drain()
    assert len(rec.series) <= 100
    (first,) = pods(1)
    now[0] = 400.0  # silent past the series' end: the next occurrence is a new Event
    rec.event(first, "Warning", "FailedScheduling", "0/3 nodes are available")
    await rec.drain()
    assert sum(1 for o in sink.objects.values() if o[0] == "p0") == 2


async def test_an_unreachable_apiserver_loses_no_count_once_it_is_back() -> None:
    sink = Sink(fail=True)
    rec = EventRecorder(sink, interval_s=0.01)
    (pod,) = pods(1)
    rec.event(pod, "Warning", "FailedScheduling", "0/3 nodes are available")
    await rec.drain()
    assert not sink.objects
    sink.fail = False
    for _ in range(3):
        rec.event(pod, "Warning", "FailedScheduling", "0/3 nodes are available")
    await rec.drain()
    assert [o[3] for o in sink.objects.values()] == [4]


async def test_close_ends_every_write_task_and_nothing_is_written_after() -> None:
    sink = Sink()
    rec = EventRecorder(sink, interval_s=3600)
    (pod,) = pods(1)
    rec.event(pod, "Warning", "FailedScheduling", "0/3 nodes are available")
    await rec.drain()
    rec.event(pod, "Warning", "FailedScheduling", "0/3 nodes are available")
    assert rec.pending, "the repeat waits for its series' next write"
    writes = sink.writes
    await asyncio.wait_for(rec.close(), 5)  # not the hour the series would sleep
    assert not rec.pending
    rec.event(pod, "Warning", "FailedScheduling", "0/3 nodes are available")
    rec.event(pod, "Warning", "Other", "new story")
    await asyncio.sleep(0)
    assert not rec.pending
    assert sink.writes == writes, "nothing writes on a closed client"
