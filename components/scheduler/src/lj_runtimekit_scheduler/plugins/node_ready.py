"""NodeReady: only nodes whose Ready condition is True (kube-scheduler relies on the
not-ready taint; we also check the condition so a node without the taint yet is skipped)."""

from __future__ import annotations

from ..framework import OK, CycleState, Status, fail
from ..model import Node, Pod, Taint
from ..state import NodeInfo

NAME = "NodeReady"
_NOT_READY = Taint("node.kubernetes.io/not-ready", "", "NoSchedule")


def fits(pod: Pod, node: Node) -> bool:
    return node.ready or any(t.tolerates(_NOT_READY) for t in pod.tolerations)


class NodeReady:
    NAME = NAME

    def filter(self, cs: CycleState, pod: Pod, info: NodeInfo) -> Status:
        return OK if fits(pod, info.node) else fail("node(s) were not ready", unresolvable=True)


def new() -> NodeReady:
    return NodeReady()
