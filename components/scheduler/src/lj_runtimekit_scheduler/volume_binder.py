"""kube-scheduler's volume binding rules over the storage cache, pure: which of a pod's claims are
bound, which wait for their first consumer (WaitForFirstConsumer), which PV a waiting claim gets
on a node (the PV controller's smallest-fit match), whether a node may provision the rest, and
whether the PV controller has finished what the scheduler started.

Upstream: ``pkg/scheduler/framework/plugins/volumebinding`` (binder.go: GetPodVolumeClaims,
GetEligibleNodes, FindPodVolumes, AssumePodVolumes, checkBindings) and the PV controller's
``FindMatchingVolume`` (component-helpers/storage/volume). The reasons are theirs, word for word,
because a FailedScheduling event is read by people who know kube-scheduler's.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass

from . import volumes
from .model import Pod
from .storage import Storage
from .volumes import Claim, Volume

# FindPodVolumes' reasons, in the order it gives them
NODE_CONFLICT = "node(s) had volume node affinity conflict"
BIND_CONFLICT = "node(s) didn't find available persistent volumes to bind"
NOT_ENOUGH_SPACE = "node(s) did not have enough free storage"
PV_NOT_EXIST = "node(s) unavailable due to one or more pvc(s) bound to non-existent pv(s)"
UNBOUND_IMMEDIATE = "pod has unbound immediate PersistentVolumeClaims"
HOSTNAME = "kubernetes.io/hostname"


class Refused(Exception):
    """The pod cannot be scheduled as it is now (PreFilter's UnschedulableAndUnresolvable): a
    claim missing, lost, being deleted, or an ephemeral claim not made for this pod."""


class BindingFailed(Exception):
    """What the scheduler started will not complete: PreBind fails and the pod is tried again."""


@dataclass(frozen=True)
class PodClaims:
    """A pod's claims, as GetPodVolumeClaims sorts them."""

    bound: tuple[Claim, ...] = ()
    delayed: tuple[Claim, ...] = ()
    """Unbound, of a WaitForFirstConsumer class: the scheduler's to bind."""
    immediate: tuple[Claim, ...] = ()
    """Unbound of an Immediate class (or prebound to a PV): the PV controller's, not ours."""


@dataclass(frozen=True)
class Binding:
    claim: Claim
    volume: Volume


@dataclass(frozen=True)
class PodVolumes:
    """What binding the pod's claims on one node takes: static PVs, and claims to provision."""

    bindings: tuple[Binding, ...] = ()
    provisions: tuple[Claim, ...] = ()


def delayed(c: Claim, storage: Storage) -> bool:
    """IsDelayBindingMode: the claim's class exists and waits for the first consumer."""
    cls = storage.classes.get(c.storage_class) if c.storage_class else None
    return cls is not None and cls.delayed


def pod_claims(pod: Pod, storage: Storage) -> PodClaims:
    """The pod's claims sorted (PreFilter); raises :class:`Refused` with kube-scheduler's words
    when one cannot be used now."""
    bound, waiting, immediate = [], [], []
    for v in pod.claims:
        api = storage.claims.get(f"{pod.namespace}/{v.claim}")
        if api is None:
            if v.ephemeral:
                raise Refused(
                    "waiting for ephemeral volume controller to create the persistentvolumeclaim "
                    f'"{v.claim}"'
                )
            raise Refused(f'persistentvolumeclaim "{v.claim}" not found')
        if api.phase == "Lost":
            raise Refused(
                f'persistentvolumeclaim "{api.name}" bound to non-existent persistentvolume '
                f'"{api.volume_name}"'
            )
        if api.deleting:
            raise Refused(f'persistentvolumeclaim "{api.name}" is being deleted')
        if v.ephemeral and api.controller_uid != pod.uid:
            raise Refused(
                f"PVC {api.namespace}/{api.name} was not created for pod {pod.key} "
                "(pod is not owner)"
            )
        c = storage.claim(pod.namespace, v.claim) or api
        if c.fully_bound:
            bound.append(c)
        elif delayed(c, storage) and not c.volume_name:
            waiting.append(c)
        else:
            immediate.append(c)
    return PodClaims(tuple(bound), tuple(waiting), tuple(immediate))


def local_nodes(v: Volume) -> set[str] | None:
    """GetLocalPersistentVolumeNodeNames: the node names a PV's ``kubernetes.io/hostname In``
    requirements allow (terms ORed, requirements of a term intersected); None: not local."""
    if v.node_affinity is None:
        return None
    result: set[str] = set()
    for term in v.node_affinity:
        names: set[str] | None = None
        for key, op, values in term.requirements:
            if key == HOSTNAME and op == "In":
                names = set(values) if names is None else names & set(values)
        result |= names or set()
    return result or None


def eligible_nodes(claims: PodClaims, storage: Storage) -> frozenset[str] | None:
    """GetEligibleNodes: the only nodes the pod's bound local PVs allow (None: any node). A bound
    claim whose PV is missing gives no reduction (Filter says why)."""
    eligible: set[str] | None = None
    for c in claims.bound:
        v = storage.volume(c.volume_name)
        if v is None:
            return None
        names = local_nodes(v)
        if names:
            eligible = set(names) if eligible is None else eligible & names
    return None if eligible is None else frozenset(eligible)


def matching_volume(
    claim: Claim, candidates: list[Volume], labels: Mapping[str, str], excluded: set[str]
) -> Volume | None:
    """FindMatchingVolume on the scheduler's path: a PV prebound to the claim if its node
    affinity allows the node, else the smallest Available PV of the claim's class, mode, access
    modes, selector and attributes class that is reachable from the node."""
    asked = claim.request or 0
    smallest: Volume | None = None
    for v in candidates:
        if v.name in excluded or (v.claim_ref is not None and not v.bound_to(claim)):
            continue
        if v.capacity < asked or v.volume_mode != claim.volume_mode or v.deleting:
            continue
        reachable = v.reachable_from(labels)
        if v.bound_to(claim):
            return v if reachable else None
        if v.phase != "Available":
            continue
        if claim.selector is not None and not claim.selector.matches(dict(v.labels)):
            continue
        if v.storage_class != claim.storage_class or not reachable:
            continue
        if not set(claim.access_modes) <= set(v.access_modes):
            continue
        if v.attributes_class != claim.attributes_class:
            continue
        if smallest is None or v.capacity < smallest.capacity:
            smallest = v
    return smallest


def enough_capacity(
    claim: Claim, provisioner: str, cls: str, labels: Mapping[str, str], storage: Storage
) -> bool:
    """hasEnoughCapacity: checked only for a CSI driver that opts in (``storageCapacity``): some
    CSIStorageCapacity of the class, reachable from the node, has room for the claim."""
    driver = storage.drivers.get(provisioner)
    if claim.request is None or driver is None or not driver.storage_capacity:
        return True
    return any(
        cap.storage_class == cls
        and cap.limit is not None
        and cap.limit >= claim.request
        and cap.topology is not None
        and cap.topology.matches(labels)
        for cap in storage.capacities.values()
    )


def _provisions(
    claims: list[Claim], labels: Mapping[str, str], storage: Storage
) -> tuple[bool, bool, tuple[Claim, ...]]:
    """checkVolumeProvisions: (provisionable, enough space, the claims to provision)."""
    out = []
    for c in claims:
        if not c.storage_class:
            raise BindingFailed(f'no class for claim "{c.key}"')
        cls = storage.classes.get(c.storage_class)
        if cls is None:
            raise BindingFailed(f'failed to find storage class "{c.storage_class}"')
        if cls.provisioner in ("", volumes.NO_PROVISIONER) or not cls.allows(labels):
            return False, True, ()
        if not enough_capacity(c, cls.provisioner, cls.name, labels, storage):
            return True, False, ()
        out.append(c)
    return True, True, tuple(out)


def find(
    claims: PodClaims, node: str, labels: Mapping[str, str], storage: Storage
) -> tuple[PodVolumes, tuple[str, ...]]:
    """FindPodVolumes: what binding the claims on ``node`` takes, or the reasons it cannot
    (none: it can). Raises :class:`BindingFailed` where upstream errs (a claim to provision
    whose class is gone)."""
    bound_ok = found = unbound_ok = enough = True
    bindings: tuple[Binding, ...] = ()
    provisions: tuple[Claim, ...] = ()
    for c in claims.bound:
        v = storage.volume(c.volume_name)
        if v is None:
            found = False
            break
        if not v.reachable_from(labels):
            bound_ok = False
            break
    if claims.delayed:
        selected = [c for c in claims.delayed if c.selected_node is not None]
        if any(c.selected_node != node for c in selected):
            unbound_ok = False  # provisioning for another node already started
        else:
            to_provision = list(selected)
            to_match = [c for c in claims.delayed if c.selected_node is None]
            if to_match:
                unbound_ok, bindings, rest = _match(to_match, labels, storage)
                to_provision += rest
            if to_provision:
                unbound_ok, enough, provisions = _provisions(to_provision, labels, storage)
    reasons = [
        why
        for why, ok in (
            (NODE_CONFLICT, bound_ok),
            (BIND_CONFLICT, unbound_ok),
            (NOT_ENOUGH_SPACE, enough),
            (PV_NOT_EXIST, found),
        )
        if not ok
    ]
    return PodVolumes(bindings, provisions), tuple(reasons)


def _match(
    claims: list[Claim], labels: Mapping[str, str], storage: Storage
) -> tuple[bool, tuple[Binding, ...], list[Claim]]:
    """findMatchingVolumes: smallest claims first, each PV given once; (all matched, the
    bindings, the claims left to provision)."""
    chosen: set[str] = set()
    bindings, rest = [], []
    for c in sorted(claims, key=lambda c: c.request or 0):
        v = matching_volume(c, storage.volumes_of_class(c.storage_class), labels, chosen)
        if v is None:
            rest.append(c)
            continue
        chosen.add(v.name)
        bindings.append(Binding(c, v))
    return not rest, tuple(bindings), rest


def all_bound(pod: Pod, storage: Storage) -> bool:
    """arePodVolumesBound: every claim of the pod is fully bound (as the scheduler sees it)."""
    for v in pod.claims:
        c = storage.claim(pod.namespace, v.claim)
        if c is None or not c.fully_bound:
            return False
    return True


def bind_to_claim(v: Volume, c: Claim) -> Volume | None:
    """GetBindVolumeToClaim: the PV with its claimRef naming the claim, marked bound by a
    controller unless it was prebound; None when it already says all that."""
    raw = copy.deepcopy(v.raw)
    dirty = False
    ref = v.claim_ref
    if ref is None or (ref.namespace, ref.name, ref.uid) != (c.namespace, c.name, c.uid):
        raw.setdefault("spec", {})["claimRef"] = {
            "kind": "PersistentVolumeClaim",
            "namespace": c.namespace,
            "name": c.name,
            "uid": c.uid,
            "apiVersion": "v1",
            "resourceVersion": c.version,
        }
        dirty = True
    ann = raw.setdefault("metadata", {}).setdefault("annotations", {})
    if not v.bound_to(c) and volumes.BOUND_BY_CONTROLLER not in ann:
        ann[volumes.BOUND_BY_CONTROLLER] = "yes"
        dirty = True
    return volumes.volume(raw) if dirty else None


def select_node(c: Claim, node: str) -> Claim:
    """The claim annotated with the node it is to be provisioned for (AssumePodVolumes)."""
    raw = copy.deepcopy(c.raw)
    raw.setdefault("metadata", {}).setdefault("annotations", {})[volumes.SELECTED_NODE] = node
    return volumes.claim(raw)


def _newer(written: str, seen: str) -> bool:
    try:
        return int(written) > int(seen)
    except ValueError:
        return False


def check(
    written: PodVolumes, node: str, labels: Mapping[str, str] | None, storage: Storage
) -> bool:
    """checkBindings, over the apiserver's objects (never the assumed ones): True once every
    claim the scheduler bound or asked to provision is fully bound; raises
    :class:`BindingFailed` when the PV controller undid it or it cannot hold on ``node``."""
    if labels is None:
        raise BindingFailed(f'failed to get node "{node}"')
    for b in written.bindings:
        v = storage.volumes.get(b.volume.name)
        c = storage.claims.get(b.claim.key)
        if v is None or c is None:
            what = f'PersistentVolume "{b.volume.name}"' if v is None else f'claim "{b.claim.key}"'
            raise BindingFailed(f"failed to check binding: {what} not found")
        if _newer(b.volume.version, v.version):
            return False  # our update has not come back through the watch yet
        if not v.reachable_from(labels):
            raise BindingFailed(f'pv "{v.name}" node affinity doesn\'t match node "{node}"')
        if v.claim_ref is None or not v.claim_ref.uid:
            raise BindingFailed(f'ClaimRef got reset for pv "{v.name}"')
        if not c.fully_bound:
            return False
    for p in written.provisions:
        c = storage.claims.get(p.key)
        if c is None:
            raise BindingFailed(f'failed to check provisioning pvc: claim "{p.key}" not found')
        if _newer(p.version, c.version):
            return False
        if c.selected_node != node:
            # the provisioner takes the annotation away when it cannot provision there
            raise BindingFailed(f'provisioning failed for PVC "{c.name}"')
        if c.volume_name:
            v = storage.volumes.get(c.volume_name)
            if v is None:
                return False  # not seen yet; a deleted PV unbinds the claim later
            if not v.reachable_from(labels):
                raise BindingFailed(f'pv "{v.name}" node affinity doesn\'t match node "{node}"')
        if not c.fully_bound:
            return False
    return True
