"""NodeUnschedulable: cordoned nodes take only pods tolerating node.kubernetes.io/unschedulable."""

from __future__ import annotations

from ..framework import OK, CycleState, Status, fail
from ..model import Node, Pod, Taint
from ..state import NodeInfo

NAME = "NodeUnschedulable"
_TAINT = Taint("node.kubernetes.io/unschedulable", "", "NoSchedule")


def fits(pod: Pod, node: Node) -> bool:
    return not node.unschedulable or any(t.tolerates(_TAINT) for t in pod.tolerations)


class NodeUnschedulable:
    NAME = NAME

    def filter(self, cs: CycleState, pod: Pod, info: NodeInfo) -> Status:
        return OK if fits(pod, info.node) else fail("node(s) were unschedulable", unresolvable=True)


def new() -> NodeUnschedulable:
    return NodeUnschedulable()
