"""Fencing the GPUs a waiting layout needs (issue 39; pure): which GPUs, and when it goes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lj_runtimekit_controller import fence as f
from lj_runtimekit_controller import partitioning as p
from lj_runtimekit_controller import status, steps
from lj_runtimekit_controller.partition_layout import parse_configmap
from lj_runtimekit_controller.reconcile import JobView, Record

LAYOUTS = parse_configmap({"mig-2": "- {devices: [0, 1], mig: [3g.40gb, 3g.40gb]}", "other": "[]"})
WHERE = "ConfigMap kube-system/lj-runtimekit-partition-layouts"
HELD = "gpu-1 by team/train/main (a-1)"


def want(name: str | None = "mig-2") -> p.Desired | None:
    return p.desired(name, LAYOUTS, WHERE)


def pstatus(result: str, name: str = "mig-2") -> p.PartitionStatus:
    w = want(name)
    assert w is not None
    return p.PartitionStatus(layout=w.name, digest=w.digest, result=result, time="t")


FENCE = f.for_waiting(pstatus("waiting"), ["gpu-0", "gpu-1"], [HELD], "t0")


def test_a_waiting_layout_fences_every_gpu_it_changes_not_only_the_held_one() -> None:
    assert FENCE.devices == ("gpu-0", "gpu-1")
    assert FENCE.held_by == (HELD,)
    assert f.parse(FENCE.to_json()) == FENCE
    text = f.fenced_message(FENCE)
    assert "gpu-0, gpu-1" in text
    assert HELD in text


def test_an_agent_that_does_not_name_the_waited_gpus_fences_the_held_ones() -> None:
    old = f.for_waiting(pstatus("waiting"), [], [HELD, "gpu-3 by a/b/c (x)"], "t0")
    assert old.devices == ("gpu-1", "gpu-3")


@pytest.mark.parametrize(
    ("desired", "recorded", "lifted"),
    [
        ("mig-2", None, None),
        ("mig-2", "waiting", None),
        ("mig-2", "succeeded", "converged"),
        ("mig-2", "refused", "was refused"),
        ("mig-2", "failed", "failed"),
        (None, None, "label was removed"),
        ("other", None, "now asks for layout 'other'"),
        ("missing", None, "now asks for layout 'missing'"),
    ],
    ids=[
        "no-vouched-status-keeps-it",
        "still-waiting",
        "converged",
        "refused",
        "failed",
        "label-removed",
        "another-layout",
        "unknown-layout",
    ],
)
def test_the_fence_stays_while_the_change_waits_and_goes_when_done_or_abandoned(
    desired: str | None, recorded: str | None, lifted: str | None
) -> None:
    st_ = pstatus(recorded) if recorded else None
    why = f.lift_reason(FENCE, want(desired), st_)
    if lifted is None:
        assert why is None
    else:
        assert why is not None
        assert lifted in why


def test_an_edited_layout_lifts_the_fence_of_its_old_text() -> None:
    edited = parse_configmap({"mig-2": "- {devices: [0], mig: [7g.80gb]}"})
    why = f.lift_reason(FENCE, p.desired("mig-2", edited, WHERE), None)
    assert why is not None
    assert "edited" in why


def test_a_status_of_another_layout_does_not_lift_it() -> None:
    assert f.lift_reason(FENCE, want(), pstatus("succeeded", "other")) is None


@given(st.text(max_size=300))
def test_any_annotation_text_parses_to_a_fence_or_none(text: str) -> None:
    got = f.parse(text)
    assert got is None or isinstance(got, f.Fence)


def test_a_waiting_record_carries_the_fence_of_the_agents_result() -> None:
    w = want()
    assert w is not None
    job = JobView(
        name="lj-agent-n-partition",
        uid="u1",
        action="partition",
        attempt=1,
        phase="failed",
        created=0.0,
        finished=1.0,
        layout=w.name,
        digest=w.digest,
    )
    result = (
        '{"action":"partition","node":"n","succeeded":false,"reason":"AllocationsLive",'
        f'"message":"waited","devices_waited":["gpu-0","gpu-1"],"blocked_by":["{HELD}"]}}'
    )
    out = status.outcome(
        job=job.name,
        namespace="kube-system",
        action="partition",
        node="n",
        completed=False,
        ended=status.Ended("pod", result, "Error", 7),
    )
    rec = steps.recording(
        "n", Record(job, retry=""), out, before=None, now_text="t1", wait_interval=30
    )
    assert rec.fence is not None
    assert (rec.fence.devices, rec.fence.held_by) == (("gpu-0", "gpu-1"), (HELD,))
    done = status.Outcome(True, "Converged", "applied")
    assert (
        steps.recording(
            "n", Record(job, retry=""), done, before=None, now_text="t", wait_interval=30
        ).fence
        is None
    )
