"""NodeName: a pod that names its node fits only there."""

from __future__ import annotations

from ..framework import OK, CycleState, Status, fail
from ..model import Pod
from ..state import ClusterState, NodeInfo

NAME = "NodeName"


def fits(pod: Pod, node: str) -> bool:
    return not pod.node_name or pod.node_name == node


class NodeName:
    NAME = NAME

    def filter(self, cs: CycleState, pod: Pod, info: NodeInfo) -> Status:
        return (
            OK
            if fits(pod, info.node.name)
            else fail("node(s) didn't match the requested node name")
        )


def new(settings: object, state: ClusterState) -> NodeName:
    return NodeName()
