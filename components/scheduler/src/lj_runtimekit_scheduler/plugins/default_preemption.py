"""DefaultPreemption (PostFilter): when a pod fits nowhere, find the node where evicting pods of
lower priority makes it fit, with the least harm (:mod:`..preemption`), re-running the cycle's
Filter chain — GpuFit's device choice included — on what-if copies of the node without them.

The plugin only decides: it writes its :class:`Outcome` in the CycleState, and the scheduler
nominates the pod (``status.nominatedNodeName``), marks and deletes the victims and records the
``Preempted`` Events. A gang preempts as a whole (:meth:`DefaultPreemption.preempt_gang`): one
domain where every member fits once the victims are gone, or nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .. import budgets, preemption
from ..framework import OK, CycleState, Filtering, Profile, Slot, Status, fail
from ..gang import gang_of
from ..gpu import Choice
from ..model import Device, Pod
from ..preemption import Candidate, Unit, Victims
from ..state import ClusterState, NodeInfo
from ..whatif import Sandbox

NAME = "DefaultPreemption"
NEVER_POLICY = "Never"
SINGLE_TARGETS = 3
"""Single devices tried per node: those whose pods matter least (the ways cost a reprieve each)."""
MAX_GANG_DOMAINS = 16
"""Domains a gang's dry run tries at most, in the order gangs are placed."""


@dataclass(frozen=True)
class Outcome:
    """What preemption decided for the pod of this cycle."""

    candidate: Candidate | None
    """Where to nominate it and whom to evict; None: preemption cannot help, its nomination
    (if any) is cleared, as kube-scheduler does."""


OUTCOME: Slot[Outcome] = Slot("DefaultPreemption/outcome")
"""Written by PostFilter; absent: nothing to do (the pod is not eligible, its nomination stays)."""
NOMINATED: Slot[str] = Slot("DefaultPreemption/nominated")
"""The node the pod was nominated to when its cycle began (the scheduler lifts the nomination
for the cycle, so the pod does not leave room for itself)."""


def _uids(units: Iterable[Unit]) -> set[str]:
    """Every pod of ``units``, wherever it runs (a gang's members on other nodes too: the
    plugins that count pods beyond the node see them go)."""
    return {p.uid for u in units for p in u.pods}


def _devices(choice: Choice | None) -> frozenset[str]:
    if choice is None:
        return frozenset()
    return frozenset(s.device for _, slices in choice.containers for s in slices)


def targets(devices: Sequence[Device], units: Sequence[Unit], multi: bool) -> list[frozenset[str]]:
    """The device groups worth freeing first: the :data:`SINGLE_TARGETS` devices whose pods
    matter least (lowest highest priority, fewest pods), and for a pod wanting several whole
    devices in one container (``multi``) each NVLink island and NUMA node as well."""
    on: dict[str, list[Unit]] = {}
    for u in units:
        for d in u.devices:
            on.setdefault(d, []).append(u)
    index = {d.id: d.index for d in devices}
    cheapest = sorted(
        on, key=lambda d: (max(u.priority for u in on[d]), len(on[d]), index.get(d, 0), d)
    )
    out: list[frozenset[str]] = [frozenset({d}) for d in cheapest[:SINGLE_TARGETS]]
    if not multi:
        return out
    for attr in ("island", "numa"):
        groups: dict[int, set[str]] = {}
        for dev in devices:
            key = getattr(dev, attr)
            if key >= 0:
                groups.setdefault(key, set()).add(dev.id)
        for g in groups.values():
            group = frozenset(g)
            if group & on.keys() and len(group) > 1 and group not in out:
                out.append(group)
    return out


