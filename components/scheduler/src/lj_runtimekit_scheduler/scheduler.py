"""The scheduling loop: pop a pod (or a whole gang), run the cycle, assume, bind in the
background. The apiserver is reached only through the :class:`Binder` and :class:`Recorder`."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import replace
from typing import Any, Protocol

import structlog

from . import gang, preemption
from .errors import SchedulerError
from .framework import Binder, CycleState, Profile, Result, fail
from .gpu import Choice
from .metrics import Metrics
from .model import POD_GROUP_SIZE_ANNOTATION, Pod, PodGroup
from .plugins import allocate_handshake, default_preemption
from .preempting import Evictor, Preempting
from .queue import SchedulingQueue
from .settings import Settings
from .state import ClusterState, Nomination

log = structlog.get_logger("lj_runtimekit_scheduler.scheduler")

_UNBOUNDED = 1 << 62
"""A node in DRA mode's room for our device resources in a gang's domain check."""


class Recorder(Protocol):
    def event(self, pod: Pod, kind: str, reason: str, message: str) -> None: ...


class GroupStatus(Protocol):
    """Where a PodGroup's ``PodGroupInitiallyScheduled`` condition is written (``kube.py``)."""

    async def pod_group_condition(
        self, group: PodGroup, scheduled: bool, reason: str, message: str
    ) -> None: ...


def summary(result: Result, nodes: int) -> str:
    """kube-scheduler's shape: ``0/3 nodes are available: 2 Insufficient cpu, 1 ...``, then
    what PostFilter said (``preemption: ...``)."""
    if "*" in result.reasons:
        return result.reasons["*"]
    counts = Counter(result.reasons.values())
    parts = [f"{n} {r}" for r, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:8]]
    more = "" if len(counts) <= 8 else f", and {len(counts) - 8} other reasons"
    out = f"0/{nodes} nodes are available: " + ", ".join(parts) + more + "."
    return f"{out} {result.post_filter}" if result.post_filter else out


