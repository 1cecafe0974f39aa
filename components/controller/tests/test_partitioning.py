"""The partition layout decisions (pure): when to run, wait, refuse, record and retry."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from lj_runtimekit_controller import partitioning as p
from lj_runtimekit_controller.partition_layout import LayoutError, from_yaml, parse_configmap
from lj_runtimekit_controller.reconcile import Create, Delete, InSync, JobView, Policy, Record, Wait

POLICY = Policy(retry_limit=3, backoff_s=10, backoff_max_s=300, max_active_jobs=5)
NOW = 1_000_000.0
LAYOUTS = parse_configmap(
    {
        "mig-2": "- {devices: [0, 1], mig: [3g.40gb, 3g.40gb]}",
        "bad": "- {devices: [0], mig: [3g.40gb], tdm: [50]}",
    }
)
WHERE = "ConfigMap kube-system/lj-runtimekit-partition-layouts"


def want(name: str | None = "mig-2") -> p.Desired | None:
    return p.desired(name, LAYOUTS, WHERE)


def job(phase: str = "succeeded", uid: str = "u1", attempt: int = 1, **kw: object) -> JobView:
    w = want()
    assert w is not None
    fields: dict[str, object] = {
        "name": "lj-agent-n-partition",
        "uid": uid,
        "action": "partition",
        "attempt": attempt,
        "phase": phase,
        "created": NOW - 100,
        "finished": NOW - 50 if phase != "running" else None,
        "layout": w.name,
        "digest": w.digest,
    }
    fields.update(kw)
    return JobView(**fields)  # type: ignore[arg-type]


def status(result: str, uid: str = "u1", attempt: int = 1, **kw: str) -> p.PartitionStatus:
    w = want()
    assert w is not None
    fields = {"layout": w.name, "digest": w.digest, "time": "1970-01-12T13:45:50Z"}
    fields.update(kw)
    return p.PartitionStatus(result=result, job_uid=uid, attempt=attempt, **fields)


def decide(
    w: p.Desired | None,
    s: p.PartitionStatus | None,
    jobs: list[JobView],
    retry: bool = False,
    active: int = 0,
) -> object:
    return p.decide(
        w,
        s,
        jobs,
        active=active,
        policy=POLICY,
        now=NOW,
        wait_interval=30,
        retry_requested=retry,
    )


def test_a_node_without_the_label_is_left_as_it_is() -> None:
    assert isinstance(decide(want(None), None, []), InSync)


def test_a_new_layout_runs_an_agent_job_and_its_success_is_recorded_then_in_sync() -> None:
    step = decide(want(), None, [])
    assert step == Create("partition", 1)
    assert isinstance(decide(want(), None, [job("running")]), Wait)
    assert isinstance(decide(want(), None, [job()]), Record)
    assert isinstance(decide(want(), status("succeeded"), [job()]), Delete)
    assert isinstance(decide(want(), status("succeeded"), []), InSync)


def test_an_edited_layout_is_a_new_layout_to_apply() -> None:
    edited = p.desired("mig-2", parse_configmap({"mig-2": "- {devices: [0], tdm: [50, 50]}"}), "")
    assert edited is not None
    assert edited.digest != status("succeeded").digest
    assert decide(edited, status("succeeded"), []) == Create("partition", 1)


def test_an_unknown_or_broken_layout_is_refused_once_and_never_run() -> None:
    for name, words in (("nope", "is not in ConfigMap"), ("bad", "MIG and TDM")):
        w = want(name)
        assert w is not None
        step = decide(w, None, [])
        assert isinstance(step, p.Refuse)
        assert words in step.desired.error
        refused = p.PartitionStatus(
            layout=name, digest=w.digest, result="refused", time="", message=w.error
        )
        assert isinstance(decide(w, refused, []), InSync)
    missing = p.desired("mig-2", None, WHERE)
    assert missing is not None
    assert "does not exist" in missing.error


def test_waiting_for_gpus_in_use_tries_again_every_interval_without_using_up_retries() -> None:
    waiting = status("waiting", attempt=1)
    finished_long_ago = job(finished=NOW - 31)
    assert decide(want(), waiting, [finished_long_ago]) == Create(
        "partition", 1, replaces=finished_long_ago
    )
    recent = job(finished=NOW - 10)
    step = decide(want(), waiting, [recent])
    assert isinstance(step, Wait)
    assert step.after_s == 20


def test_a_refusal_by_the_agent_waits_for_the_operator_and_a_retry_annotation_runs_again() -> None:
    refused = status("refused")
    assert isinstance(decide(want(), refused, [job()]), Delete)
    step = decide(want(), refused, [])
    assert isinstance(step, Wait)
    assert step.after_s is None
    assert decide(want(), refused, [], retry=True) == Create("partition", 1, clear_retry=True)


def test_a_failure_is_retried_with_backoff_up_to_the_limit() -> None:
    assert decide(want(), status("failed"), [job(finished=NOW - 11)]) == Create(
        "partition", 2, replaces=job(finished=NOW - 11)
    )
    step = decide(want(), status("failed"), [job(finished=NOW - 5)])
    assert isinstance(step, Wait)
    assert step.after_s == 5
    last = decide(want(), status("failed", attempt=3), [job(attempt=3)])
    assert isinstance(last, Wait)
    assert last.after_s is None


def test_a_label_changed_while_a_job_ran_deletes_the_old_job_after_recording_it() -> None:
    other = p.desired("other", parse_configmap({"other": ""}), "")
    assert isinstance(decide(other, None, [job()]), Record)
    assert isinstance(decide(other, status("waiting"), [job()]), Delete)


def test_the_limit_on_active_jobs_holds_partition_jobs_too() -> None:
    step = decide(want(), None, [], active=5)
    assert isinstance(step, Wait)
    assert step.after_s == 1.0


def test_outcomes_by_the_agents_reason() -> None:
    assert p.result_of(True, "Converged") == "succeeded"
    assert p.result_of(False, "AllocationsLive") == "waiting"
    assert p.result_of(False, "LayoutRefused") == "refused"
    assert p.result_of(False, "RuntimeTooOld") == "refused"
    assert p.result_of(False, "PartitioningFailed") == "failed"


def test_a_status_not_written_by_the_controller_reads_as_none() -> None:
    s = status("waiting")
    assert p.parse_status(s.to_json()) == s
    for text in ("", "x", "[]", '{"layout": "a"}', '{"layout":"a","digest":"d","result":"won"}'):
        assert p.parse_status(text) is None
    assert p.parse_status(s.to_json().replace('"attempt":1', '"attempt":-1')) is None


@settings(max_examples=200, deadline=None)
@given(
    name=st.sampled_from([None, "mig-2", "bad", "nope"]),
    result=st.sampled_from([None, *p.RESULTS]),
    phase=st.sampled_from([None, "running", "succeeded", "failed"]),
    same_uid=st.booleans(),
    retry=st.booleans(),
)
def test_never_a_job_while_one_runs_and_never_one_for_a_refused_layout(
    name: str | None, result: str | None, phase: str | None, same_uid: bool, retry: bool
) -> None:
    w = want(name)
    jobs = [] if phase is None else [job(phase)]
    s = None if result is None else status(result, uid="u1" if same_uid else "u0")
    step = decide(w, s, jobs, retry=retry)
    if phase == "running":
        assert isinstance(step, Wait)
    if isinstance(step, Create):
        assert w is not None
        assert w.layout is not None
    if w is not None and w.layout is None and not jobs:
        assert isinstance(step, (p.Refuse, InSync))


def test_layout_errors_are_values_of_the_parsed_configmap() -> None:
    assert isinstance(LAYOUTS["bad"], LayoutError)
    assert from_yaml("x", "").entries == ()
