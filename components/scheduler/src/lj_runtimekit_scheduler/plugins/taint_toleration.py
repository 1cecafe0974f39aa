"""TaintToleration: NoSchedule/NoExecute taints must be tolerated; untolerated
PreferNoSchedule taints lower the score."""

from __future__ import annotations

from ..framework import OK, CycleState, Status, fail
from ..model import Node, Pod, Taint
from ..state import NodeInfo

NAME = "TaintToleration"
UNTOLERATED = "node(s) had untolerated taint(s)"


def untolerated(pod: Pod, node: Node) -> Taint | None:
    """The first NoSchedule/NoExecute taint the pod does not tolerate, or None."""
    for t in node.taints:
        if t.effect in ("NoSchedule", "NoExecute") and not any(
            tol.tolerates(t) for tol in pod.tolerations
        ):
            return t
    return None


def intolerable_preferences(pod: Pod, node: Node) -> int:
    return sum(
        1
        for t in node.taints
        if t.effect == "PreferNoSchedule" and not any(tol.tolerates(t) for tol in pod.tolerations)
    )


class TaintToleration:
    NAME = NAME

    def filter(self, cs: CycleState, pod: Pod, info: NodeInfo) -> Status:
        t = untolerated(pod, info.node)
        if t is None:
            return OK
        # kube-scheduler's words (v1.37): the taint is not named; no preemption removes it
        return fail(UNTOLERATED, unresolvable=True)

    def score(self, cs: CycleState, pod: Pod, info: NodeInfo) -> int:
        return intolerable_preferences(pod, info.node)

    def normalize(self, scores: dict[str, int]) -> dict[str, int]:
        # fewer intolerable taints is better (kube-scheduler's reverse normalisation)
        top = max(scores.values(), default=0)
        if top == 0:
            return dict.fromkeys(scores, 100)
        return {k: 100 - v * 100 // top for k, v in scores.items()}


def new() -> TaintToleration:
    return TaintToleration()
