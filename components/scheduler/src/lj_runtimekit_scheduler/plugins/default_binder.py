"""DefaultBinder: the Binding subresource of the pod, carrying the PreBind annotations."""

from __future__ import annotations

from ..framework import OK, Binder, CycleState, Status
from ..model import Pod

NAME = "DefaultBinder"


class DefaultBinder:
    NAME = NAME

    async def bind(self, cs: CycleState, pod: Pod, node: str, binder: Binder) -> Status:
        await binder.bind(pod, node, cs.binding_annotations)
        return OK


def new() -> DefaultBinder:
    return DefaultBinder()
