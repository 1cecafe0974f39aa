"""What to do next about one node's partition layout (docs/partitioning.md). Pure.

The node label ``lj_runtimekit_partition_layout=<name>`` selects a layout of the ConfigMap
``lj-runtimekit-partition-layouts``; the annotation ``lj-runtimekit-controller/partition-status``
records the last outcome for one layout *content* (its digest), so an edited ConfigMap value is a
new layout to apply. Outcomes:

- ``succeeded``: the node is as the layout says;
- ``waiting``: a GPU the layout changes is held by a pod; the agent waited, changed nothing, and
  the controller tries again every ``wait_interval`` seconds without counting it as a failure;
- ``refused``: the layout cannot be applied (the controller's own check, an unknown name, or the
  agent's check against the hardware); nothing changed and nothing is retried until the label,
  the layout or the retry annotation changes;
- ``failed``: retried with the backoff of the features' actions, up to the retry limit.

One call returns one step, as :func:`reconcile.decide` does for the features' actions; the
caller performs it and asks again.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from .partition_layout import Layout, LayoutError
from .reconcile import (
    Delete,
    InSync,
    JobView,
    Policy,
    Record,
    Step,
    Wait,
    _epoch,
    create_step,
)

ACTION = "partition"
RESULTS = ("succeeded", "failed", "waiting", "refused")
#: The agent's reasons that mean "nothing changed, and trying again cannot help".
REFUSED_REASONS = frozenset({"LayoutRefused", "RuntimeTooOld", "InvalidSettings"})
#: The agent's reason that means "a GPU to change is in use; nothing changed".
WAITING_REASON = "AllocationsLive"
MAX_TEXT = 1024
MAX_WORD = 128


@dataclass(frozen=True)
class PartitionStatus:
    layout: str
    digest: str
    """The layout content's digest; for a refused unknown name, ``missing``."""
    result: str
    time: str
    job: str = ""
    job_uid: str = ""
    attempt: int = 1
    reason: str = ""
    message: str = ""
    retry: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))


def annotation_object(text: str | None) -> dict[str, Any] | None:
    """An annotation's JSON object; None when absent, not JSON or not an object."""
    if not text:
        return None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def parse_status(text: str | None) -> PartitionStatus | None:
    """The annotation's status, or None when absent or not one the controller wrote."""
    data = annotation_object(text)
    if data is None:
        return None
    try:
        st = PartitionStatus(
            layout=str(data["layout"])[:MAX_WORD],
            digest=str(data["digest"])[:MAX_WORD],
            result=str(data["result"]),
            time=str(data.get("time", ""))[:MAX_WORD],
            job=str(data.get("job", ""))[:MAX_WORD],
            job_uid=str(data.get("job_uid", ""))[:MAX_WORD],
            attempt=int(data.get("attempt", 1)),
            reason=str(data.get("reason", ""))[:MAX_WORD],
            message=str(data.get("message", ""))[:MAX_TEXT],
            retry=str(data.get("retry", ""))[:MAX_TEXT],
        )
    except (KeyError, TypeError, ValueError, OverflowError):
        return None
    if st.result not in RESULTS or not 1 <= st.attempt <= 1_000_000:
        return None
    return st


def result_of(succeeded: bool, reason: str) -> str:
    """The outcome to record for the agent's result."""
    if succeeded:
        return "succeeded"
    if reason == WAITING_REASON:
        return "waiting"
    if reason in REFUSED_REASONS:
        return "refused"
    return "failed"


@dataclass(frozen=True)
class Desired:
    """The layout the node's label selects, as the controller read it."""

    name: str
    layout: Layout | None
    """None when refused (``error`` says why)."""
    error: str = ""

    @property
    def digest(self) -> str:
        return self.layout.digest() if self.layout is not None else "missing"


def desired(
    name: str | None, layouts: dict[str, Layout | LayoutError] | None, where: str
) -> Desired | None:
    """The node's desired layout: None without the label; ``layouts`` None when the ConfigMap
    ``where`` does not exist."""
    if not name:
        return None
    if layouts is None:
        return Desired(name, None, f"the node asks for layout {name!r} but {where} does not exist")
    found = layouts.get(name)
    if found is None:
        known = ", ".join(sorted(layouts)) or "none"
        return Desired(name, None, f"layout {name!r} is not in {where} (it has: {known})")
    if isinstance(found, LayoutError):
        return Desired(name, None, str(found))
    return Desired(name, found)


