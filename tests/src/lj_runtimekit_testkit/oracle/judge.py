"""Verdicts of both schedulers on one case, compared with each other and with the checker.

For a case run under both schedulers (each on its own copy of the same state):

1. kube-scheduler against the checker — its placement must be one the rules allow, a refusal
   must leave no node the rules allow and its counts per reason must be the checker's. A
   disagreement here is the harness's (the checker's) own bug: the checker is only trusted while
   kube-scheduler agrees with it.
2. ours against kube-scheduler — bound or not must agree; a refusal must give the same counts
   per reason (kube-scheduler's words are the reference; our plugin prefixes are stripped; when
   ours lists only its eight most frequent reasons, those eight are compared); the same number
   of nodes.
3. ours against the checker — every placement must satisfy every rule.

GPU cases run under ours only, and are judged by :mod:`.gpu` instead.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from lj_runtimekit_testkit.oracle import checker, messages
from lj_runtimekit_testkit.oracle.cases import Case, Copy
from lj_runtimekit_testkit.oracle.messages import Refusal

Json = dict[str, Any]

BOUND, REFUSED, GATED, PRESET, UNDECIDED = "bound", "refused", "gated", "preset", "undecided"


@dataclass
class Observed:
    """What one scheduler did with one probe."""

    copy: Copy
    pod: Json
    """The probe as created (with its uid)."""
    verdict: str = UNDECIDED
    node: str | None = None
    refusal: Refusal | None = None
    flipped: str = ""
    """Set when a later look contradicts the verdict (a refused pod bound after all)."""

    def describe(self) -> str:
        if self.verdict == BOUND:
            return f"bound to {self.node}"
        if self.refusal is not None:
            return f"{self.verdict}: {self.refusal.raw}"
        return self.verdict


@dataclass(frozen=True)
class Snapshot:
    """The cluster as both schedulers saw it when the probes were created."""

    nodes: tuple[Json, ...]
    pods: tuple[Json, ...]


@dataclass
class Finding:
    case: Case
    what: str
    """``checker`` (the harness disagrees with kube-scheduler), ``verdict``, ``reason``,
    ``wording``, ``placement``, ``isolation``, ``undecided``."""
    detail: str
    observed: list[Observed] = field(default_factory=list)

    def report(self) -> str:
        seen = "\n".join(f"  {o.copy.who}: {o.describe()}" for o in self.observed)
        return f"[{self.what}] {self.detail}\n{seen}\n{self.case.describe()}"


Checker = Callable[[Json, Sequence[Json], Sequence[Json]], checker.Expectation]


def _placement(o: Observed, snap: Snapshot, who: str) -> list[str]:
    assert o.node is not None
    bad = checker.placement_violations(o.pod, o.node, snap.nodes, snap.pods)
    return [f"{who} placed it on {o.node} against the rules: {'; '.join(bad)}"] if bad else []


def _counts_differ(ours: Refusal, kube: Refusal) -> str | None:
    if ours.pod_level is not None or kube.pod_level is not None:
        if ours.pod_level != kube.pod_level:
            return f"pod-level refusal: ours {ours.pod_level!r}, kube-scheduler {kube.pod_level!r}"
        return None
    if ours.nodes != kube.nodes:
        return f"ours counted {ours.nodes} nodes, kube-scheduler {kube.nodes}"
    if ours.more:
        wrong = {r: n for r, n in ours.counts.items() if kube.counts.get(r) != n}
        return f"listed reasons differ: {wrong} vs {dict(kube.counts)}" if wrong else None
    if ours.counts != kube.counts:
        return f"ours {dict(ours.counts)}, kube-scheduler {dict(kube.counts)}"
    return None


def _verdict_of(expected: checker.Expectation) -> str:
    if expected.gated:
        return GATED
    return BOUND if expected.feasible else REFUSED


def judge_pair(
    case: Case,
    kube: Observed,
    ours: Observed,
    snap: Snapshot,
    expect: Checker = checker.expect,
) -> list[Finding]:
    """Every disagreement of one compared case (empty: the case passed)."""
    found: list[Finding] = []

    def add(what: str, detail: str) -> None:
        found.append(Finding(case, what, detail, [kube, ours]))

    for o in (kube, ours):
        if o.verdict == UNDECIDED:
            add("undecided", f"{o.copy.who}: no decision within the deadline")
        if o.flipped:
            add("isolation", f"{o.copy.who}: {o.flipped}")
    if found:
        return found
    if PRESET in (kube.verdict, ours.verdict):
        if kube.verdict != ours.verdict:
            add("verdict", "a pod created with spec.nodeName was handled by a scheduler")
        return found
    k_exp = expect(kube.pod, snap.nodes, snap.pods)
    o_exp = expect(ours.pod, snap.nodes, snap.pods)
    # 1. kube-scheduler against the checker: the checker's own trustworthiness
    if kube.verdict != _verdict_of(k_exp):
        add(
            "checker",
            f"the checker expects {_verdict_of(k_exp)} "
            f"(feasible: {sorted(k_exp.feasible)}), kube-scheduler {kube.verdict}",
        )
    elif kube.verdict == BOUND:
        for why in _placement(kube, snap, "kube-scheduler"):
            add("checker", why)
    elif kube.verdict == REFUSED and kube.refusal is not None:
        predicted = Refusal("", len(snap.nodes), k_exp.histogram(), pod_level=k_exp.prefilter)
        if (diff := _counts_differ(predicted, kube.refusal)) is not None:
            add("checker", f"the checker's counts differ from kube-scheduler's: {diff}")
    # 2. ours against kube-scheduler
    if ours.verdict != kube.verdict:
        add("verdict", f"ours {ours.verdict}, kube-scheduler {kube.verdict}")
    elif (
        ours.verdict == REFUSED
        and ours.refusal is not None
        and kube.refusal is not None
        and (diff := _counts_differ(ours.refusal, kube.refusal)) is not None
    ):
        same_kinds = messages.kinds(ours.refusal.counts) == messages.kinds(kube.refusal.counts)
        same_nodes = ours.refusal.nodes == kube.refusal.nodes
        add("wording" if same_kinds and same_nodes else "reason", diff)
    # 3. ours against the checker
    if ours.verdict == BOUND:
        for why in _placement(ours, snap, "ours"):
            add("placement", why)
    elif ours.verdict == REFUSED and o_exp.feasible and kube.verdict != REFUSED:
        add("verdict", f"ours refused; the rules allow {sorted(o_exp.feasible)}")
    return found


def summary(findings: Sequence[Finding]) -> Counter[str]:
    return Counter(f.what for f in findings)
