"""The shared-GPU handshake of docs/contracts.md, the pure half: parse and choose. No I/O.

The scheduler writes ``lj-runtimekit-scheduler/gpu-assignment`` on the pod, and never has two
pods pending on one node (bound, assigned, not yet marked by the plugin, not ended) with a
container of the same (resource, unit count). So at Allocate the plugin takes the *unique*
pending container asking exactly what the kubelet asks for: correct whatever order the kubelet
admits pods in. Zero or several matches are refused (shares) or left to topology (whole). The
claim itself (a pod patch with a resourceVersion precondition) is the adapter's; this module
only decides and says what the mark becomes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import PermanentError
from ..podview import PodView

ASSIGNMENT = "lj-runtimekit-scheduler/gpu-assignment"
ALLOCATED = "lj-runtimekit-device-plugin/allocated"
ALLOCATION = "lj-runtimekit-device-plugin/allocation"
VERSION = "v1"


class BadAssignment(PermanentError):
    """The assignment annotation is missing, malformed or for another node."""


@dataclass(frozen=True)
class Share:
    """One device of a container's assignment."""

    id: str
    core: int = 0
    memory_gib: int = 0
    whole: bool = False


@dataclass(frozen=True)
class Assignment:
    node: str
    assumed_at: str
    containers: Mapping[str, tuple[Share, ...]]


