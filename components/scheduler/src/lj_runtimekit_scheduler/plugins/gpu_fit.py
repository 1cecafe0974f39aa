"""GpuFit: the concrete GPUs/PPUs of the pod on each node (Filter), the fragmentation-aware
score of the node after placement (Score), and the decision written on the pod as the
``lj-runtimekit-scheduler/gpu-assignment`` annotation before binding (PreBind)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from .. import gpu
from ..framework import OK, Binder, CycleState, Status, fail
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

    def _choices(self, cs: CycleState) -> dict[str, gpu.Choice]:
        return cs.data.setdefault(NAME, {})  # type: ignore[no-any-return]

    def filter(self, cs: CycleState, pod: Pod, info: NodeInfo) -> Status:
        if not pod.wants_devices:
            return OK
        if info.node.label_map().get(self.feature_label) != "true":
            return fail(f"node is not labelled {self.feature_label}=true")
        if not info.devices:
            return fail("node has no NodeDevices inventory yet")
        try:
            choice = gpu.choose(info.devices, info.device_use, pod.devices, self.strategy)
        except gpu.NoFit as e:
            return fail(str(e))
        self._choices(cs)[info.node.name] = choice
        return OK

    def score(self, cs: CycleState, pod: Pod, info: NodeInfo) -> int:
        choice = self._choices(cs).get(info.node.name)
        if choice is None:
            return 0
        after = gpu.apply(info.device_use, choice)
        return gpu.score(info.devices, after, self.strategy)

    def chosen(self, cs: CycleState, node: str) -> gpu.Choice | None:
        return self._choices(cs).get(node)

    async def pre_bind(self, cs: CycleState, pod: Pod, node: str, binder: Binder) -> Status:
        choice = self.chosen(cs, node)
        if choice is None:
            return OK
        value = assignment(pod, node, choice, datetime.now(UTC))
        await binder.annotate(pod, {ASSIGNMENT_ANNOTATION: value})
        return OK


def new(settings: Settings, state: ClusterState) -> GpuFit:
    return GpuFit(settings.gpu_strategy, settings.feature_label)
