"""UnsupportedFeatures: refuse, loudly, a pod that relies on what this scheduler does not
implement (DRA, a scheduling group that is not a PodGroup) instead of placing it wrongly."""

from __future__ import annotations

from ..framework import OK, CycleState, Status, fail
from ..model import Pod

NAME = "UnsupportedFeatures"


class UnsupportedFeatures:
    NAME = NAME

    def pre_filter(self, cs: CycleState, pod: Pod) -> Status:
        if pod.unsupported:
            return fail(
                "not supported by lj-runtimekit-scheduler: "
                + "; ".join(pod.unsupported)
                + " (use the default scheduler for this pod)",
                unresolvable=True,
            )
        return OK


def new() -> UnsupportedFeatures:
    return UnsupportedFeatures()
