"""DraClaims: a pod of ours placed on a node in DRA mode gets its devices as a ResourceClaim.

GpuFit chooses the devices on every node alike (on a DRA node counting the claims others hold
there); this plugin checks at Filter that each chosen device is in the node's ResourceSlices
and that the requests can be a claim (:func:`..dra.unmappable`), and at PreBind writes the
claim, its allocation and reservation, and the pod's ``extendedResourceClaimStatus`` — the
writes kube-scheduler makes for a KEP-5004 mapping (:mod:`..dra`). The Binding follows; if any
write fails the claim is deleted and the pod tried again.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from .. import dra
from ..errors import SchedulerError
from ..framework import OK, Binder, ClaimWriter, CycleState, Status, fail
from ..model import Pod
from ..state import ClusterState, NodeInfo

NAME = "DraClaims"


class DraClaims:
    NAME = NAME

    def __init__(self, state: ClusterState) -> None:
        self.state = state

    def filter(self, cs: CycleState, pod: Pod, info: NodeInfo) -> Status:
        node = info.node.name
        if not pod.wants_devices or not self.state.dra.serves(node):
            return OK
        if why := dra.unmappable(pod):
            return fail(why)
        choice = cs.chosen(node)
        if choice is None:
            return OK
        for _, slices in choice.containers:
            for s in slices:
                if self.state.dra.offer(node, s.device) is None:
                    return fail(f"{s.device} is not among the node's ResourceSlice devices yet")
        return OK

    async def pre_bind(self, cs: CycleState, pod: Pod, node: str, binder: Binder) -> Status:
        choice = cs.chosen(node)
        if choice is None or not self.state.dra.serves(node):
            return OK
        try:
            plan = dra.plan(pod, node, choice, self.state.dra, self.state.names, new_id=_share_id)
        except dra.NotOffered as e:
            return fail(str(e))
        if not isinstance(binder, ClaimWriter):
            return fail("this scheduler's apiserver client cannot write ResourceClaims")
        created = await binder.create_claim(plan.claim)
        name = created["metadata"]["name"]
        try:
            now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            await binder.claim_status(pod.namespace, name, dra.status(pod, node, plan, now))
            await binder.pod_status(pod, dra.pod_status(name, plan))
        except SchedulerError:
            await binder.delete_claim(pod.namespace, name)
            raise
        return OK


def _share_id() -> str:
    return str(uuid.uuid4())


def new(state: ClusterState) -> DraClaims:
    return DraClaims(state)
