"""Rollout decisions and the status they produce (pure, fake clock)."""

from __future__ import annotations

import dataclasses
from datetime import datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lj_runtimekit_operator import status
from lj_runtimekit_operator.policy import ComponentSpec
from lj_runtimekit_operator.rollout import (
    FAILING,
    PodTrouble,
    Record,
    Workload,
    combine,
    decide,
    disabled,
)

OLD, NEW = "r/lj-runtimekit-exporter:v1.14.0", "r/lj-runtimekit-exporter:v1.15.0"
NOW = 1_800_000_000.0


def spec(image: str = NEW) -> ComponentSpec:
    return ComponentSpec("exporter", True, image, image.rpartition(":")[2], None, None)


def workload(image: str, ready: bool = True, generation: int = 2) -> Workload:
    return Workload(
        image,
        generation,
        generation if ready else generation - 1,
        2,
        2 if ready else 1,
        2 if ready else 1,
        2,
    )


READY_OLD = Record(
    "exporter",
    version="v1.14.0",
    image=OLD,
    ready=True,
    last_ready_version="v1.14.0",
    last_ready_image=OLD,
)


def test_a_new_image_starts_rolling_out_and_is_ready_once_every_pod_is() -> None:
    d = decide(spec(), READY_OLD, workload(OLD), [], now=NOW, deadline=300, may_start=True)
    assert (d.image, d.settled, d.record.rollout_image, d.record.rollout_started) == (
        NEW,
        False,
        NEW,
        NOW,
    )
    d2 = decide(
        spec(), d.record, workload(NEW, ready=False), [], now=NOW + 5, deadline=300, may_start=True
    )
    assert d2.record.rollout_started == NOW
    assert not d2.record.ready
    assert d2.record.message == f"rolling out {NEW}: 1/2 updated, 1/2 available"
    d3 = decide(spec(), d2.record, workload(NEW), [], now=NOW + 9, deadline=300, may_start=True)
    assert d3.settled
    assert d3.record.ready
    assert (d3.record.last_ready_image, d3.record.last_ready_version) == (NEW, "v1.15.0")


def test_a_new_image_waits_while_an_earlier_component_rolls_out() -> None:
    d = decide(
        spec(),
        READY_OLD,
        workload(OLD),
        [],
        now=NOW,
        deadline=300,
        may_start=False,
        blocker="scheduler",
    )
    assert d.image is None
    assert not d.settled
    assert d.record.message == f"waiting for scheduler to finish rolling out before {NEW}"


def test_a_pull_failure_rolls_back_at_once_and_the_failed_image_is_not_retried() -> None:
    started = decide(
        spec(), READY_OLD, workload(OLD), [], now=NOW, deadline=300, may_start=True
    ).record
    trouble = PodTrouble("exp-1", NEW, "ImagePullBackOff", 'Back-off pulling image "x"')
    d = decide(
        spec(),
        started,
        workload(NEW, ready=False),
        [trouble],
        now=NOW + 1,
        deadline=300,
        may_start=True,
    )
    assert d.image == OLD
    assert d.settled
    assert d.record.failed_image == NEW
    assert d.record.message == (
        f"exporter: image {NEW} failed: pod exp-1 is waiting: ImagePullBackOff "
        '(Back-off pulling image "x"); rolled back to v1.14.0'
    )
    # later passes: the old image again, ready, still Degraded; the bad one is never applied
    again = decide(spec(), d.record, workload(OLD), [], now=NOW + 400, deadline=300, may_start=True)
    assert again.image == OLD
    assert again.record.ready
    assert again.record.failed_image == NEW
    conds = {c["type"]: c for c in status.conditions([again.record], [], "t")}
    assert (conds["Degraded"]["status"], conds["Degraded"]["reason"]) == ("True", "RolloutFailed")
    assert conds["Degraded"]["message"] == d.record.message
    assert (conds["Ready"]["status"], conds["Progressing"]["status"]) == ("False", "False")


