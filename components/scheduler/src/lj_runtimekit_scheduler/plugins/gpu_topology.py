"""GpuTopology: prefers nodes where each multi-device container's GPUs share an NVLink island
(else a NUMA node), using the choice GpuFit made for that node."""

from __future__ import annotations

from .. import gpu
from ..framework import CycleState
from ..model import Pod
from ..state import NodeInfo

NAME = "GpuTopology"


class GpuTopology:
    NAME = NAME

    def score(self, cs: CycleState, pod: Pod, info: NodeInfo) -> int:
        choice = cs.chosen(info.node.name)
        if choice is None:
            return 0
        return gpu.locality(info.devices, choice)


def new() -> GpuTopology:
    return GpuTopology()
