"""Which Runtime allocations no live container holds. Pure: data in, decisions out, no I/O.

The kubelet never tells a device plugin that a pod ended; its pod-resources API says which pod
and container hold which device IDs. :func:`decide` compares the Runtime's allocations (of our
resources only) with that, and with the pods on the node when known (for uid and phase), and
says what to release and what to re-own. It guarantees:

- an allocation is released only after two consecutive trusted passes found it unheld, and only
  once it is older than the grace period (the kubelet records a container's devices only after
  Allocate returns, so a fresh allocation is briefly unheld); a pass where the Runtime or the
  kubelet did not answer is not made at all (the caller skips it), so it releases nothing;
- a container listed by pod-resources with the allocation's devices holds it, unless the pod of
  that namespace/name now has another uid (replaced) or ended (Succeeded/Failed);
- a pod the pod list shows alive with the allocation's uid, but that pod-resources does not list
  yet (a kubelet still syncing after its restart), keeps it;
- an allocation under the provisional owner is held by whichever container holds its devices,
  and is re-owned to it once that pod's uid is known;
- with ``listed_pods_hold`` (mode dra), a live pod that pod-resources lists keeps its
  allocations even when its container lists none of their devices: there a claim's devices are
  listed under ``dynamic_resources``, and a claim the DRA checkpoint lost (a corrupt file) must
  not be released under its running pod; a device-plugin pod from before the switch is released
  once it is gone, replaced or ended.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from .model import Allocation

#: Namespace of the provisional owner of a whole-device allocation whose pod is not known yet.
PROVISIONAL_NAMESPACE = "lj-runtimekit-unattributed"
TERMINAL_PHASES = ("Succeeded", "Failed")


@dataclass(frozen=True)
class Holding:
    """What pod-resources says one container holds of one resource."""

    namespace: str
    name: str
    container: str
    resource: str
    """Empty for a container that holds none of our resources (it still exists)."""
    device_ids: tuple[str, ...]


@dataclass(frozen=True)
class PodState:
    """A pod on the node as its pod list (kubelet /pods or the apiserver) shows it."""

    namespace: str
    name: str
    uid: str
    phase: str = ""
    deleted: bool = False

    @property
    def ended(self) -> bool:
        return self.phase in TERMINAL_PHASES


@dataclass(frozen=True)
class Memory:
    """What one pass leaves for the next."""

    first_seen: Mapping[str, float] = field(default_factory=dict)
    """Allocation id → when a pass first found it unheld, in the run of passes that have found
    it unheld since (a pass that finds it held forgets it)."""
    unheld: frozenset[str] = frozenset()
    """Allocations the last trusted pass found unheld."""


@dataclass(frozen=True)
class Verdict:
    allocation: Allocation
    reason: str


@dataclass(frozen=True)
class Decision:
    release: tuple[Verdict, ...]
    """Unheld in two passes in a row and older than the grace period."""
    waiting: tuple[Verdict, ...]
    """Unheld, kept until a later pass confirms."""
    reown: tuple[tuple[Allocation, tuple[str, str, str], str], ...]
    """(provisional allocation, (namespace, name, uid), container) of its real holder."""
    memory: Memory


def is_provisional(a: Allocation) -> bool:
    return a.pod[0] == PROVISIONAL_NAMESPACE


def _held_ids(
    holdings: Iterable[Holding],
) -> tuple[dict[tuple[str, str, str, str], set[str]], set[tuple[str, str]]]:
    by_container: dict[tuple[str, str, str, str], set[str]] = {}
    listed: set[tuple[str, str]] = set()
    for h in holdings:
        listed.add((h.namespace, h.name))
        if h.resource:
            by_container.setdefault((h.namespace, h.name, h.container, h.resource), set()).update(
                h.device_ids
            )
    return by_container, listed


def _holder_of(
    a: Allocation, held: Mapping[tuple[str, str, str, str], set[str]]
) -> tuple[str, str, str] | None:
    """(namespace, name, container) holding every device of a provisional allocation."""
    for (ns, name, container, resource), ids in sorted(held.items()):
        if resource == a.resource and set(a.device_ids) <= ids:
            return ns, name, container
    return None


def why_unheld(
    a: Allocation,
    held: Mapping[tuple[str, str, str, str], set[str]],
    listed: set[tuple[str, str]],
    pods: Mapping[tuple[str, str], PodState] | None,
    shared_resources: frozenset[str],
    *,
    listed_pods_hold: bool = False,
) -> str | None:
    """None when a live container holds ``a``; else why not."""
    ns, name, uid = a.pod
    if is_provisional(a):
        return None if _holder_of(a, held) else "no container holds its devices"
    pod = pods.get((ns, name)) if pods is not None else None
    if pod is not None and pod.uid != uid:
        return f"pod {ns}/{name} was replaced (uid {pod.uid}, allocation's {uid})"
    if pod is not None and pod.ended:
        return f"pod {ns}/{name} {pod.phase}"
    if a.shared:
        holds = any(held.get((ns, name, a.container, r)) for r in shared_resources)
    else:
        holds = set(a.device_ids) <= held.get((ns, name, a.container, a.resource), set())
    if holds:
        return None
    if pod is not None and not pod.deleted and (ns, name) not in listed:
        return None  # alive by its pod list, not listed by the kubelet yet: wait, never guess
    if (ns, name) not in listed:
        return f"pod {ns}/{name} is not on the node"
    if listed_pods_hold:
        return None
    return f"container {a.container} of {ns}/{name} does not hold {list(a.device_ids)}"


def decide(
    allocations: Sequence[Allocation],
    holdings: Sequence[Holding],
    pods: Sequence[PodState] | None,
    *,
    now: float,
    grace_s: float,
    memory: Memory,
    shared_resources: frozenset[str],
    listed_pods_hold: bool = False,
) -> Decision:
    """One trusted pass: ``allocations`` (ours only) against what the kubelet says is held."""
    held, listed = _held_ids(holdings)
    by_name = {(p.namespace, p.name): p for p in pods} if pods is not None else None
    # The grace period runs from the first pass that found an allocation unheld, not from when
    # it was first seen: a kubelet that has just restarted answers empty lists for a moment, and
    # passes woken back to back by its plugins' registrations must not release what its pods
    # still hold (seen on a real kubelet).
    first_seen: dict[str, float] = {}
    release: list[Verdict] = []
    waiting: list[Verdict] = []
    reown = []
    unheld: set[str] = set()
    for a in allocations:
        reason = why_unheld(
            a, held, listed, by_name, shared_resources, listed_pods_hold=listed_pods_hold
        )
        if reason is None:
            holder = _holder_of(a, held) if is_provisional(a) else None
            pod = by_name.get(holder[:2]) if holder and by_name is not None else None
            if holder is not None and pod is not None and not pod.ended:
                reown.append((a, (pod.namespace, pod.name, pod.uid), holder[2]))
            continue
        unheld.add(a.id)
        since = memory.first_seen.get(a.id, now) if a.id in memory.unheld else now
        first_seen[a.id] = since
        if a.id in memory.unheld and now - since >= grace_s:
            release.append(Verdict(a, reason))
        else:
            waiting.append(Verdict(a, reason))
    return Decision(
        tuple(release),
        tuple(waiting),
        tuple(reown),
        Memory(first_seen, frozenset(unheld)),
    )


def stale_whole(
    allocations: Iterable[Allocation], resource: str, ids: Iterable[str]
) -> list[Allocation]:
    """Allocations of ``resource`` still holding devices the kubelet hands out now.

    The kubelet never gives a live container's device to another container, so a holder of
    any of ``ids`` belongs to a container that is gone; it is released before allocating.
    """
    wanted = set(ids)
    return [
        a
        for a in allocations
        if a.resource == resource and not a.shared and wanted & set(a.device_ids)
    ]
