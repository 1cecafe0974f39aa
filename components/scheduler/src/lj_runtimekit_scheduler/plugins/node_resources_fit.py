"""NodeResourcesFit: requests against allocatable minus bound and assumed pods; the score
follows the GPU strategy (binpack: MostAllocated, spread: LeastAllocated) over cpu and memory."""

from __future__ import annotations

from dataclasses import dataclass

from ..framework import OK, CycleState, Status, fail
from ..model import Pod, Resources
from ..state import ClusterState, NodeInfo

NAME = "NodeResourcesFit"


@dataclass(frozen=True)
class Args:
    most_allocated: bool = True
    """MostAllocated scoring (binpack); False: LeastAllocated (spread)."""


def insufficient(want: Resources, allocatable: Resources, requested: Resources) -> list[str]:
    """Names of resources the node lacks, sorted; empty when the pod fits."""
    short = []
    for name, amount in want.items():
        if amount <= 0:
            continue
        if requested.get(name, 0) + amount > allocatable.get(name, 0):
            short.append(name)
    return sorted(short)


_FIRST = ("pods", "cpu", "memory", "ephemeral-storage")


def shortfall(short: list[str]) -> list[str]:
    """kube-scheduler's words for the resources a node lacks, in its order: the pod count
    ("Too many pods"), cpu, memory, ephemeral-storage, then the others."""
    first = [r for r in _FIRST if r in short]
    rest = [r for r in short if r not in _FIRST]
    return [("Too many pods" if r == "pods" else f"Insufficient {r}") for r in first + rest]


def allocation_score(
    want: Resources, allocatable: Resources, requested: Resources, most: bool
) -> int:
    parts = []
    for name in ("cpu", "memory"):
        cap = allocatable.get(name, 0)
        if cap <= 0:
            continue
        frac = min(1.0, (requested.get(name, 0) + want.get(name, 0)) / cap)
        parts.append(frac if most else 1.0 - frac)
    return round(100 * sum(parts) / len(parts)) if parts else 0


class NodeResourcesFit:
    NAME = NAME

    def __init__(self, most_allocated: bool, state: ClusterState | None = None) -> None:
        self.most = most_allocated
        self.state = state
        """On a node in DRA mode our device resources are claims (GpuFit, DraClaims), not
        extended resources the node advertises: they are left out here, as kube-scheduler
        leaves out the extended resources a DRA mapping serves."""

    def filter(self, cs: CycleState, pod: Pod, info: NodeInfo) -> Status:
        want = pod.requests
        if self.state is not None and pod.devices and self.state.dra.serves(info.node.name):
            ours = set(self.state.names.all)
            want = {k: v for k, v in want.items() if k not in ours}
        short = insufficient(want, info.node.allocatable, info.requested)
        if short:
            return fail(", ".join(shortfall(short)))
        return OK

    def score(self, cs: CycleState, pod: Pod, info: NodeInfo) -> int:
        return allocation_score(pod.requests, info.node.allocatable, info.requested, self.most)


def new(args: Args, state: ClusterState | None = None) -> NodeResourcesFit:
    return NodeResourcesFit(most_allocated=args.most_allocated, state=state)
