"""Reconcile decisions, table-driven: label, recorded status and Jobs in; the next step out."""

from __future__ import annotations

import pytest

from lj_runtimekit_controller import reconcile as r
from lj_runtimekit_controller.status import Status

NOW = 1_800_000_000.0
POLICY = r.Policy(retry_limit=3, backoff_s=10, backoff_max_s=300, max_active_jobs=5)


def job(
    action: str = "enable",
    phase: str = "running",
    attempt: int = 1,
    uid: str = "u1",
    finished: float | None = None,
) -> r.JobView:
    return r.JobView(
        f"lj-agent-n-{action}",
        uid,
        action,
        attempt,
        phase,
        NOW - 100,
        finished if finished is not None else (None if phase == "running" else NOW - 50),
    )


def status(
    action: str = "enable",
    result: str = "succeeded",
    uid: str = "u1",
    attempt: int = 1,
    time: str = "2027-01-15T08:00:00Z",
) -> Status:
    return Status(action, result, time, f"lj-agent-n-{action}", uid, attempt)


def node(desired: str = "enable", st: Status | None = None, retry: bool = False) -> r.NodeView:
    return r.NodeView("n", desired, st, retry)


CASES = [
    ("new-label-creates-enable", node(), [], 0, r.Create("enable", 1)),
    ("never-labelled-is-in-sync", node("disable"), [], 0, r.InSync()),
    ("enabled-and-recorded-is-in-sync", node(st=status()), [], 0, r.InSync()),
    ("label-removed-creates-disable", node("disable", status()), [], 0, r.Create("disable", 1)),
    ("running-job-waits", node(), [job()], 1, r.Wait("Job lj-agent-n-enable (enable) running")),
    (
        "label-flipped-mid-action-waits",
        node("disable"),
        [job()],
        1,
        r.Wait("Job lj-agent-n-enable (enable) running"),
    ),
    (
        "recorded-success-deletes-job",
        node(st=status()),
        [job(phase="succeeded")],
        0,
        r.Delete(job(phase="succeeded"), "result already recorded"),
    ),
    (
        "complete-job-recorded-failed-is-kept-while-backing-off",
        node(st=status(result="failed")),
        [job(phase="succeeded", finished=NOW - 4)],
        0,
        r.Wait("retry 2 of enable backing off", 6.0),
    ),
    (
        "complete-job-recorded-failed-is-retried-not-deleted",
        node(st=status(result="failed")),
        [job(phase="succeeded", finished=NOW - 11)],
        0,
        r.Create("enable", 2, replaces=job(phase="succeeded", finished=NOW - 11)),
    ),
    (
        "complete-job-recorded-failed-at-the-limit-waits-for-operator",
        node(st=status(result="failed", attempt=3)),
        [job(phase="succeeded", attempt=3)],
        0,
        r.Wait("enable failed 3 times; waiting for the operator"),
    ),
    (
        "failed-job-of-old-label-deleted",
        node("disable", status(result="failed")),
        [job(phase="failed")],
        0,
        r.Delete(job(phase="failed"), "label now asks for disable"),
    ),
    ("at-the-job-limit-waits", node(), [], 5, r.Wait("5 agent Jobs active, at the limit 5", 1.0)),
    (
        "exhausted-waits-for-operator",
        node(st=status(result="failed", attempt=3)),
        [job(phase="failed", attempt=3)],
        0,
        r.Wait("enable failed 3 times; waiting for the operator"),
    ),
    (
        "retry-annotation-restarts-at-one",
        node(st=status(result="failed", attempt=3), retry=True),
        [job(phase="failed", attempt=3)],
        0,
        r.Create("enable", 1, replaces=job(phase="failed", attempt=3), clear_retry=True),
    ),
    (
        "exhausted-job-deleted-by-operator-retries",
        node(st=status(result="failed", attempt=3)),
        [],
        0,
        r.Create("enable", 1),
    ),
    (
        "failure-after-backoff-retries",
        node(st=status(result="failed")),
        [job(phase="failed", finished=NOW - 11)],
        0,
        r.Create("enable", 2, replaces=job(phase="failed", finished=NOW - 11)),
    ),
    ("garbage-status-and-enable-creates", node(st=None), [], 0, r.Create("enable", 1)),
]


@pytest.mark.parametrize(("case", "n", "jobs", "active", "want"), CASES, ids=[c[0] for c in CASES])
def test_decide(case: str, n: r.NodeView, jobs: list[r.JobView], active: int, want: r.Step) -> None:
    assert r.decide(n, jobs, active, POLICY, NOW) == want


@pytest.mark.parametrize("phase", ["succeeded", "failed"])
def test_a_finished_job_is_recorded_first_with_the_retry_a_failure_would_get(phase: str) -> None:
    # Complete is not success: the result is judged from the agent's report when recorded.
    step = r.decide(node(), [job(phase=phase)], 0, POLICY, NOW)
    assert isinstance(step, r.Record)
    assert step.job == job(phase=phase)
    assert step.retry.startswith("try 2/3 at ")


def test_failure_not_recorded_is_recorded_with_its_retry_time() -> None:
    step = r.decide(node(), [job(phase="failed")], 0, POLICY, NOW)
    assert isinstance(step, r.Record)
    assert step.retry.startswith("try 2/3 at ")


def test_failure_within_backoff_waits_the_rest() -> None:
    step = r.decide(
        node(st=status(result="failed")), [job(phase="failed", finished=NOW - 4)], 0, POLICY, NOW
    )
    assert isinstance(step, r.Wait)
    assert step.reason == "retry 2 of enable backing off"
    assert step.after_s == pytest.approx(6.0)


def test_exhausted_record_says_how_to_retry() -> None:
    step = r.decide(node(), [job(phase="failed", attempt=3)], 0, POLICY, NOW)
    assert isinstance(step, r.Record)
    assert "delete Job lj-agent-n-enable" in step.retry


@pytest.mark.parametrize(
    ("attempt", "delay"),
    [(1, 10), (2, 20), (3, 40), (9, 300)],
    ids=["first", "second", "third", "capped"],
)
def test_backoff_doubles_up_to_the_cap(attempt: int, delay: float) -> None:
    assert POLICY.backoff(attempt) == delay


def test_never_a_create_while_a_job_of_the_node_runs() -> None:
    for desired in ("enable", "disable"):
        for st in (None, status(), status("disable"), status(result="failed")):
            for other in ("succeeded", "failed"):
                jobs = [job(phase="running"), job("disable", other, uid="u2")]
                step = r.decide(node(desired, st), jobs, 0, POLICY, NOW)
                assert isinstance(step, r.Wait)
