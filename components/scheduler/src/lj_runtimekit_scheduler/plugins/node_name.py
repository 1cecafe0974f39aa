"""NodeName: a pod that names its node fits only there."""

from __future__ import annotations

from ..framework import OK, SKIP, CycleState, Status, fail
from ..model import Pod
from ..state import NodeInfo

NAME = "NodeName"
MISMATCH = fail("node(s) didn't match the requested node name", unresolvable=True)
"""No preemption makes another node this one (kube-scheduler: UnschedulableAndUnresolvable)."""


def fits(pod: Pod, node: str) -> bool:
    return not pod.node_name or pod.node_name == node


class NodeName:
    NAME = NAME

    def pre_filter(self, cs: CycleState, pod: Pod) -> Status:
        return OK if pod.node_name else SKIP

    def filter(self, cs: CycleState, pod: Pod, info: NodeInfo) -> Status:
        return OK if fits(pod, info.node.name) else MISMATCH


def new() -> NodeName:
    return NodeName()
