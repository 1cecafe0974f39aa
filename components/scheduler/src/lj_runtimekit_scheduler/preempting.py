"""Carrying out a preemption DefaultPreemption decided (``plugins/default_preemption.py``): the
nominations in the state and on the pods, the victims marked and deleted, their Events. The
apiserver is reached only through the :class:`Evictor` (``kube.py``)."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, Protocol

import structlog

from .errors import SchedulerError
from .gpu import Choice
from .metrics import Metrics
from .model import Pod
from .plugins.default_preemption import Outcome
from .queue import SchedulingQueue
from .state import ClusterState, Nomination

log = structlog.get_logger("lj_runtimekit_scheduler.preempting")

Placement = tuple[Pod, str, Choice | None]
"""A pod nominated to a node, with the devices it gets there."""


class Evictor(Protocol):
    """The apiserver writes of a preemption (implemented in ``kube.py``)."""

    async def nominate(self, pod: Pod, node: str | None) -> None:
        """Set (None: clear) the pod's ``status.nominatedNodeName``."""
        ...

    async def preempt(self, victim: Pod, by: Pod) -> None:
        """Mark ``victim`` with the DisruptionTarget condition, then delete it gracefully (one
        already gone is fine)."""
        ...


class _Recorder(Protocol):
    def event(self, pod: Pod, kind: str, reason: str, message: str) -> None: ...


Spawn = Callable[[str, Coroutine[Any, Any, None]], object]


class Preempting:
    def __init__(
        self,
        state: ClusterState,
        *,
        queue: SchedulingQueue,
        recorder: _Recorder,
        metrics: Metrics,
        evictor: Evictor | None,
        spawn: Spawn,
        poke: Callable[[], None],
        clock: Callable[[], float],
    ) -> None:
        self.state, self.queue, self.recorder, self.metrics = state, queue, recorder, metrics
        self.evictor = evictor
        """None: preemption is decided but not carried out (a scheduler without the writes)."""
        self.spawn, self.poke, self.clock = spawn, poke, clock

    def keep_or_clear(
        self, pods: list[Pod], lifted: dict[str, Nomination], outcome: Outcome | None
    ) -> None:
        """After a cycle that did not preempt: the nominations lifted for it come back, unless
        preemption found it cannot help (then they are cleared, on the pods too)."""
        for pod in pods:
            n = lifted.get(pod.uid)
            if outcome is None or self.evictor is None:
                if n is not None:
                    self.state.nominate(n.pod, n.node, n.choice)
            elif n is not None or pod.nominated_node:
                self.spawn(f"unnominate-{pod.key}", self._nominate(pod, None))

    def carry_out(self, placements: list[Placement], victims: tuple[Pod, ...]) -> None:
        """Nominate ``placements``, end the nominations of lower-priority pods on those nodes
        (they may fit elsewhere: tried again at once, as kube-scheduler does), and evict
        ``victims`` in the background."""
        uids = {p.uid for p, _, _ in placements}
        nodes = {n for _, n, _ in placements}
        low = min(p.priority for p, _, _ in placements)
        cleared = [
            n.pod
            for node in nodes
            for n in list(self.state.nominated_on.get(node, {}).values())
            if n.pod.priority < low and n.pod.uid not in uids
        ]
        for p in cleared:
            self.state.unnominate(p.uid)
            if (queued := self.queue.get(p.uid)) is not None:
                self.queue.add(queued, self.clock())
        for pod, node, choice in placements:
            self.state.nominate(pod, node, choice)
        on = {v.uid: self.state.pods[v.uid][1] for v in victims if v.uid in self.state.pods}
        self.state.evicting.update(on)
        self.metrics.preempted(len(victims))
        log.info(
            "preempting",
            pods=[p.key for p, _, _ in placements],
            nodes=sorted(nodes),
            victims=[v.key for v in victims],
        )
        self.spawn(f"preempt-{placements[0][0].key}", self._evict(placements, victims, on, cleared))

    async def _nominate(self, pod: Pod, node: str | None) -> None:
        assert self.evictor is not None
        try:
            await self.evictor.nominate(pod, node)
        except SchedulerError as e:
            log.warning("nomination_not_written", pod=pod.key, node=node, error=str(e)[:300])

    async def _evict(
        self,
        placements: list[Placement],
        victims: tuple[Pod, ...],
        on: dict[str, str],
        cleared: list[Pod],
    ) -> None:
        assert self.evictor is not None
        for pod, node, _ in placements:
            await self._nominate(pod, node)
        for pod in cleared:
            await self._nominate(pod, None)
        by_node = {node: pod for pod, node, _ in placements}
        for i, v in enumerate(victims):
            node = on.get(v.uid, placements[0][1])
            by = by_node.get(node, placements[0][0])
            try:
                if not v.deleting:  # graceful deletion already under way: nothing to send
                    await self.evictor.preempt(v, by)
            except SchedulerError as e:
                log.warning("preemption_failed", pod=by.key, victim=v.key, error=str(e)[:300])
                for rest in victims[i:]:
                    self.state.evicting.discard(rest.uid)
                for pod, _, _ in placements:  # tried again after its backoff
                    self.state.unnominate(pod.uid)
                    self.queue.failed(pod.uid, self.clock(), unschedulable=False)
                self.poke()
                return
            self.recorder.event(
                v, "Normal", "Preempted", f"Preempted by pod {by.uid} on node {node}"
            )
