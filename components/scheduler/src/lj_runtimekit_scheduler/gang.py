"""Gangs: pods placed all or nothing, packed into the smallest network-topology domain.

A gang is a JobSet run (label ``jobset.sigs.k8s.io/jobset-name`` + restart attempt), an
explicit pod group (annotation ``lj-runtimekit-scheduler/pod-group``), or the pods of an upstream
PodGroup (``scheduling.k8s.io/v1beta1``, the pod's ``spec.schedulingGroup``; the spec field wins
over the annotations). An annotation gang's size comes from the annotation
``lj-runtimekit-scheduler/pod-group-size`` or, for JobSets, from the label
``jobset.sigs.k8s.io/replicatedjob-replicas``; a PodGroup's from its object (``minCount``, the
scheduler reads it: :class:`~.model.PodGroup`). Nothing is held while a gang is incomplete, and
a joint placement is found and assumed in one step, so competing gangs cannot deadlock.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from .model import POD_GROUP_ANNOTATION, POD_GROUP_SIZE_ANNOTATION, Pod

JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
JOBSET_RESTARTS = "jobset.sigs.k8s.io/restart-attempt"
JOBSET_REPLICAS = "jobset.sigs.k8s.io/replicatedjob-replicas"
EXCLUSIVE_TOPOLOGY = "alpha.jobset.sigs.k8s.io/exclusive-topology"
#: Larger than any cluster's pod count (the apiserver's own scale target is 150k pods): a size
#: beyond it is a typo or an attack, not a gang that could ever be complete.
MAX_GANG_SIZE = 100_000


@dataclass(frozen=True)
class GangId:
    key: str
    size: int = field(compare=False)
    """What this member says the size is. Not part of the gang's identity: members that
    disagree are still one gang (see :func:`agreed_size`), never two that each wait forever."""
    topology: str | None = None
    """A node label the whole gang must share (JobSet's exclusive-topology)."""
    group: str = ""
    """``namespace/name`` of the PodGroup whose pods these are (empty: an annotation gang).
    Its policy and size are the PodGroup object's: ``size`` is 0 here."""


def gang_of(pod: Pod) -> GangId | None:
    """The gang ``pod`` belongs to, or None for a lone pod (or a malformed size). A pod of a
    PodGroup always has one, whatever the group's policy (the scheduler reads it)."""
    if pod.scheduling_group:
        name = pod.scheduling_group
        return GangId(f"{pod.namespace}/podgroup/{name}", 0, None, f"{pod.namespace}/{name}")
    group = pod.annotation(POD_GROUP_ANNOTATION)
    jobset = pod.label(JOBSET_NAME)
    if group:
        key = f"{pod.namespace}/group/{group}"
    elif jobset:
        key = f"{pod.namespace}/jobset/{jobset}/{pod.label(JOBSET_RESTARTS) or '0'}"
    else:
        return None
    raw = pod.annotation(POD_GROUP_SIZE_ANNOTATION) or (
        pod.label(JOBSET_REPLICAS) if jobset else None
    )
    size = gang_size(raw)
    if size is None or size < 2:
        return None
    return GangId(key, size, pod.annotation(EXCLUSIVE_TOPOLOGY))


SIZE_RULE = "the largest size any member gives applies: nothing is placed until that many are here"


def agreed_size(members: Sequence[Pod]) -> tuple[int, dict[int, list[str]]]:
    """The size the gang of ``members`` is placed at, and each size they give → the pods giving
    it (more than one entry when they disagree).

    Guarantees: the largest size given (:data:`SIZE_RULE`), so every member's all-or-nothing
    wish holds (a member asking for 4 together is never placed with only 2), and the result
    does not depend on which member is tried first.
    """
    sizes: dict[int, list[str]] = {}
    for pod in members:
        gid = gang_of(pod)
        if gid is not None:
            sizes.setdefault(gid.size, []).append(pod.name)
    for names in sizes.values():
        names.sort()
    return (max(sizes) if sizes else 0), dict(sorted(sizes.items()))


def size_conflict(key: str, sizes: Mapping[int, Sequence[str]]) -> str:
    """The Warning every member of a gang whose members disagree on its size gets."""
    shown = "; ".join(
        f"{size}: {', '.join(names[:5])}{' …' if len(names) > 5 else ''}"
        for size, names in sizes.items()
    )
    return (
        f"gang {key}: members disagree on its size ({shown}); {SIZE_RULE} ({max(sizes)}). "
        f"Give every member the same {POD_GROUP_SIZE_ANNOTATION} (or {JOBSET_REPLICAS})"
    )


def invalid_size(pod: Pod) -> str | None:
    """Why the pod's gang size is refused (its group is then ignored), or None when it is fine."""
    if pod.scheduling_group or not (pod.annotation(POD_GROUP_ANNOTATION) or pod.label(JOBSET_NAME)):
        return None
    for key, raw in (
        (POD_GROUP_SIZE_ANNOTATION, pod.annotation(POD_GROUP_SIZE_ANNOTATION)),
        (JOBSET_REPLICAS, pod.label(JOBSET_REPLICAS)),
    ):
        if raw and gang_size(raw) is None:
            shown = raw if len(raw) <= 40 else raw[:40] + "…"
            return (
                f"{key}={shown!r} is not a gang size (an integer from 1 to {MAX_GANG_SIZE}); "
                "the pod is scheduled alone, not all-or-nothing with its group"
            )
    return None


def gang_size(raw: str | None) -> int | None:
    """The size a gang annotation or label gives: None when absent or not a plain integer of
    1 to :data:`MAX_GANG_SIZE` (bounded work: ``int()`` of a 100k-digit text is slow)."""
    if not raw:
        return None
    text = raw.strip()
    if not text.isascii() or not text.isdigit() or len(text) > 6:
        return None
    size = int(text)
    return size if 1 <= size <= MAX_GANG_SIZE else None


def domains(
    node_labels: Mapping[str, Mapping[str, str]],
    levels: Sequence[str],
    required: str | None,
    holding: Collection[str] = (),
) -> list[list[str]]:
    """Candidate node sets, smallest topology level first, then the whole cluster.

    ``levels`` are label keys widest first (block, rack). A domain of a level lies inside one
    domain of every wider level: racks are told apart by their block too, so a rack label reused
    in two blocks (or cut across by them) never makes one domain of both; a node without a block
    label still has its rack. Nodes lacking a level are not in any domain of it. With
    ``required`` only domains of that label are offered. ``holding`` are the nodes of members
    already placed (a member whose binding failed comes back alone): only domains containing
    all of them are offered, so the rest joins its gang rather than the smallest free domain.
    """
    if required:
        order = [[required]]
    else:
        order = [list(levels[: i + 1]) for i in reversed(range(len(levels)))]
    out: list[list[str]] = []
    for keys in order:
        groups: dict[tuple[str, ...], list[str]] = {}
        for name, labels in node_labels.items():
            if keys[-1] in labels:
                groups.setdefault(tuple(labels.get(k, "") for k in keys), []).append(name)
        out.extend(sorted(groups.values(), key=lambda g: (len(g), g[0])))
    if not required:
        out.append(sorted(node_labels))
    if holding:
        held = set(holding)
        out = [d for d in out if held.issubset(d)]
    return out


def may_hold(need: Mapping[str, int], free: Sequence[Mapping[str, int]]) -> bool:
    """Whether nodes with ``free`` capacity could hold requests summing to ``need``: the summed
    free capacity covers every resource. Necessary, not sufficient (a pod fits on one node):
    it only spares walking a domain that is too small, member by member."""
    return all(sum(f.get(r, 0) for f in free) >= n for r, n in need.items() if n > 0)


Place = Callable[[Pod, list[str]], str | None]
"""Try one member on the given nodes; assume it and return its node, or None."""


def place_gang(
    members: Sequence[Pod],
    candidates: list[list[str]],
    place: Place,
    undo: Callable[[Pod], None],
    at_least: int | None = None,
) -> dict[str, str] | None:
    """The first domain that takes every member: uid → node; else None with nothing held.

    With ``at_least`` (a PodGroup's minCount less the members already placed), a domain that
    takes every member still comes first; failing that, the first one taking at least that
    many (and as many as it can) does: the rest stay pending and join them later, as
    kube-scheduler's PodGroup cycle does."""
    ordered = sorted(members, key=lambda p: p.name)
    for nodes in candidates:
        if (result := _place_in(ordered, nodes, place, undo, len(ordered))) is not None:
            return result
    if at_least is None or at_least >= len(ordered):
        return None
    for nodes in candidates:
        if (result := _place_in(ordered, nodes, place, undo, max(at_least, 1))) is not None:
            return result
    return None


def _place_in(
    members: Sequence[Pod], nodes: list[str], place: Place, undo: Callable[[Pod], None], need: int
) -> dict[str, str] | None:
    """Place members in ``nodes`` until one fails (``need`` is all of them) or all were tried;
    the placement if it has at least ``need``, else None with nothing held."""
    placed: list[Pod] = []
    result: dict[str, str] = {}
    for i, pod in enumerate(members):
        if len(placed) + len(members) - i < need:
            break  # too few left to reach need
        node = place(pod, nodes)
        if node is None:
            if need == len(members):
                break
            continue
        placed.append(pod)
        result[pod.uid] = node
    if len(result) >= need:
        return result
    for pod in placed:
        undo(pod)
    return None