class DefaultPreemption:
    NAME = NAME

    def __init__(self, state: ClusterState, percentage: int = 10, absolute: int = 100) -> None:
        self.state = state
        self.percentage, self.absolute = percentage, absolute
        self._offset = 0
        """Where the next dry run starts (kube-scheduler: a random offset), so every node gets
        its turn in a large cluster."""

    # -- one pod
    def post_filter(
        self, cs: CycleState, pod: Pod, reasons: dict[str, str], filtering: Filtering
    ) -> Status:
        why = self.ineligible(pod, cs.read(NOMINATED) or pod.nominated_node, filtering)
        if why:
            return fail(f"preemption: {why}")
        names = [n for n in reasons if n in self.state.nodes]
        found, looked = self.dry_run(pod, names, filtering, Sandbox(self.state), pod.priority)
        cs.write(OUTCOME, Outcome(found))
        if found is None:
            return fail("preemption: " + preemption.summary(looked, len(self.state.nodes)))
        return OK

    def ineligible(self, pod: Pod, nominated: str, filtering: Filtering | None) -> str:
        """Why ``pod`` may not preempt now (empty: it may): its preemptionPolicy is Never, or
        pods it preempted on its nominated node are still terminating (and that node is not
        ruled out for it for good)."""
        if pod.preemption_policy == NEVER_POLICY:
            return preemption.NEVER
        info = self.state.nodes.get(nominated) if nominated else None
        if info is None:
            return ""
        if filtering is not None and filtering.run(info).unresolvable:
            return ""
        for uid in info.pods:
            held = self.state.pods.get(uid)
            if held is None or held[0].priority >= pod.priority:
                continue
            if self.state.terminating_by_preemption(held[0]):
                return preemption.TERMINATING
        return ""

    def dry_run(
        self, pod: Pod, names: list[str], filtering: Filtering, sandbox: Sandbox, below: int
    ) -> tuple[Candidate | None, dict[str, str]]:
        """The least harmful candidate among ``names`` (kube-scheduler's ``DryRunPreemption``:
        it stops once it has enough candidates, one of them breaking no budget), and why each
        node it looked at is none."""
        if not names:
            return None, {}
        want = preemption.candidates_wanted(len(names), self.percentage, self.absolute)
        start = self._offset % len(names)
        found: list[Candidate] = []
        looked: dict[str, str] = {}
        clean = 0
        seen = 0
        for k in range(len(names)):
            node = names[(start + k) % len(names)]
            seen += 1
            got = self.on_node(pod, node, filtering, sandbox, below)
            if isinstance(got, str):
                looked[node] = got
                continue
            found.append(got)
            clean += got.victims.violations == 0
            if clean and len(found) >= want:
                break
        self._offset = start + seen
        ranked = sorted(found, key=lambda c: (c.victims.rank(), c.node))
        return (ranked[0] if ranked else None), looked

    def units(self, info: NodeInfo, below: int) -> list[Unit]:
        """What may be evicted from the node for a pod of priority ``below``: each lower-priority
        pod bound there, a gang's member only with its whole gang (every member below too; a
        PodGroup's, unless it is basic with ``disruptionMode: single``)."""
        out: list[Unit] = []
        gangs: set[str] = set()
        for uid in sorted(info.pods):
            held = self.state.pods.get(uid)
            if held is None or uid in self.state.assumed or held[0].priority >= below:
                continue  # placed in a dry run, or not bound yet, or not below
            pod = held[0]
            gid = gang_of(pod)
            if gid is None or not self.state.evicted_whole(gid):
                out.append(Unit((pod,), frozenset({uid}), _devices(held[2])))
                continue
            if gid.key in gangs:
                continue
            gangs.add(gid.key)
            members = [
                self.state.pods[u] for u in self.state.gangs.get(gid, {}) if u in self.state.pods
            ]
            if any(m[0].priority >= below or m[0].uid in self.state.assumed for m in members):
                continue
            here = [m for m in members if m[0].uid in info.pods]
            out.append(
                Unit(
                    tuple(m[0] for m in sorted(members, key=lambda m: m[0].key)),
                    frozenset(m[0].uid for m in here),
                    frozenset().union(*(_devices(m[2]) for m in here)),
                )
            )
        return out

    def on_node(
        self, pod: Pod, node: str, filtering: Filtering, sandbox: Sandbox, below: int
    ) -> Candidate | str:
        """The victims on ``node`` (kube-scheduler's ``SelectVictimsOnNode``), or why none."""
        info = sandbox.info(node)
        units = self.units(info, below)
        tried: dict[frozenset[int], bool] = {}

        def fits(off: frozenset[int]) -> bool:
            if off not in tried:
                tried[off] = filtering.run(*sandbox.trial(node, _uids(units[i] for i in off))).ok
            return tried[off]

        every = frozenset(range(len(units)))
        st = filtering.run(*sandbox.trial(node, _uids(units)))
        tried[every] = st.ok
        if not st.ok:
            if st.unresolvable:
                return preemption.NOT_HELPFUL
            return st.reason if units else preemption.NO_VICTIMS
        if not units:
            return preemption.NO_VICTIMS
        multi = any(d.gpus > 1 or d.ppus > 1 for d in pod.devices)
        groups = targets(info.devices, units, multi) if pod.wants_devices else []
        least = sum(d.gpus + d.ppus + (1 if d.shared else 0) for d in pod.devices)
        victims = preemption.select(units, self.state.budgets.values(), fits, groups, least)
        if victims is None:  # not reached: it fitted with every unit off
            return preemption.NOT_HELPFUL
        filtering.run(*sandbox.trial(node, _uids(victims.units)))  # GpuFit's choice there, last
        return Candidate(node, victims, filtering.cs.chosen(node))

    # -- a gang
    def preempt_gang(
        self,
        members: Sequence[Pod],
        domains: Sequence[list[str]],
        profile: Profile,
        nominated: dict[str, str],
    ) -> tuple[Candidate | None, str]:
        """One domain where every member fits once the victims are gone (all or nothing):
        the candidate (its ``placements``: each member's node and devices), or why none."""
        for m in members:
            why = self.ineligible(m, nominated.get(m.uid) or m.nominated_node, None)
            if why:
                return None, why
        below = min(m.priority for m in members)
        found: list[Candidate] = []
        why = preemption.NOT_HELPFUL
        for domain in domains[:MAX_GANG_DOMAINS]:
            got = self._gang_in(sorted(members, key=lambda p: p.name), domain, profile, below)
            if isinstance(got, str):
                why = got
                continue
            found.append(got)
            if got.victims.violations == 0:
                break
        best = preemption.best(found)
        return best, ("" if best else f"no domain fits the gang even without its victims ({why})")

    def _gang_in(
        self, members: Sequence[Pod], domain: list[str], profile: Profile, below: int
    ) -> Candidate | str:
        sandbox = Sandbox(self.state)
        chosen: list[Unit] = []
        placements: list[tuple[Pod, str, Choice | None]] = []
        for m in members:
            cs = CycleState()
            filtering = profile.filtering(cs, m, self.state)
            if isinstance(filtering, Status):
                return filtering.reason
            spot = next((n for n in domain if filtering.run(*sandbox.trial(n)).ok), None)
            choice = cs.chosen(spot) if spot else None
            if spot is None:
                cand, _ = self.dry_run(m, domain, filtering, sandbox, below)
                if cand is None:
                    return f"member {m.key} fits nowhere in the domain"
                for unit in cand.victims.units:
                    chosen.append(unit)
                    for p in unit.pods:
                        if (held := self.state.pods.get(p.uid)) is not None:
                            sandbox.remove(held[1], {p.uid})
                spot, choice = cand.node, cand.choice
            sandbox.place(m, spot, choice)
            placements.append((m, spot, choice))
        ordered = sorted(chosen, key=lambda u: u.importance())
        bad, _ = budgets.violating([u.pods for u in ordered], list(self.state.budgets.values()))
        return Candidate(
            placements[0][1], Victims(tuple(ordered), len(bad)), None, tuple(placements)
        )


def new(state: ClusterState) -> DefaultPreemption:
    return DefaultPreemption(state)