def _int(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise BadAssignment(f"{ASSIGNMENT}: {what}={v!r} is not a non-negative integer")
    return v


def parse(text: str) -> Assignment:
    """The annotation's JSON as data; :class:`BadAssignment` says what is wrong with it."""
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise BadAssignment(f"{ASSIGNMENT} is not JSON: {e}") from e
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        raise BadAssignment(f"{ASSIGNMENT}: expected an object with version {VERSION!r}")
    node, at, containers = doc.get("node"), doc.get("assumedAt"), doc.get("containers")
    if not isinstance(node, str) or not isinstance(at, str) or not isinstance(containers, list):
        raise BadAssignment(f"{ASSIGNMENT}: node, assumedAt and containers are required")
    out: dict[str, tuple[Share, ...]] = {}
    for c in containers:
        if not isinstance(c, dict) or not isinstance(c.get("name"), str):
            raise BadAssignment(f"{ASSIGNMENT}: each container needs a name")
        devices = c.get("devices")
        if not isinstance(devices, list) or not devices:
            raise BadAssignment(f"{ASSIGNMENT}: container {c['name']} has no devices")
        shares = []
        for d in devices:
            if not isinstance(d, dict) or not isinstance(d.get("id"), str) or not d["id"]:
                raise BadAssignment(f"{ASSIGNMENT}: container {c['name']}: device without id")
            shares.append(
                Share(
                    id=d["id"],
                    core=_int(d.get("core", 0), "core"),
                    memory_gib=_int(d.get("memoryGiB", 0), "memoryGiB"),
                    whole=d.get("whole") is True,
                )
            )
        out[c["name"]] = one_per_device(c["name"], shares)
    return Assignment(node=node, assumed_at=at, containers=out)


def one_per_device(container: str, shares: Iterable[Share]) -> tuple[Share, ...]:
    """One share per device: a device listed twice is one share of the sum (what the Runtime
    then holds for it is what the container is told), in the order of first mention.

    Refused (:class:`BadAssignment`): a device listed both whole and shared, and shares of more
    than one device. The scheduler gives a container at most one shared GPU, and the Runtime's
    injection carries one share (``LJ_GPU_CORE_PERCENT``, ``LJ_VISIBLE_DEVICES``) per
    allocation: two allocations merged into one environment would tell the container one
    device's share while the Runtime holds both.
    """
    merged: dict[str, Share] = {}
    for s in shares:
        seen = merged.get(s.id)
        if seen is None:
            merged[s.id] = s
        elif seen.whole != s.whole:
            raise BadAssignment(
                f"{ASSIGNMENT}: container {container}: device {s.id} is listed both whole "
                "and shared"
            )
        elif not s.whole:
            merged[s.id] = Share(s.id, seen.core + s.core, seen.memory_gib + s.memory_gib)
    shared = [s.id for s in merged.values() if not s.whole]
    if len(shared) > 1:
        raise BadAssignment(
            f"{ASSIGNMENT}: container {container}: shares of {len(shared)} devices {shared}; a "
            "container gets a share of one GPU (its environment names one share)"
        )
    return tuple(merged.values())


def on_node(pods: Iterable[PodView], node: str) -> Iterator[tuple[PodView, Assignment]]:
    """The pods carrying a readable assignment for ``node``, with it (malformed ones skipped)."""
    for pod in pods:
        text = pod.annotations.get(ASSIGNMENT)
        if text is None:
            continue
        try:
            a = parse(text)
        except BadAssignment:
            continue
        if a.node == node:
            yield pod, a


def units_asked(shares: Iterable[Share], kind: str) -> int:
    """Units of ``kind`` (gpu-core or gpu-memory) an assigned container gets."""
    return sum(s.core if kind == "gpu-core" else s.memory_gib for s in shares)


@dataclass(frozen=True)
class Candidate:
    pod: PodView
    container: str
    shares: tuple[Share, ...]
    assumed_at: str
    allocated: tuple[str, ...] = ()
    """Runtime allocation ids the container already holds: a container asking both gpu-core
    and gpu-memory is allocated at the first of its two Allocate calls; the second gets the
    same allocation (and so the same injection) rather than a second one."""


def marks(annotations: Mapping[str, str]) -> dict[str, dict[str, tuple[str, ...]]]:
    """Container → shared resource → Runtime allocation ids, from the pod's allocation mark.

    A mark that is not the documented JSON reads as no mark; the plugin never writes one.
    """
    try:
        doc = json.loads(annotations.get(ALLOCATION, "{}"))
    except ValueError:
        return {}
    containers = doc.get("containers") if isinstance(doc, dict) else None
    if not isinstance(containers, dict):
        return {}
    out: dict[str, dict[str, tuple[str, ...]]] = {}
    for name, by_resource in containers.items():
        if isinstance(by_resource, dict):
            out[str(name)] = {
                str(r): tuple(str(i) for i in ids)
                for r, ids in by_resource.items()
                if isinstance(ids, list)
            }
    return out


def _shared(shares: Iterable[Share]) -> tuple[Share, ...]:
    return tuple(s for s in shares if not s.whole)


def candidates(
    pods: Iterable[PodView],
    node: str,
    resource: str,
    kind: str,
    *,
    units: int,
    claimed: Iterable[tuple[str, str, str]] = (),
    held: Mapping[tuple[str, str], tuple[str, ...]] | None = None,
    paid: Mapping[str, str] | None = None,
) -> list[Candidate]:
    """(pod, container) pairs on ``node`` not yet answered for ``resource``, asking exactly
    ``units`` of it.

    A container already allocated for its other shared resource comes first (the kubelet
    allocates one container's resources one after another), then oldest ``assumedAt``, then
    namespace/name, so the order is total. Pairs marked on the pod for ``resource``, malformed
    assignments, and (pod uid, container, resource) in ``claimed`` (this process's claims) are
    left out. ``held`` is this process's own record of (pod uid, container) → allocation ids,
    for when the pod view does not show the mark yet.
    """
    taken = set(claimed)
    held = held or {}
    out = []
    for pod, a in on_node(pods, node):
        if pod.ended or pod.deleted:
            continue
        done = marks(pod.annotations)
        for name, shares in a.containers.items():
            answered = done.get(name, {})
            if resource in answered or (pod.uid, name, resource) in taken:
                continue
            if pod.requests.get(name, {}).get(resource) != units:
                continue
            if units_asked(shares, kind) != units or not _shared(shares):
                continue
            asked = pod.requests.get(name, {})
            if paid and any(units_asked(shares, k) != asked.get(r, 0) for k, r in paid.items()):
                continue
            prior = held.get((pod.uid, name)) or next(iter(answered.values()), ())
            out.append(Candidate(pod, name, _shared(shares), a.assumed_at, prior))
    out.sort(
        key=lambda c: (not c.allocated, c.assumed_at, c.pod.namespace, c.pod.name, c.container)
    )
    return out


def unique(found: Sequence[Candidate]) -> tuple[Candidate | None, list[Candidate]]:
    """The one candidate the kubelet is allocating now, or (None, the ambiguous ones).

    The kubelet allocates one pod's containers, and one container's resources, in a row: a
    container answered for its other shared resource comes first, then the other containers of
    a pod already partly answered, then untouched pods. Within the first tier that has any,
    exactly one must match (the scheduler's contract); several is ambiguous.
    """
    tiers = (
        [c for c in found if c.allocated],
        [c for c in found if not c.allocated and marks(c.pod.annotations)],
        [c for c in found if not c.allocated and not marks(c.pod.annotations)],
    )
    for tier in tiers:
        if len(tier) == 1:
            return tier[0], []
        if tier:
            return None, list(tier)
    return None, []


def devices_marked(annotations: Mapping[str, str]) -> dict[str, dict[str, list[str]]]:
    """Container → resource → the device ids the plugin recorded as actually allocated."""
    try:
        doc = json.loads(annotations.get(ALLOCATION, "{}"))
    except ValueError:
        return {}
    devices = doc.get("devices") if isinstance(doc, dict) else None
    if not isinstance(devices, dict):
        return {}
    return {
        str(c): {str(r): [str(i) for i in ids] for r, ids in rs.items() if isinstance(ids, list)}
        for c, rs in devices.items()
        if isinstance(rs, dict)
    }


def with_mark(
    annotations: Mapping[str, str],
    at: str,
    container: str,
    resource: str,
    allocation_ids: Iterable[str],
    *,
    devices: Iterable[str] = (),
) -> dict[str, str] | None:
    """The annotations to patch so the pod records ``container`` answered for ``resource``
    with ``allocation_ids`` and the Runtime ``devices`` it got (contracts.md); None when the
    pod's current mark already has it or holds other allocations for that container (someone
    else claimed it)."""
    done = marks(annotations)
    ids = tuple(allocation_ids)
    mine = done.get(container, {})
    if resource in mine or any(v != ids for v in mine.values()):
        return None
    done[container] = {**mine, resource: ids}
    got = devices_marked(annotations)
    if devices:
        got.setdefault(container, {})[resource] = sorted(set(devices))
    doc: dict[str, Any] = {
        "containers": {c: {r: list(v) for r, v in rs.items()} for c, rs in done.items()}
    }
    if got:
        doc["devices"] = got
    return {ALLOCATED: at, ALLOCATION: json.dumps(doc, sort_keys=True)}


@dataclass(frozen=True)
class WholeIntent:
    """What the scheduler decided for whole devices on this node, as GetPreferredAllocation
    needs it: the kubelet's request names no pod, so the plugin matches on the units."""

    choice: tuple[str, ...] | None
    """The devices of the unique pending container asking ``size`` units of the resource, all
    of them available; None when no pod's decision fits, or several do."""
    reserved: frozenset[str]
    """Devices the scheduler gave out as shares on this node: a whole device taken from them
    would make those pods' Allocate fail."""
    ambiguous: tuple[tuple[PodView, str], ...] = ()
    """(pod, container) of the pending decisions that matched when several did."""


@dataclass(frozen=True)
class WholePending:
    pod: PodView
    container: str
    devices: tuple[str, ...]
    """The scheduler's whole devices for the container; empty for a pod of another scheduler."""


def whole_pending(
    pods: Iterable[PodView],
    node: str,
    resource: str,
    size: int,
    owned: Iterable[tuple[str, str]] = (),
) -> tuple[list[WholePending], list[WholePending]]:
    """(assigned, unassigned) containers on ``node`` asking ``size`` units of ``resource`` and
    not answered for it yet: not marked, not in ``owned`` ((pod uid, container) already holding
    a Runtime allocation of it), pod not ended. Unassigned ones are pods of other schedulers."""
    taken = set(owned)
    assigned, unassigned = [], []
    for pod in pods:
        if pod.ended or pod.deleted:
            continue
        done = marks(pod.annotations)
        text = pod.annotations.get(ASSIGNMENT)
        decided: Mapping[str, tuple[Share, ...]] | None = None
        if text is not None:
            try:
                a = parse(text)
            except BadAssignment:
                a = None
            if a is not None and a.node == node:
                decided = a.containers
        for name, requests in pod.requests.items():
            if requests.get(resource) != size or resource in done.get(name, {}):
                continue
            if (pod.uid, name) in taken:
                continue
            if decided is None:
                unassigned.append(WholePending(pod, name, ()))
                continue
            ids = tuple(sorted(s.id for s in decided.get(name, ()) if s.whole))
            if len(ids) == size:
                assigned.append(WholePending(pod, name, ids))
    return assigned, unassigned


def whole_intent(
    pods: Iterable[PodView],
    node: str,
    resource: str,
    *,
    size: int,
    available: Iterable[str],
    must_include: Iterable[str] = (),
) -> WholeIntent:
    """The scheduler's decision for a whole-device allocation of ``size`` units on ``node``:
    the unique pending assigned container asking exactly that (the scheduler's contract keeps
    it unique); none when zero or several match or its devices are not all available."""
    pods = list(pods)
    free, must = set(available), set(must_include)
    reserved: set[str] = set()
    for pod, a in on_node(pods, node):
        if pod.ended or pod.deleted:
            continue
        for shares in a.containers.values():
            reserved.update(s.id for s in shares if not s.whole)
    assigned, _ = whole_pending(pods, node, resource, size)
    if len(assigned) > 1:
        return WholeIntent(None, frozenset(reserved), tuple((w.pod, w.container) for w in assigned))
    if not assigned:
        return WholeIntent(None, frozenset(reserved))
    ids = assigned[0].devices
    if not set(ids) <= free | must or not must <= set(ids):
        return WholeIntent(None, frozenset(reserved))
    return WholeIntent(ids, frozenset(reserved))


def whole_owner(
    pods: Iterable[PodView],
    node: str,
    resource: str,
    device_ids: Iterable[str],
    owned: Iterable[tuple[str, str]] = (),
) -> tuple[WholePending | None, list[WholePending]]:
    """The container a whole-device Allocate of ``device_ids`` is for, or (None, ambiguous).

    First the pending assigned container whose decision is exactly these devices; else the
    unique pending assigned container asking as many; else, with no assigned one, the unique
    pod of another scheduler asking as many and holding none yet. Unknown otherwise: the caller
    allocates under a provisional owner and reconcile re-owns it from pod-resources.
    """
    ids = tuple(sorted(set(device_ids)))
    assigned, unassigned = whole_pending(pods, node, resource, len(ids), owned)
    exact = [w for w in assigned if w.devices == ids]
    if len(exact) == 1:
        return exact[0], []
    if len(assigned) == 1:
        return assigned[0], []
    if assigned:
        return None, assigned
    if len(unassigned) == 1:
        return unassigned[0], []
    return None, unassigned


def refusals(
    pods: Iterable[PodView],
    node: str,
    resource: str,
    kind: str,
    *,
    units: int,
    paid: Mapping[str, str] | None = None,
) -> list[tuple[PodView, str]]:
    """The pods a shared Allocate of ``units`` of ``resource`` found no decision for, with why
    each one's assignment cannot be followed: containers on ``node`` asking exactly that, not
    answered for it, pod not ended, whose assignment is missing, not readable, for another
    node, or not what the container requests. The kubelet names no pod, so these are the ones
    the refusal may be about; each should show it (an Event).
    """
    out = []
    for pod in pods:
        if pod.ended or pod.deleted:
            continue
        done = marks(pod.annotations)
        asking = [
            name
            for name, requests in pod.requests.items()
            if requests.get(resource) == units and resource not in done.get(name, {})
        ]
        if not asking:
            continue
        why = _why_not(pod, node=node, resource=resource, kind=kind, asking=asking, paid=paid or {})
        if why:
            out.append((pod, why))
    return out


def _why_not(
    pod: PodView,
    *,
    node: str,
    resource: str,
    kind: str,
    asking: Sequence[str],
    paid: Mapping[str, str],
) -> str:
    text = pod.annotations.get(ASSIGNMENT)
    if text is None:
        return (
            f"{resource}: the pod has no {ASSIGNMENT}; shared GPUs need the decision of "
            "lj-runtimekit-scheduler (schedulerName lj-runtimekit-scheduler)"
        )
    try:
        a = parse(text)
    except BadAssignment as e:
        return f"{resource}: {e}"
    if a.node != node:
        return f"{resource}: {ASSIGNMENT} is for node {a.node!r}, the pod runs on {node!r}"
    for name in asking:
        shares = a.containers.get(name)
        if shares is None:
            return f"{resource}: {ASSIGNMENT} has no decision for container {name}"
        if not _shared(shares):
            return f"{resource}: {ASSIGNMENT} gives container {name} no shared device"
        asked = pod.requests.get(name, {})
        for k, r in {kind: resource, **paid}.items():
            if units_asked(shares, k) != asked.get(r, 0):
                return (
                    f"{resource}: container {name} requests {asked.get(r, 0)} {r}, its "
                    f"{ASSIGNMENT} gives {units_asked(shares, k)}"
                )
    return ""
