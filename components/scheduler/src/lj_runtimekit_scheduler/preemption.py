"""Preemption's decisions, pure: which pods to evict on a node, and which node's eviction is
the least harm. The plugin (``plugins/default_preemption.py``) supplies the fit test.

As kube-scheduler's DefaultPreemption: a pod may evict only pods of lower priority; on a node,
all of them are taken off and the pod must fit then; they are given back one by one, most
important first (higher priority, then started earlier), those breaking a PodDisruptionBudget
before the others, and each one the pod still fits beside stays. Of the nodes where that works,
the one with the fewest budgets broken wins, then the lowest highest victim priority, the
smallest priority sum, the fewest victims, the latest start of its most important victims.

Ours besides (docs in the README):

- a *unit* is what is evicted as one: a pod, or a whole gang (every member, wherever it runs,
  counted as its members) — a gang's member is never a victim alone;
- GPU-aware: a device pod also tries giving back first the pods that do not touch one device
  (or one NVLink island, one NUMA node) of the node, so the victims are those holding the
  device it will get; of these ways the one disturbing the fewest devices wins after budgets
  and the highest victim priority, and across nodes the same comes after them too — a whole
  GPU is freed by evicting the pod on it, not shares spread over three GPUs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from . import budgets
from .gpu import Choice
from .model import Pod

NO_VICTIMS = "No preemption victims found for incoming pod"
NOT_HELPFUL = "Preemption is not helpful for scheduling"
NEVER = "not eligible due to preemptionPolicy=Never."
TERMINATING = "not eligible due to a terminating pod on the nominated node."
"""kube-scheduler's words, in FailedScheduling after ``preemption:``."""


def started(pod: Pod) -> float:
    """When the pod started (POSIX seconds); one not started yet (or with a time that does not
    parse) counts as started now, the least important of its priority (kube-scheduler's
    ``GetPodStartTime``)."""
    try:
        return datetime.fromisoformat(pod.started).timestamp()
    except ValueError:
        return float("inf")


@dataclass(frozen=True)
class Unit:
    """Pods evicted as one: a lone pod, or every member of a gang."""

    pods: tuple[Pod, ...]
    here: frozenset[str] = frozenset()
    """uids of those on the node being looked at."""
    devices: frozenset[str] = frozenset()
    """Devices those hold on that node."""

    @property
    def priority(self) -> int:
        return max(p.priority for p in self.pods)

    @property
    def started(self) -> float:
        return min(started(p) for p in self.pods)

    def importance(self) -> tuple[int, float]:
        """Sorts most important first: higher priority, then started earlier."""
        return (-self.priority, self.started)


@dataclass(frozen=True)
class Victims:
    """What evicting some units costs; ordered (by :meth:`rank`) least harm first."""

    units: tuple[Unit, ...]
    violations: int = 0
    """PodDisruptionBudgets broken (units breaking at least one)."""

    @property
    def pods(self) -> tuple[Pod, ...]:
        return tuple(p for u in self.units for p in u.pods)

    @property
    def devices(self) -> frozenset[str]:
        return frozenset(d for u in self.units for d in u.devices)

    def rank(self) -> tuple[int, int, int, int, int, float]:
        """kube-scheduler's ``pickOneNodeForPreemption`` order, with the number of devices the
        victims hold there (the fragmentation caused) after the highest priority: smaller is
        less harm."""
        pods = self.pods
        if not pods:
            return (self.violations, -(2**62), 0, 0, 0, 0.0)
        top = max(p.priority for p in pods)
        total = sum(p.priority + 2**31 for p in pods)  # kube's shift: negative priorities count
        earliest = min(started(p) for p in pods if p.priority == top)
        return (self.violations, top, len(self.devices), total, len(pods), -earliest)


Fits = Callable[[frozenset[int]], bool]
"""Whether the pod fits on the node with the units of these indices taken off."""


def reprieve(order: Sequence[int], every: Iterable[int], fits: Fits) -> list[int]:
    """Give back the units of ``order`` one by one; those the pod does not fit beside are the
    victims (in ``order``'s order)."""
    off = set(every)
    victims = []
    for i in order:
        off.discard(i)
        if not fits(frozenset(off)):
            off.add(i)
            victims.append(i)
    return victims