def test_a_version_not_ready_by_the_deadline_is_rolled_back() -> None:
    started = decide(
        spec(), READY_OLD, workload(OLD), [], now=NOW, deadline=300, may_start=True
    ).record
    d = decide(
        spec(), started, workload(NEW, ready=False), [], now=NOW + 299, deadline=300, may_start=True
    )
    assert d.image == NEW
    assert not d.record.failed_image
    d = decide(
        spec(),
        d.record,
        workload(NEW, ready=False),
        [],
        now=NOW + 300,
        deadline=300,
        may_start=True,
    )
    assert d.image == OLD
    assert d.record.failed_image == NEW
    assert "not ready within 300 s (1/2 updated, 1/2 available)" in d.record.message


def test_a_first_install_that_fails_has_nothing_to_roll_back_to() -> None:
    trouble = PodTrouble("exp-1", NEW, "CrashLoopBackOff")
    d = decide(
        spec(),
        Record("exporter"),
        workload(NEW, ready=False),
        [trouble],
        now=NOW,
        deadline=300,
        may_start=True,
    )
    assert d.image == NEW
    assert d.record.failed_image == NEW
    assert d.record.message.endswith("; no other ready version to roll back to")
    # a fix that makes the same image's pods ready clears the failure
    fixed = decide(spec(), d.record, workload(NEW), [], now=NOW + 9, deadline=300, may_start=True)
    assert fixed.record.ready
    assert not fixed.record.failed_image


def test_troubles_of_old_pods_do_not_fail_a_new_version() -> None:
    started = decide(
        spec(), READY_OLD, workload(OLD), [], now=NOW, deadline=300, may_start=True
    ).record
    old_trouble = PodTrouble("exp-0", OLD, "CrashLoopBackOff")
    d = decide(
        spec(),
        started,
        workload(NEW, ready=False),
        [old_trouble],
        now=NOW + 1,
        deadline=300,
        may_start=True,
    )
    assert not d.record.failed_image


def daemonset(image: str, desired: int, ready: int, generation: int = 2) -> Workload:
    return Workload(image, generation, generation, desired, ready, ready, desired)


NOWHERE = daemonset(NEW, 0, 0)  # the DRA DaemonSet where no node is in DRA mode


@pytest.mark.parametrize(
    ("parts", "image", "ready"),
    [
        ([daemonset(NEW, 2, 2), NOWHERE], NEW, True),
        ([daemonset(NEW, 0, 0), NOWHERE], NEW, True),  # 0/0 is ready, as for one workload
        ([daemonset(NEW, 1, 1), daemonset(NEW, 1, 1)], NEW, True),
        ([daemonset(NEW, 2, 2), daemonset(NEW, 1, 0)], NEW, False),
        ([daemonset(NEW, 2, 1), NOWHERE], NEW, False),
        ([daemonset(NEW, 2, 2), dataclasses.replace(NOWHERE, observed_generation=1)], NEW, False),
        ([daemonset(NEW, 2, 2), daemonset(OLD, 0, 0)], "", False),
        # one behind by a pod, the other over by one (a node leaving): the sums agree, it is not
        ([daemonset(NEW, 2, 1), Workload(NEW, 2, 2, 0, 1, 1, 1)], NEW, False),
    ],
    ids=[
        "dra-on-no-node",
        "both-on-no-node",
        "both-ready",
        "dra-pod-not-ready",
        "main-pod-not-ready",
        "dra-spec-not-seen",
        "dra-on-another-image",
        "sums-agree-parts-do-not",
    ],
)
def test_a_component_of_two_workloads_is_ready_when_each_is(
    parts: list[Workload], image: str, ready: bool
) -> None:
    both = combine(parts)
    assert both is not None
    assert both.image == image  # none when they differ: the component is not at any one image
    d = decide(spec(), READY_OLD, both, [], now=NOW, deadline=300, may_start=True)
    assert d.record.ready is ready


def test_a_component_missing_one_of_its_workloads_is_absent_and_applied_again() -> None:
    assert combine([daemonset(NEW, 2, 2), None]) is None
    assert combine([None, NOWHERE]) is None
    assert combine([daemonset(NEW, 2, 2)]) == daemonset(NEW, 2, 2)
    d = decide(spec(), READY_OLD, combine([daemonset(NEW, 2, 2), None]), [], now=NOW,
               deadline=300, may_start=True)  # fmt: skip
    assert (d.image, d.record.ready, d.settled) == (NEW, False, False)


def test_disabled_is_settled_and_keeps_the_last_ready_version() -> None:
    d = disabled(READY_OLD)
    assert d.settled
    assert d.image is None
    assert not d.record.enabled
    assert d.record.last_ready_image == OLD


