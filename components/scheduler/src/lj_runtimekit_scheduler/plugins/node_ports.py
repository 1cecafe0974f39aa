"""NodePorts: a host port (protocol, IP, port) is used by one pod per node; 0.0.0.0 conflicts
with every IP."""

from __future__ import annotations

from collections.abc import Iterable

from ..framework import OK, SKIP, CycleState, Status, fail
from ..model import HostPort, Pod
from ..state import NodeInfo

NAME = "NodePorts"
_ANY = "0.0.0.0"


def conflicts(wanted: Iterable[HostPort], used: Iterable[HostPort]) -> bool:
    used = list(used)
    for w in wanted:
        for u in used:
            same = w.port == u.port and w.protocol == u.protocol
            if same and (w.ip == u.ip or _ANY in (w.ip, u.ip)):
                return True
    return False


class NodePorts:
    NAME = NAME

    def pre_filter(self, cs: CycleState, pod: Pod) -> Status:
        return OK if pod.host_ports else SKIP

    def filter(self, cs: CycleState, pod: Pod, info: NodeInfo) -> Status:
        if pod.host_ports and conflicts(pod.host_ports, info.ports):
            return fail("node(s) didn't have free ports for the requested pod ports")
        return OK


def new() -> NodePorts:
    return NodePorts()