def select(
    units: Sequence[Unit],
    all_budgets: Iterable[budgets.Budget],
    fits: Fits,
    targets: Sequence[frozenset[str]] = (),
    least: int = 0,
) -> Victims | None:
    """The victims on one node: None when the pod does not fit even with every unit off.

    ``targets`` are device groups of the node (each device, island, NUMA node) to try freeing
    first, for a pod that wants devices; they are not tried when kube-scheduler's own way already
    evicts a single unit disturbing no more than ``least`` devices (the fewest the pod needs).
    Guarantees: every unit returned is needed in its way
    of giving back (the pod did not fit with it given back after those before it); units that
    break a budget are given back first; a unit is returned whole or not at all; of the ways,
    the one of least :meth:`Victims.rank` (the first of equals: kube-scheduler's own order)."""
    every = range(len(units))
    if not fits(frozenset(every)):
        return None
    order = sorted(every, key=lambda i: units[i].importance())
    bad, good = budgets.violating([units[i].pods for i in order], list(all_budgets))
    breaking = [order[i] for i in bad]
    keeping = [order[i] for i in good]
    ways = [breaking + keeping]
    for group in targets:
        way = _off_first(breaking, units, group) + _off_first(keeping, units, group)
        if way not in ways:
            ways.append(way)
    found: Victims | None = None
    for k, way in enumerate(ways):
        chosen = sorted(reprieve(way, every, fits), key=lambda i: units[i].importance())
        broken = sum(1 for i in chosen if i in breaking)
        victims = Victims(tuple(units[i] for i in chosen), broken)
        if found is None or victims.rank() < found.rank():
            found = victims
        if k == 0 and len(victims.units) == 1 and len(victims.devices) <= least:
            break  # one victim on as few devices as it could be: little left to gain
    return found


def _off_first(order: list[int], units: Sequence[Unit], group: frozenset[str]) -> list[int]:
    """``order`` with the units holding none of ``group``'s devices first (each part kept in
    order): given back first, so the victims are those on ``group``."""
    off = [i for i in order if not units[i].devices & group]
    return off + [i for i in order if units[i].devices & group]


@dataclass(frozen=True)
class Candidate:
    """A node (or, for a gang, nodes) where evicting ``victims`` makes room."""

    node: str
    victims: Victims
    choice: Choice | None = None
    """The devices the pod gets there (GpuFit's choice without the victims)."""
    placements: tuple[tuple[Pod, str, Choice | None], ...] = ()
    """For a gang: every member's node and devices."""


def best(candidates: Iterable[Candidate]) -> Candidate | None:
    """The least harmful candidate (the first of equals: the order the nodes were tried)."""
    out: Candidate | None = None
    for c in candidates:
        if out is None or c.victims.rank() < out.victims.rank():
            out = c
    return out


def candidates_wanted(nodes: int, percentage: int = 10, absolute: int = 100) -> int:
    """How many candidate nodes a dry run looks for before it stops (kube-scheduler's
    ``minCandidateNodesPercentage`` 10 % and ``minCandidateNodesAbsolute`` 100)."""
    return min(nodes, max(nodes * percentage // 100, absolute))


def summary(reasons: dict[str, str], nodes: int) -> str:
    """``0/N nodes are available: 3 <reason>, ...`` over the nodes a dry run looked at, each
    node it did not reach counted as not helpful (kube-scheduler's FitError)."""
    counts: dict[str, int] = {}
    for r in reasons.values():
        counts[r] = counts.get(r, 0) + 1
    missing = nodes - len(reasons)
    if missing > 0:
        counts[NOT_HELPFUL] = counts.get(NOT_HELPFUL, 0) + missing
    parts = [f"{n} {r}" for r, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:8]]
    more = "" if len(counts) <= 8 else f", and {len(counts) - 8} other reasons"
    return f"0/{nodes} nodes are available: " + ", ".join(parts) + more + "."
