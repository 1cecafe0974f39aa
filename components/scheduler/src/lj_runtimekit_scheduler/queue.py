"""The scheduling queue: active (by priority, then age), backoff, and unschedulable pods.

Pure: the caller passes the time. A pod that failed waits its backoff (initial × 2^attempts,
capped); a pod no node fits is parked as unschedulable until a cluster event that could help
(:meth:`SchedulingQueue.cluster_changed`) or the periodic retry moves it back. As kube-scheduler's
(KEP-5142, ``SchedulerPopFromBackoffQ``, on since 1.33), a pod an event moved from unschedulable
to its backoff is tried before its backoff ends when no other pod is active.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, replace

from .gang import GangId, gang_of
from .model import Pod


@dataclass
class _Entry:
    pod: Pod
    attempts: int = 0
    ready_at: float = 0.0
    parked_at: float | None = None


class SchedulingQueue:
    def __init__(
        self,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 10.0,
        unschedulable_retry_s: float = 60.0,
    ) -> None:
        self.initial = backoff_initial_s
        self.max = backoff_max_s
        self.retry = unschedulable_retry_s
        self._entries: dict[str, _Entry] = {}
        self._heap: list[tuple[int, float, int, str]] = []
        self._in_heap: set[str] = set()
        self._seq = itertools.count()
        self.in_flight: set[str] = set()
        self._gangs: dict[GangId, dict[str, None]] = {}
        """gang → its members in the queue (insertion-ordered), so a gang's cycle finds them
        without walking every pending pod."""
        self._next = float("inf")
        """No waiting pod becomes ready before this (keeps pop O(log n))."""
        self._want_pods: set[str] = set()
        """Parked pods with required pod affinity: a pod placed anywhere may let them fit."""
        self._moved: set[str] = set()
        """Unschedulable pods an event unparked whose backoff has not ended: the ones
        :meth:`pop` may take early when nothing is active."""

    def __len__(self) -> int:
        return len(self._entries)

    def depth(self) -> dict[str, int]:
        """Pods per sub-queue, for the queue-depth metric."""
        parked = sum(1 for e in self._entries.values() if e.parked_at is not None)
        active = len(self._in_heap)
        return {
            "active": active,
            "unschedulable": parked,
            "backoff": len(self._entries) - active - parked - len(self.in_flight),
        }

    def _push(self, uid: str, now: float) -> None:
        e = self._entries[uid]
        e.parked_at = None
        self._want_pods.discard(uid)
        self._moved.discard(uid)
        if uid not in self._in_heap and uid not in self.in_flight:
            heapq.heappush(self._heap, (-e.pod.priority, now, next(self._seq), uid))
            self._in_heap.add(uid)

    def add(self, pod: Pod, now: float) -> None:
        """A new or changed pending pod; a change makes a parked pod eligible at once (but its
        ``nominatedNodeName``, which the scheduler itself writes)."""
        e = self._entries.get(pod.uid)
        if e is None:
            self._entries[pod.uid] = _Entry(pod)
            self._join(pod)
            self._push(pod.uid, now)
            return
        if e.pod.annotations != pod.annotations or e.pod.labels != pod.labels:
            self._leave(e.pod)
            self._join(pod)
        # its nomination written back (a status change) is no reason to try it again now
        moved = replace(e.pod, nominated_node=pod.nominated_node) != pod
        e.pod = pod
        if e.parked_at is not None and moved:
            e.ready_at = now
            e.parked_at = None
            self._next = now

    def delete(self, uid: str) -> None:
        e = self._entries.pop(uid, None)
        if e is not None:
            self._leave(e.pod)
        self._in_heap.discard(uid)
        self.in_flight.discard(uid)
        self._want_pods.discard(uid)
        self._moved.discard(uid)

    def _join(self, pod: Pod) -> None:
        if (gid := gang_of(pod)) is not None:
            self._gangs.setdefault(gid, {})[pod.uid] = None

    def _leave(self, pod: Pod) -> None:
        if (gid := gang_of(pod)) is not None and (members := self._gangs.get(gid)) is not None:
            members.pop(pod.uid, None)
            if not members:
                del self._gangs[gid]

    def gang_members(self, gid: GangId) -> list[Pod]:
        """The pods of gang ``gid`` in the queue, whatever their sub-queue (or in flight)."""
        return [self._entries[u].pod for u in self._gangs.get(gid, ())]

    def get(self, uid: str) -> Pod | None:
        e = self._entries.get(uid)
        return None if e is None else e.pod

    def take(self, uid: str) -> None:
        """Mark a pod in flight without popping it (gang members scheduled together).

        A member parked as unschedulable (it waited for the rest of its gang) leaves the parked
        pods: else the next cluster change would unpark it while its binding is in flight, and
        its gang would be placed a second time over the first placement."""
        if (e := self._entries.get(uid)) is not None:
            e.parked_at = None
            self._want_pods.discard(uid)
            self._in_heap.discard(uid)
            self._moved.discard(uid)
            self.in_flight.add(uid)

    def pop(self, now: float) -> Pod | None:
        """The most urgent active pod (marked in flight), or None."""
        self.flush(now)
        while self._heap:
            _, _, _, uid = heapq.heappop(self._heap)
            if uid not in self._in_heap:
                continue
            self._in_heap.discard(uid)
            self.in_flight.add(uid)
            return self._entries[uid].pod
        return self._pop_moved()

    def _pop_moved(self) -> Pod | None:
        """Nothing is active: the moved pod whose backoff ends first (priority first within
        one second, as upstream orders its backoff windows), marked in flight; or None."""
        if not self._moved:
            return None

        def order(uid: str) -> tuple[int, int, float]:
            e = self._entries[uid]
            return int(e.ready_at), -e.pod.priority, e.ready_at

        uid = min(self._moved, key=order)
        self._moved.discard(uid)
        self.in_flight.add(uid)
        return self._entries[uid].pod

    def done(self, uid: str) -> None:
        """The pod was bound: it leaves the queue."""
        self.delete(uid)

    def failed(self, uid: str, now: float, unschedulable: bool) -> float:
        """Back off (or park) a pod whose attempt failed; returns when it may run again."""
        self.in_flight.discard(uid)
        self._moved.discard(uid)
        e = self._entries.get(uid)
        if e is None:
            return now
        e.attempts += 1
        e.ready_at = now + min(self.max, self.initial * 2 ** (e.attempts - 1))
        e.parked_at = now if unschedulable else None
        if unschedulable and e.pod.affinity.required:
            self._want_pods.add(uid)
        self._next = min(self._next, now + self.retry if unschedulable else e.ready_at)
        return e.ready_at

    def pod_placed(self, now: float) -> int:
        """A pod started holding a node: unpark the pods whose required pod affinity may be
        met by it (the rest stay parked); returns how many moved."""
        moved = 0
        for uid in self._want_pods:
            e = self._entries.get(uid)
            if e is not None and e.parked_at is not None and uid not in self.in_flight:
                e.parked_at = None
                moved += 1
                if e.ready_at > now:
                    self._moved.add(uid)
        self._want_pods.clear()
        if moved:
            self._next = now
        return moved

    def cluster_changed(self, now: float) -> int:
        """Something that may help (a node added or changed, a pod gone): unpark all (each
        active once its backoff ends, or earlier when no other pod is)."""
        moved = 0
        for uid, e in self._entries.items():
            if e.parked_at is not None and uid not in self.in_flight:
                e.parked_at = None
                moved += 1
                if e.ready_at > now:
                    self._moved.add(uid)
        self._want_pods.clear()
        self._next = now
        return moved

    def flush(self, now: float) -> None:
        """Move pods whose backoff ended, or parked too long, into the active heap."""
        if now < self._next:
            return
        for uid, e in self._entries.items():
            if uid in self._in_heap or uid in self.in_flight:
                continue
            if e.parked_at is not None:
                if now - e.parked_at >= self.retry:
                    self._push(uid, now)
            elif e.ready_at <= now:
                self._push(uid, now)
        nr = self.next_ready()
        self._next = float("inf") if nr is None else nr

    def next_ready(self) -> float | None:
        """The earliest time a waiting pod becomes active (None: nothing waits)."""
        times = [
            e.parked_at + self.retry if e.parked_at is not None else e.ready_at
            for uid, e in self._entries.items()
            if uid not in self._in_heap and uid not in self.in_flight
        ]
        return min(times, default=None)
