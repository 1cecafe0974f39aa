"""GpuFit: the concrete GPUs/PPUs of the pod on each node (Filter), the fragmentation-aware
score of the node after placement (Score), and the decision written on the pod as the
``lj-runtimekit-scheduler/gpu-assignment`` annotation before binding (PreBind)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from .. import gpu
from ..framework import OK, SKIP, Binder, CycleState, Status, fail
from ..model import ASSIGNMENT_ANNOTATION, Pod
from ..settings import Settings
from ..state import ClusterState, NodeInfo

NAME = "GpuFit"


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

    def __init__(self, strategy: str, feature_label: str) -> None:
        self.strategy = strategy
        self.feature_label = feature_label
        # (node, node version, requests) → (choice, why not, score): same-shaped pods in a row
        # recompute only the nodes that changed
        self._cache: dict[tuple[str, int, object], tuple[gpu.Choice | None, str, int]] = {}

    def _choices(self, cs: CycleState) -> dict[str, gpu.Choice]:
        return cs.data.setdefault(NAME, {})  # type: ignore[no-any-return]

    def pre_filter(self, cs: CycleState, pod: Pod) -> Status:
        return OK if pod.wants_devices else SKIP

    def filter(self, cs: CycleState, pod: Pod, info: NodeInfo) -> Status:
        if not pod.wants_devices:
            return OK
        if info.node.label_map().get(self.feature_label) != "true":
            return fail(f"node is not labelled {self.feature_label}=true")
        if not info.devices:
            return fail("node has no NodeDevices inventory yet")
        key = (info.node.name, info.version, pod.devices)
        hit = self._cache.get(key)
        if hit is None:
            if len(self._cache) > 200_000:
                self._cache.clear()
            try:
                choice = gpu.choose(info.devices, info.device_use, pod.devices, self.strategy)
                after = gpu.apply(info.device_use, choice)
                hit = (choice, "", gpu.score(info.devices, after, self.strategy))
            except gpu.NoFit as e:
                hit = (None, str(e), 0)
            self._cache[key] = hit
        if hit[0] is None:
            return fail(hit[1])
        self._choices(cs)[info.node.name] = hit[0]
        cs.data.setdefault(f"{NAME}/score", {})[info.node.name] = hit[2]
        return OK

    def score(self, cs: CycleState, pod: Pod, info: NodeInfo) -> int:
        scores: dict[str, int] = cs.data.get(f"{NAME}/score", {})
        return scores.get(info.node.name, 0)

    def chosen(self, cs: CycleState, node: str) -> gpu.Choice | None:
        return self._choices(cs).get(node)

    async def pre_bind(self, cs: CycleState, pod: Pod, node: str, binder: Binder) -> Status:
        choice = self.chosen(cs, node)
        if choice is None:
            return OK
        # written by the Binding itself (CycleState.binding_annotations)
        cs.binding_annotations[ASSIGNMENT_ANNOTATION] = assignment(
            pod, node, choice, datetime.now(UTC)
        )
        return OK


def new(settings: Settings, state: ClusterState) -> GpuFit:
    return GpuFit(settings.gpu_strategy, settings.feature_label)