def _seconds(epoch: float) -> float:
    """An instant as the status keeps it: RFC 3339 to the second."""
    return datetime.fromisoformat(status.timestamp(epoch).replace("Z", "+00:00")).timestamp()


IMAGES = st.sampled_from(["", OLD, NEW, "r/lj-runtimekit-exporter:v1.16.0"])
RECORDS = st.builds(
    Record,
    name=st.just("exporter"),
    version=st.sampled_from(["", "v1.14.0"]),
    image=IMAGES,
    ready=st.booleans(),
    message=st.text(max_size=20),
    last_ready_image=IMAGES,
    last_ready_version=st.sampled_from(["", "v1.14.0"]),
    failed_image=IMAGES,
    failed_message=st.text(max_size=20),
    rollout_image=IMAGES,
    rollout_started=st.none() | st.floats(NOW - 1000, NOW),
)
WORKLOADS = st.none() | st.builds(
    Workload,
    image=IMAGES,
    generation=st.integers(1, 3),
    observed_generation=st.integers(0, 3),
    desired=st.integers(0, 3),
    updated=st.integers(0, 3),
    available=st.integers(0, 3),
    total=st.integers(0, 4),
)
TROUBLES = st.lists(
    st.builds(PodTrouble, pod=st.just("p"), image=IMAGES, reason=st.sampled_from(sorted(FAILING))),
    max_size=2,
)


@settings(max_examples=300, deadline=None)
@given(
    prior=RECORDS,
    seen=WORKLOADS,
    troubles=TROUBLES,
    target=IMAGES.filter(bool),
    may_start=st.booleans(),
)
def test_decisions_keep_their_guarantees(
    prior: Record, seen: Workload | None, troubles: list[PodTrouble], target: str, may_start: bool
) -> None:
    d = decide(spec(target), prior, seen, troubles, now=NOW, deadline=300, may_start=may_start)
    # a failed image is applied again only when there is nothing to roll back to
    if prior.failed_image == target and prior.last_ready_image not in ("", target):
        assert d.image == prior.last_ready_image
    # a rollback goes only to the image that was last ready
    if d.image is not None and d.image != target:
        assert d.image == prior.last_ready_image
    # ready at the target: settled and recorded as the last ready
    if seen is not None and seen.image == target and seen.ready and prior.failed_image != target:
        assert d.settled
        assert d.record.ready
        assert d.record.last_ready_image == target
    # nothing is applied only while waiting for an earlier component
    if d.image is None:
        assert not may_start
        assert not d.settled
    # what the status keeps reads back the same
    back = status.records({"components": [status.record_to_json(d.record)]})["exporter"]
    expected = dataclasses.replace(
        d.record,
        message=d.record.message[:1024],
        failed_message=d.record.message[:1024] if d.record.failed_image else "",
        rollout_started=(
            _seconds(d.record.rollout_started)
            if d.record.rollout_image and d.record.rollout_started is not None
            else None
        ),
        rollout_image=d.record.rollout_image if d.record.rollout_started is not None else "",
    )
    assert back == expected


def test_conditions_keep_their_transition_time_while_their_status_stays() -> None:
    ready = dataclasses.replace(READY_OLD)
    first = status.conditions([ready], [], "2026-01-01T00:00:00Z")
    later = status.conditions([ready], first, "2026-01-01T00:05:00Z")
    assert first == later
    rolling = dataclasses.replace(ready, ready=False, message="rolling out")
    moved = {c["type"]: c for c in status.conditions([rolling], later, "2026-01-01T00:06:00Z")}
    assert moved["Ready"]["lastTransitionTime"] == "2026-01-01T00:06:00Z"
    assert moved["Degraded"]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert (moved["Progressing"]["status"], moved["Progressing"]["reason"]) == (
        "True",
        "RollingOut",
    )


def test_a_garbled_status_reads_as_nothing_known() -> None:
    assert status.records({"components": "x"}) == {}
    assert status.records({"components": [1, {"name": 2}, {}]}) == {}
    r = status.records(
        {"components": [{"name": "exporter", "rollout": {"startedAt": "yesterday"}}]}
    )
    assert r["exporter"].rollout_started is None