class Scheduler:
    def __init__(
        self,
        settings: Settings,
        *,
        state: ClusterState,
        queue: SchedulingQueue,
        profile: Profile,
        binder: Binder,
        recorder: Recorder,
        metrics: Metrics,
        evictor: Evictor | None = None,
        groups: GroupStatus | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings, self.state, self.queue, self.profile = settings, state, queue, profile
        self.binder, self.recorder, self.metrics, self.clock = binder, recorder, metrics, clock
        self.preempting = Preempting(
            state,
            queue=queue,
            recorder=recorder,
            metrics=metrics,
            evictor=evictor,
            spawn=self._spawn,
            poke=self.poke,
            clock=self._now,
        )
        """Carries out preemptions (with no ``evictor``: DefaultPreemption decides, nothing is
        done)."""
        self.preemption = next(
            (p for p in profile.post_filter if isinstance(p, default_preemption.DefaultPreemption)),
            None,
        )
        self.wakeup = asyncio.Event()
        self.binding: set[asyncio.Task[None]] = set()
        self.gang_waiting: dict[str, float | None] = {}
        """Incomplete gangs: when first seen waiting; None once warned it is overdue."""
        self.size_warned: dict[str, frozenset[int]] = {}
        """Gang members told their gang's members disagree on its size: uid → the sizes."""
        self.handshake = allocate_handshake.NAME in profile.names
        self.groups = groups
        """Writes PodGroup conditions as kube-scheduler does (None: not written)."""
        self.group_said: dict[str, tuple[bool, str]] = {}
        """PodGroup → the condition last written (each is written once, not at every try)."""
        self._moved = asyncio.Event()
        """Set (and replaced) on every poke: binds waiting for a confirmation look again."""
        self.stopping = False

    def _now(self) -> float:
        return self.clock()  # read at each call: a test may replace the clock

    def poke(self) -> None:
        self.wakeup.set()
        self._moved.set()
        self._moved = asyncio.Event()

    async def run(self, stop: asyncio.Event) -> None:
        next_depth = 0.0
        self.stopping = False
        while not stop.is_set():
            now = self.clock()
            self.state.expire(now)
            pod = self.queue.pop(now)
            if pod is None:
                self.metrics.queue_depth(self.queue.depth())
                nxt = self.queue.next_ready()
                timeout = 1.0 if nxt is None else max(0.001, min(1.0, nxt - now))
                self.wakeup.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wakeup.wait(), timeout)
                continue
            self.schedule(pod)
            if now >= next_depth:  # the gauge walks the queue: a few times a second is plenty
                self.metrics.queue_depth(self.queue.depth())
                next_depth = now + 0.25
            await asyncio.sleep(0)  # let watches and bindings progress
        self.stopping = True
        self.state.storage.stop()  # a pod waiting for its volumes at PreBind gives up
        self.poke()
        await self.drain()

    async def drain(self) -> None:
        if self.binding:
            await asyncio.gather(*self.binding, return_exceptions=True)

    # -- one cycle
    def schedule(self, pod: Pod) -> None:
        gid = gang.gang_of(pod)
        group = self.state.group_of(gid)
        if gid is not None and gid.group and group is None:
            # kube-scheduler too keeps it pending until its PodGroup exists (it says nothing)
            msg = f"waiting for PodGroup {gid.group} (spec.schedulingGroup) to exist; nothing held"
            self._unschedulable(pod, Result(None, {}), msg)
            return
        if group is not None and group.parent:
            # all or nothing across the composite's groups: placing this group alone breaks it
            msg = (
                f"UnsupportedFeatures: not supported by {self.settings.scheduler_name}: PodGroup "
                f"{group.key} is part of CompositePodGroup {group.parent} "
                "(spec.parentCompositePodGroupName, alpha) (use the default scheduler for this pod)"
            )
            self._unschedulable(pod, Result(None, {}), msg)
            return
        if gid is not None and (group is None or group.gang):
            self.schedule_gang(pod, gid, group)
            return
        if (why := gang.invalid_size(pod)) is not None:
            self.recorder.event(pod, "Warning", "InvalidGangSize", why)
        t0 = time.perf_counter()
        cs = CycleState()
        # its own nomination is lifted for the cycle: a pod does not leave room for itself
        lifted = self.state.unnominate(pod.uid)
        if lifted is not None:
            cs.write(default_preemption.NOMINATED, lifted.node)
        placed = self._try(cs, pod, None)
        if isinstance(placed, Result):
            outcome = cs.read(default_preemption.OUTCOME)
            if outcome is not None and outcome.candidate and self.preempting.evictor:
                c = outcome.candidate
                self.preempting.carry_out([(pod, c.node, c.choice)], c.victims.pods)
            else:
                self.preempting.keep_or_clear([pod], {pod.uid: lifted} if lifted else {}, outcome)
            self._unschedulable(pod, placed)
        else:
            self._bind_later([(pod, placed, cs)], t0, group)

    def _try(
        self, cs: CycleState, pod: Pod, names: list[str] | None, post_filter: bool = True
    ) -> str | Result:
        """Find a node and reserve it (assumed in the state), or the failing result."""
        result = self.profile.find_node(cs, pod, self.state, names, post_filter=post_filter)
        if result.node is None:
            return result
        st = self.profile.reserve_all(cs, pod, result.node)
        if not st.ok:
            return Result(None, {"*": st.reason})
        choice = cs.chosen(result.node)
        self.state.assume(pod, result.node, choice, float("inf"))
        st = self.profile.permit_all(cs, pod, result.node)
        if not st.ok:
            self._undo(cs, pod, result.node)
            return Result(None, {"*": st.reason})
        return result.node

    def _undo(self, cs: CycleState, pod: Pod, node: str) -> None:
        self.state.forget(pod.uid)
        self.profile.unreserve_all(cs, pod, node)

    def _unschedulable(self, pod: Pod, result: Result, message: str | None = None) -> None:
        msg = message or summary(result, len(self.state.nodes))
        self.metrics.attempt("unschedulable")
        self.queue.failed(pod.uid, self.clock(), unschedulable=True)
        self.recorder.event(pod, "Warning", "FailedScheduling", msg)
        log.info("pod_unschedulable", pod=pod.key, reason=msg)

    def schedule_gang(self, first: Pod, gid: gang.GangId, group: PodGroup | None = None) -> None:
        """Place the gang of ``first`` all or nothing; a PodGroup's (``group``) at least
        ``minCount`` of its pods, counting those already placed."""
        members = [first] + [p for p in self.queue.gang_members(gid) if p.uid != first.uid]
        placed = self.state.gangs.get(gid, {})
        held = list(placed.values())
        if group is None:
            size = self._agreed_size(gid, members, [self.state.pods[u][0] for u in placed])
            gid = replace(gid, size=size)
        else:
            gid = replace(gid, size=group.min_count, topology=group.topology)
        missing = gid.size - len(held) - len(members)
        if missing > 0:
            # only the pod just tried is told: the others were when they were tried, and telling
            # every member at every arrival would be n² Events for an n-pod gang
            msg = f"gang {gid.key}: waiting for {missing} more of {gid.size} members; nothing held"
            self._unschedulable(first, Result(None, {}), msg)
            self._overdue(first, gid, gid.size - missing)
            return
        if self.gang_waiting.pop(gid.key, 0.0) is None:
            self._count_overdue()
        lifted = {p.uid: x for p in members if (x := self.state.unnominate(p.uid)) is not None}
        t0 = time.perf_counter()
        labels = {n: i.node.label_map() for n, i in self.state.nodes.items()}
        # a PodGroup with more pods than minCount may place fewer: no sum to check then
        partial = group is not None and len(members) > gid.size - len(held)
        need, free = self._room([] if partial else members)
        every = gang.domains(labels, self.settings.topology_labels, gid.topology, held)
        candidates = [names for names in every if gang.may_hold(need, [free[n] for n in names])]
        states: dict[str, CycleState] = {}
        last: list[Result] = []

        def place(p: Pod, names: list[str]) -> str | None:
            cs = states[p.uid] = CycleState()
            out = self._try(cs, p, names, post_filter=False)  # a gang preempts as a whole
            if isinstance(out, Result):
                last[:] = [out]
                return None
            return out

        def undo(p: Pod) -> None:
            self._undo(states[p.uid], p, self.state.pods[p.uid][1])

        at_least = None if group is None else gid.size - len(held)
        placement = gang.place_gang(members, candidates, place, undo, at_least)
        for p in members:
            self.queue.take(p.uid)
        if placement is None:
            why = summary(last[0], len(self.state.nodes)) if last else ""
            if not why and self.state.nodes:
                asked = ", ".join(f"{r}={v}" for r, v in sorted(need.items()) if v)
                why = f"no domain has the free capacity for the members' sum ({asked})"
            self._unplaced(gid, group, members, (every, held), lifted=lifted, why=why or "no nodes")
            return
        left = [p for p in members if p.uid not in placement]
        if left:
            self._left_behind(gid, left, len(placement) + len(held), last, lifted)
        done = [p for p in members if p.uid in placement]
        self._bind_later([(p, placement[p.uid], states[p.uid]) for p in done], t0, group)

    def _unplaced(
        self,
        gid: gang.GangId,
        group: PodGroup | None,
        members: list[Pod],
        where: tuple[list[list[str]], list[str]],
        *,
        lifted: dict[str, Nomination],
        why: str,
    ) -> None:
        """A gang that fits in no domain: it preempts as a whole, or all its pods wait (told
        why; a PodGroup's condition says it too)."""
        every, held = where
        msg = f"gang {gid.key} of {len(members)} does not fit in any one domain: {why}"
        if group is not None:
            msg = (
                f"gang {gid.key}: minCount ({gid.size}) cannot be satisfied: {len(held)} "
                f"scheduled, {len(members)} pending do not fit in any one domain: {why}"
            )
        if said := self._preempt_gang(members, every, held, lifted):
            msg = f"{msg} preemption: {said}"
        for p in members:
            self._unschedulable(p, Result(None, {}), msg)
        if group is not None:
            self._say_group(group, False, msg)

    def _room(self, members: list[Pod]) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
        """What ``members`` ask in sum, and each node's free capacity (a gang's domain check)."""
        need: dict[str, int] = {}
        for p in members:
            for r, v in p.requests.items():
                need[r] = need.get(r, 0) + v
        free = {
            n: {r: a - i.requested.get(r, 0) for r, a in i.node.allocatable.items()}
            for n, i in self.state.nodes.items()
        }
        for n, room in free.items():
            if self.state.dra.serves(n):  # no advertised devices there: GpuFit checks each
                room.update(dict.fromkeys(self.state.names.all, _UNBOUNDED))
        return need, free

    def _left_behind(
        self,
        gid: gang.GangId,
        left: list[Pod],
        placed: int,
        last: list[Result],
        lifted: dict[str, Nomination],
    ) -> None:
        """Pods of a PodGroup placed without them (its minCount met): pending, tried again."""
        why = summary(last[0], len(self.state.nodes)) if last else "no room"
        msg = (
            f"gang {gid.key}: {placed} of its pods are placed (minCount {gid.size}); this one "
            f"fits in no node beside them yet: {why}"
        )
        for p in left:
            self._unschedulable(p, Result(None, {}), msg)
        self.preempting.keep_or_clear(left, lifted, None)

    # -- preemption (plugins/default_preemption.py decides, preempting.py carries it out)
    def _preempt_gang(
        self,
        members: list[Pod],
        domains: list[list[str]],
        held: list[str],
        lifted: dict[str, Nomination],
    ) -> str:
        """A gang that fits nowhere preempts as a whole, or not at all; what FailedScheduling
        adds (empty: it preempted, or preemption is off)."""
        if self.preemption is None or self.preempting.evictor is None or held:
            self.preempting.keep_or_clear(members, lifted, None)
            return ""
        found, why = self.preemption.preempt_gang(
            members, domains, self.profile, {u: n.node for u, n in lifted.items()}
        )
        if found is not None:
            self.preempting.carry_out(list(found.placements), found.victims.pods)
            return ""
        ineligible = why in (preemption.NEVER, preemption.TERMINATING)
        outcome = None if ineligible else default_preemption.Outcome(None)
        self.preempting.keep_or_clear(members, lifted, outcome)
        return why

    def _spawn(self, name: str, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(coro, name=name)
        self.binding.add(task)
        task.add_done_callback(self.binding.discard)
        return task

    def _agreed_size(self, gid: gang.GangId, queued: list[Pod], bound: list[Pod]) -> int:
        """The gang's size by :data:`gang.SIZE_RULE`; when its members disagree, each of them
        gets a ``GangSizeConflict`` Warning naming the sizes and the rule (once per member and
        set of sizes, not at every try)."""
        size, sizes = gang.agreed_size([*queued, *bound])
        if len(sizes) < 2:
            return size
        seen = frozenset(sizes)
        if len(self.size_warned) > 10_000:  # members deleted since: forget them all
            self.size_warned.clear()
        msg = gang.size_conflict(gid.key, sizes)
        told = [p for p in (*queued, *bound) if self.size_warned.get(p.uid) != seen]
        for pod in told:
            self.size_warned[pod.uid] = seen
            self.recorder.event(pod, "Warning", "GangSizeConflict", msg)
        if told:
            log.warning("gang_size_conflict", gang=gid.key, sizes=sorted(sizes), applied=size)
        return size

    def _overdue(self, pod: Pod, gid: gang.GangId, present: int) -> None:
        """Warn once when a gang has waited ``gang_timeout_s`` for members that may never come
        (a size that does not match the Job's pods, a member that cannot be created)."""
        now = self.clock()
        if len(self.gang_waiting) > 10_000:  # gangs deleted while incomplete: forget them all
            self.gang_waiting.clear()
            self._count_overdue()
        since = self.gang_waiting.setdefault(gid.key, now)
        if since is None or now - since < self.settings.gang_timeout:
            return
        self.gang_waiting[gid.key] = None
        msg = (
            f"gang {gid.key} has {present} of {gid.size} members after "
            f"{self.settings.gang_timeout:g} s; nothing is held while it waits; check its "
            f"size ({POD_GROUP_SIZE_ANNOTATION} or {gang.JOBSET_REPLICAS})"
        )
        if gid.group:
            msg = (
                f"gang {gid.key} has {present} of minCount {gid.size} pods after "
                f"{self.settings.gang_timeout:g} s; nothing is held while it waits; check the "
                f"PodGroup {gid.group}'s minCount and the pods naming it"
            )
        self.recorder.event(pod, "Warning", "GangIncomplete", msg)
        self._count_overdue()
        log.warning("gang_incomplete", gang=gid.key, present=present, size=gid.size)

    def _count_overdue(self) -> None:
        self.metrics.gangs_overdue(sum(1 for since in self.gang_waiting.values() if since is None))

    def _bind_later(
        self, items: list[tuple[Pod, str, CycleState]], t0: float, group: PodGroup | None = None
    ) -> None:
        after: list[list[str]] = [[] for _ in items]
        if self.handshake:
            placed = [(pod, node) for pod, node, _ in items]
            confirming = {n for n in self.state.confirming if not self.state.dra.serves(n)}
            after = allocate_handshake.bind_after(placed, confirming)
            self._after_placed(items, after, confirming)
        binds = [
            self._spawn(f"bind-{pod.key}", self._bind(pod, node, cs, t0, wait_for))
            for (pod, node, cs), wait_for in zip(items, after, strict=True)
        ]
        if group is not None and not group.scheduled and self.groups is not None:
            self._spawn(f"podgroup-{group.key}", self._scheduled(group, binds, items))

    def _after_placed(
        self, items: list[tuple[Pod, str, CycleState]], after: list[list[str]], confirming: set[str]
    ) -> None:
        """A gang member placed after others of its gang (its binding failed, or a PodGroup's pod
        beyond minCount) also waits for those still pending on its node with a same request:
        AllocateHandshake lets a gang's members share a node unconfirmed, the binds keep them
        apart."""
        uids = {pod.uid for pod, _, _ in items}
        for i, (pod, node, _) in enumerate(items):
            gid = gang.gang_of(pod)
            info = self.state.nodes.get(node)
            if gid is None or info is None or node not in confirming:
                continue
            mine = allocate_handshake.units_of(pod)
            after[i] += [
                u
                for u, p in info.pending.items()
                if u not in uids and p.gang == gid and p.units & mine
            ]

    async def _scheduled(
        self,
        group: PodGroup,
        binds: Sequence[asyncio.Task[None]],
        items: list[tuple[Pod, str, CycleState]],
    ) -> None:
        """Once the binds of a placement are through: the PodGroup's requirement is met when
        every pod of it bound (kube-scheduler writes this condition the same way)."""
        await asyncio.gather(*binds, return_exceptions=True)
        if all(self.queue.get(p.uid) is None and p.uid in self.state.pods for p, _, _ in items):
            self._say_group(group, True, "")

    def _say_group(self, group: PodGroup, scheduled: bool, message: str) -> None:
        """Write the PodGroup's ``PodGroupInitiallyScheduled`` condition once per change (True
        is terminal: nothing is written after it)."""
        if self.groups is None or group.scheduled:
            return
        latest = self.state.pod_groups.get(group.key)
        if latest is not None and latest.scheduled:
            return
        said = (scheduled, message)
        if self.group_said.get(group.key) in (said, (True, "")):
            return
        if len(self.group_said) > 10_000:  # groups deleted since: forget them all
            self.group_said.clear()
        self.group_said[group.key] = said
        self._spawn(f"podgroup-status-{group.key}", self._write_group(group, scheduled, message))

    async def _write_group(self, group: PodGroup, scheduled: bool, message: str) -> None:
        assert self.groups is not None
        reason = "Scheduled" if scheduled else "Unschedulable"
        try:
            await self.groups.pod_group_condition(group, scheduled, reason, message)
        except SchedulerError as e:
            self.group_said.pop(group.key, None)  # written at the next try
            log.warning("pod_group_status_not_written", group=group.key, error=str(e)[:300])

    async def _confirmed(self, uids: Sequence[str]) -> str | None:
        """Wait until none of ``uids`` is pending on its node (confirmed by the device plugin,
        or gone); the first one still pending after ``confirm_timeout_s``, else None."""
        deadline = self.clock() + self.settings.confirm_timeout
        while True:
            waiting = [u for u in uids if self.state.is_pending(u)]
            if not waiting:
                return None
            left = deadline - self.clock()
            if left <= 0 or self.stopping:
                return waiting[0]
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._moved.wait(), min(1.0, left))

    async def _bind(
        self, pod: Pod, node: str, cs: CycleState, t0: float, after: Sequence[str] = ()
    ) -> None:
        if after and (late := await self._confirmed(after)) is not None:
            # give this member back: it rejoins its placed members' domain when tried again
            other = self.state.pods[late][0].key if late in self.state.pods else late
            self._undo(cs, pod, node)
            self.metrics.attempt("error")
            self.queue.failed(pod.uid, self.clock(), unschedulable=False)
            msg = (
                f"not bound to {node}: the device plugin there did not confirm pod {other}'s "
                f"devices (same request) within {self.settings.confirm_timeout:g} s"
            )
            self.recorder.event(pod, "Warning", "FailedScheduling", msg)
            log.warning("pod_bind_abandoned", pod=pod.key, node=node, waited_for=other)
            return
        try:
            st = await self.profile.bind_all(cs, pod, node, self.binder)
        except Exception as e:
            # the framework's own bug (bind_all turns a plugin's into a Status): the pod must not
            # stay assumed (its deadline is not set yet), unseen
            log.exception("pod_bind_crashed", pod=pod.key, node=node)
            st = fail(f"unexpected error, see the scheduler's log: {e!r}"[:500])
        if not st.ok:
            # kube-scheduler's Event for a failed binding cycle: FailedScheduling with the
            # plugin's error; the recorder counts a retried bind's repeats in one Event
            self._undo(cs, pod, node)
            self.metrics.attempt("error")
            self.queue.failed(pod.uid, self.clock(), unschedulable=False)
            msg = f"binding to {node}: {st.reason}"
            self.recorder.event(pod, "Warning", "FailedScheduling", msg)
            log.warning("pod_bind_failed", pod=pod.key, node=node, error=st.reason)
            self.poke()
            return
        if pod.uid in self.state.assumed:  # the watch may have confirmed it already
            self.state.assumed[pod.uid] = self.clock() + self.settings.assume_ttl
        self.queue.done(pod.uid)
        self.metrics.attempt("scheduled")
        self.metrics.e2e(time.perf_counter() - t0)
        self.recorder.event(
            pod, "Normal", "Scheduled", f"Successfully assigned {pod.key} to {node}"
        )
        log.debug("pod_bound", pod=pod.key, node=node)


__all__ = ["Choice", "Scheduler", "summary"]
