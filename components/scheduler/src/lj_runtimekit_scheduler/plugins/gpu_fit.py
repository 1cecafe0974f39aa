"""GpuFit: the concrete GPUs/PPUs of the pod on each node (Filter), the fragmentation-aware
score of the node after placement (Score), and the decision written on the pod as the
``lj-runtimekit-scheduler/gpu-assignment`` annotation before binding (PreBind)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime

from .. import gpu
from ..framework import CHOSEN_DEVICES, OK, SKIP, Binder, CycleState, Slot, Status, fail
from ..model import ASSIGNMENT_ANNOTATION, Pod
from ..state import ClusterState, NodeInfo

NAME = "GpuFit"
_SCORES: Slot[dict[str, int]] = Slot("GpuFit/score")
"""Node → the score of the node after the choice, computed with it at Filter."""


@dataclass(frozen=True)
class Args:
    strategy: str = "binpack"
    """binpack or spread (gpu.choose, gpu.score)."""
    feature_label: str = "lj_runtimekit_enable"
    """Only nodes labelled with it (value true) take device pods."""


def assignment(pod: Pod, node: str, choice: gpu.Choice, now: datetime) -> str:
    """The annotation value of docs/contracts.md."""
    doc = {
        "version": "v1",
        "node": node,
        "assumedAt": now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "containers": [
            {
                "name": name,
                "devices": [
                    {"id": s.device, "whole": True}
                    if s.whole
                    else {"id": s.device, "core": s.core, "memoryGiB": s.memory_gib}
                    for s in slices
                ],
            }
            for name, slices in choice.containers
            if slices
        ],
    }
    return json.dumps(doc, separators=(",", ":"))


class GpuFit:
    NAME = NAME

    def __init__(
        self, strategy: str, feature_label: str, state: ClusterState | None = None
    ) -> None:
        self.strategy = strategy
        self.feature_label = feature_label
        self.state = state
        """Where a node in DRA mode adds the claims others allocated there (None: never)."""
        # (node, node version, requests) → (choice, why not, score): same-shaped pods in a row
        # recompute only the nodes that changed
        self._cache: dict[tuple[str, int, object], tuple[gpu.Choice | None, str, int]] = {}

    def pre_filter(self, cs: CycleState, pod: Pod) -> Status:
        return OK if pod.wants_devices else SKIP

    def filter(self, cs: CycleState, pod: Pod, info: NodeInfo) -> Status:
        if not pod.wants_devices:
            return OK
        if info.node.label_map().get(self.feature_label) != "true":
            return fail(f"node is not labelled {self.feature_label}=true", unresolvable=True)
        if not info.devices:
            return fail("node has no NodeDevices inventory yet", unresolvable=True)
        key = (info.node.name, info.version, pod.devices)
        # a what-if copy (preemption's dry runs, nominated pods held) has a version of its own,
        # never seen again: not worth a cache entry
        hit = self._cache.get(key) if info.version >= 0 else None
        if hit is None:
            if len(self._cache) > 200_000:
                self._cache.clear()
            try:
                uses = info.device_use if self.state is None else self.state.device_use(info)
                choice = gpu.choose(info.devices, uses, pod.devices, self.strategy)
                after = gpu.apply(uses, choice)
                hit = (choice, "", gpu.score(info.devices, after, self.strategy))
            except gpu.NoFit as e:
                hit = (None, str(e), 0)
            if info.version >= 0:
                self._cache[key] = hit
        if hit[0] is None:
            return fail(hit[1])
        cs.setdefault(CHOSEN_DEVICES, {})[info.node.name] = hit[0]
        cs.setdefault(_SCORES, {})[info.node.name] = hit[2]
        return OK

    def score(self, cs: CycleState, pod: Pod, info: NodeInfo) -> int:
        return (cs.read(_SCORES) or {}).get(info.node.name, 0)

    async def pre_bind(self, cs: CycleState, pod: Pod, node: str, binder: Binder) -> Status:
        choice = cs.chosen(node)
        if choice is None:
            return OK
        # written by the Binding itself (CycleState.binding_annotations)
        cs.binding_annotations[ASSIGNMENT_ANNOTATION] = assignment(
            pod, node, choice, datetime.now(UTC)
        )
        return OK


def new(args: Args, state: ClusterState | None = None) -> GpuFit:
    return GpuFit(args.strategy, args.feature_label, state)
