"""Issue 34 §6: the controller believes a node's status only when it is the very value it wrote
there from the agent Job it created, never from a node annotation alone."""

from __future__ import annotations

import pytest

from lj_runtimekit_controller import names, partitioning, reconcile, status, steps
from lj_runtimekit_controller.partition_layout import from_yaml

NOW = 1.8e9
LABEL = ("lj_runtimekit_enable", "true")


def _status(action: str, result: str = "succeeded", uid: str = "uid-1") -> str:
    return status.Status(
        action=action,
        result=result,
        time="2026-01-01T00:00:00Z",
        job=names.job_name("n", action),
        job_uid=uid,
        attempt=1,
    ).to_json()


def _step(
    annotations: dict[str, str],
    vouched: dict[str, str],
    *,
    enabled: bool = True,
    jobs: list[reconcile.JobView] | None = None,
    layout: partitioning.Desired | None = None,
) -> steps.NextStep:
    return steps.next_step(
        "n",
        {LABEL[0]: LABEL[1]} if enabled else {},
        annotations,
        jobs or [],
        layout,
        feature_label=LABEL,
        active=0,
        policy=reconcile.Policy(),
        now=NOW,
        wait_interval=30.0,
        vouched=vouched,
    )


@pytest.mark.parametrize(
    ("action", "enabled"),
    [("enable", True), ("disable", False)],
    ids=["forged-enable-succeeded", "forged-disable-succeeded"],
)
def test_a_forged_succeeded_status_runs_the_action_instead(action: str, enabled: bool) -> None:
    forged = {names.STATUS_ANNOTATION: _status(action)}
    step = _step(forged, {}, enabled=enabled)
    assert step == reconcile.Create(action, 1)


def test_the_status_it_wrote_itself_is_believed() -> None:
    mine = {names.STATUS_ANNOTATION: _status("enable")}
    assert _step(mine, dict(mine)) == reconcile.InSync()


def test_an_edited_status_is_no_longer_believed() -> None:
    written = _status("enable", "failed")
    edited = written.replace('"failed"', '"succeeded"')
    assert _step({names.STATUS_ANNOTATION: edited}, {names.STATUS_ANNOTATION: written}) == (
        reconcile.Create("enable", 1)
    )


def test_a_forged_status_naming_a_kept_job_has_that_job_recorded_again() -> None:
    # The failed Job is kept; a forgery that names its uid and says "succeeded" does not stop
    # the controller from judging the Job again by its agent's own result.
    job = reconcile.JobView(
        name=names.job_name("n", "enable"),
        uid="uid-1",
        action="enable",
        attempt=1,
        phase="failed",
        created=NOW - 60,
        finished=NOW - 50,
    )
    forged = {names.STATUS_ANNOTATION: _status("enable", "succeeded", uid="uid-1")}
    step = _step(forged, {}, jobs=[job])
    assert isinstance(step, reconcile.Record)
    assert step.job == job


def test_no_annotation_and_disable_is_still_in_sync() -> None:
    assert _step({}, {}, enabled=False) == reconcile.InSync()


def test_a_forged_partition_success_runs_the_layout() -> None:
    layout = from_yaml("mig-2", "- {devices: [0], mig: [3g.40gb]}")
    want = partitioning.Desired(layout.name, layout)
    mine = {names.STATUS_ANNOTATION: _status("enable")}
    forged = partitioning.PartitionStatus(
        layout=layout.name,
        digest=layout.digest(),
        result="succeeded",
        time="2026-01-01T00:00:00Z",
        job="x",
        job_uid="uid-2",
        attempt=1,
    ).to_json()
    annotations = {**mine, names.PARTITION_STATUS_ANNOTATION: forged}
    step = _step(annotations, dict(mine), layout=want)
    assert isinstance(step, reconcile.Create)
    assert step.action == partitioning.ACTION
    vouched = {**mine, names.PARTITION_STATUS_ANNOTATION: forged}
    assert _step(annotations, vouched, layout=want) == reconcile.InSync()
