"""SchedulingGates: a pod with spec.schedulingGates waits until they are removed."""

from __future__ import annotations

from ..framework import OK, CycleState, Status, fail
from ..model import Pod

NAME = "SchedulingGates"


class SchedulingGates:
    NAME = NAME

    def pre_filter(self, cs: CycleState, pod: Pod) -> Status:
        if pod.scheduling_gates:
            return fail(f"waiting for scheduling gates {list(pod.scheduling_gates)}")
        return OK


def new() -> SchedulingGates:
    return SchedulingGates()