@dataclass(frozen=True)
class Refuse:
    """Record, once, that the desired layout is refused before any Job: annotation and Event."""

    desired: Desired


def _now_text(now: float) -> str:
    return datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def decide(
    want: Desired | None,
    status: PartitionStatus | None,
    jobs: list[JobView],
    *,
    active: int,
    policy: Policy,
    now: float,
    wait_interval: float,
    retry_requested: bool = False,
) -> Step | Refuse:
    """The next step for the node's partitioning; ``jobs`` are its partition Jobs.

    Guarantees: never a Create while one of the node's partition Jobs runs; a finished Job is
    recorded once (by uid) before anything else is done with it; a refused layout is recorded
    once and never run; a waiting layout is tried again every ``wait_interval`` seconds and does
    not use up the retry limit; a failed one is retried like the features' actions.
    """
    running = [j for j in jobs if j.phase == "running"]
    if running:
        return Wait(f"Job {running[0].name} (partition {running[0].layout}) running")
    for job in sorted(jobs, key=lambda j: j.created):
        if status is None or status.job_uid != job.uid:
            return Record(job, retry=_retry_text(job.attempt, policy, now))
        if want is None or (job.layout, job.digest) != (want.name, want.digest):
            return Delete(job, "the node's layout changed since")
        if status.result in ("succeeded", "refused"):
            return Delete(job, "result already recorded")
        return _again(
            want,
            status,
            job,
            active=active,
            policy=policy,
            now=now,
            wait_interval=wait_interval,
            retry_requested=retry_requested,
        )
    if want is None:
        return InSync()
    if want.layout is None:
        if (
            status is not None
            and (status.layout, status.digest, status.result)
            == (
                want.name,
                want.digest,
                "refused",
            )
            and status.message == want.error[:MAX_TEXT]
        ):
            return InSync()
        return Refuse(want)
    if status is None or (status.layout, status.digest) != (want.name, want.digest):
        return _create(1, active, policy)
    if status.result == "succeeded":
        return InSync()
    return _again(
        want,
        status,
        None,
        active=active,
        policy=policy,
        now=now,
        wait_interval=wait_interval,
        retry_requested=retry_requested,
    )


def _again(
    want: Desired,
    status: PartitionStatus,
    job: JobView | None,
    *,
    active: int,
    policy: Policy,
    now: float,
    wait_interval: float,
    retry_requested: bool,
) -> Step:
    """The step after a recorded waiting, refused or failed outcome of the desired layout."""
    if retry_requested:
        return _create(1, active, policy, replaces=job, clear_retry=True)
    if status.result == "refused":
        return Wait(f"layout {want.name!r} refused; waiting for the operator")
    since = (job.finished or job.created) if job is not None else _epoch(status.time)
    if status.result == "waiting":
        due = since + wait_interval
        if now < due:
            return Wait(f"layout {want.name!r} waits for GPUs in use", due - now)
        return _create(status.attempt, active, policy, replaces=job)
    if status.attempt >= policy.retry_limit:
        return Wait(f"layout {want.name!r} failed {status.attempt} times; waiting for the operator")
    due = since + policy.backoff(status.attempt)
    if now < due:
        return Wait(f"retry {status.attempt + 1} of layout {want.name!r} backing off", due - now)
    return _create(status.attempt + 1, active, policy, replaces=job)


def _create(
    attempt: int,
    active: int,
    policy: Policy,
    *,
    replaces: JobView | None = None,
    clear_retry: bool = False,
) -> Step:
    return create_step(ACTION, attempt, active, policy, replaces=replaces, clear_retry=clear_retry)


def _retry_text(attempt: int, policy: Policy, now: float) -> str:
    if attempt >= policy.retry_limit:
        return (
            f"retries exhausted ({attempt}/{policy.retry_limit}); to retry, annotate the node "
            "lj-runtimekit-controller/retry=now"
        )
    return f"try {attempt + 1}/{policy.retry_limit} at {_now_text(now + policy.backoff(attempt))}"
