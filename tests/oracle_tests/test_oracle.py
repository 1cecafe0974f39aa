"""kube-scheduler as the oracle (issue 35 §2): generated cases run under kube-scheduler and our
scheduler on identical state on the real apiserver; verdicts, reasons and placements compared
with each other and with the independent checker. And the negative controls: the harness fails
when our scheduler breaks a known rule, and when the checker does.

The seed and the number of cases are in the test ids (``LJ_ORACLE_SEED``, ``LJ_ORACLE_CASES``);
a failure prints each finding with the case that shows it and the command that runs it again
(``python -m lj_runtimekit_testkit.oracle --seed S --only I``)."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from lj_runtimekit_testkit.cluster.handle import Cluster
from lj_runtimekit_testkit.oracle import checker, generate, report
from lj_runtimekit_testkit.oracle.judge import BOUND, REFUSED, judge_pair
from lj_runtimekit_testkit.oracle.ours import OursProcess
from lj_runtimekit_testkit.oracle.runner import Harness

from .conftest import CASES, SEED, open_harness

# The module's cases run in the first test's setup: about 150 s on a quiet 2-core machine, over
# 300 s (the suite's per-test guard) with other suites beside it. Every wait inside has its own
# deadline naming what it waited for; this guard is only for a hang.
pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]
RUN = f"seed{SEED}-{CASES}cases"
SABOTAGED = Path(__file__).with_name("sabotaged_scheduler.py")


@pytest.fixture(scope="module")
def compared(oracle: Harness) -> report.Report:
    """The generated cases of every compared family, run once for the file."""
    rep = report.run(oracle, SEED, CASES)
    print(rep.text(0), f"\noracle: {oracle.timings.line()}")
    return rep


@pytest.mark.parametrize("run", [RUN])
def test_both_schedulers_agree_on_every_generated_case(compared: report.Report, run: str) -> None:
    assert not compared.findings, compared.text(15)


def test_the_cases_exercised_every_verdict_and_reason(compared: report.Report) -> None:
    """A run that compares only easy cases proves little: about as many fit as do not, and
    every reason kube-scheduler gives for these families was given."""
    verdicts = compared.verdicts()
    for verdict in (BOUND, REFUSED):
        assert verdicts[verdict] > CASES // 5, verdicts
    for verdict in ("gated", "preset"):
        assert verdicts[verdict], verdicts
    seen = compared.refusal_kinds()
    for reason in (
        checker.AFFINITY,
        checker.PREFILTERED,
        checker.UNTOLERATED,
        checker.UNSCHEDULABLE,
        checker.PORTS,
        checker.TOO_MANY_PODS,
        "Insufficient cpu",
        "Insufficient memory",
        "Insufficient ephemeral-storage",
        "Insufficient example.com/widget",
    ):
        assert seen[reason], (reason, seen)


def _tolerating_everything(
    pod: Any, nodes: Sequence[Any], pods: Sequence[Any]
) -> checker.Expectation:
    spec = {**pod["spec"], "tolerations": [{"operator": "Exists"}]}
    return checker.expect({**pod, "spec": spec}, nodes, pods)


def test_a_checker_that_ignores_taints_is_caught(compared: report.Report) -> None:
    """Negative control of the checker: the same observations judged by a checker that lets
    every pod tolerate every taint disagree with kube-scheduler."""
    found: Counter[str] = Counter()
    for r in compared.results:
        if r.case.gpu:
            continue
        kube, ours = r.observed
        found.update(
            f.what for f in judge_pair(r.case, kube, ours, r.snapshot, _tolerating_everything)
        )
    assert found["checker"] >= 5, found


def test_gpu_cases_keep_the_contract(oracle: Harness) -> None:
    """Ours only: every GPU pod bound where the contract allows, with a decision naming what it
    asks, no device over-given, and no pod refused while a node had room."""
    rep = report.run(oracle, SEED, 48, ("gpu",))
    assert not rep.findings, rep.text(10)
    placed = Counter(o.verdict for r in rep.results for o in r.observed)
    assert placed[BOUND] > 20, placed
    assert placed[REFUSED] > 5, placed


@pytest.fixture(scope="module")
def sabotaged(cluster: Cluster, start_ours: Callable[..., OursProcess]) -> Iterator[Harness]:
    ours = start_ours("lj-oracle-sabotaged", (sys.executable, str(SABOTAGED)))
    harness = open_harness(cluster, ours)
    try:
        yield harness
    finally:
        harness.close()


def test_a_scheduler_that_ignores_no_schedule_taints_is_caught(sabotaged: Harness) -> None:
    """Negative control of the harness: our scheduler with TaintToleration deaf to NoSchedule
    (sabotaged_scheduler.py) places pods kube-scheduler refuses, and the harness says so."""
    rep = report.run(sabotaged, SEED, 32, ("taints",))
    kinds = Counter(f.what for f in rep.findings)
    assert kinds["verdict"], rep.text(3)
    assert kinds["placement"], rep.text(3)
    assert any(checker.UNTOLERATED in f.detail for f in rep.findings if f.what == "placement")
    # kube-scheduler's copies are untouched: the checker still agrees with it
    assert not kinds["checker"], rep.text(3)
    assert generate.generate(SEED, 0, ("taints",)).families == ("taints",)
