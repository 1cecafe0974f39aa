"""What to do next for one node: level-based, from the label, the status annotation and Jobs. Pure.

One call returns one step; the caller performs it and asks again with fresh state, so a restart
at any point resumes where things stand and never repeats a finished action.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from .status import Status


@dataclass(frozen=True)
class JobView:
    """One agent Job of the node, as the controller needs it."""

    name: str
    uid: str
    action: str
    attempt: int
    phase: str
    """``running``, ``succeeded`` or ``failed``."""
    created: float
    """Creation time, seconds since the epoch."""
    finished: float | None = None
    detail: str = ""
    """The reason and message of the Job's Complete or Failed condition."""
    layout: str = ""
    """A partition Job: the layout it applies, and that layout's digest."""
    digest: str = ""


@dataclass(frozen=True)
class NodeView:
    name: str
    desired: str
    """``enable`` when the label says so, else ``disable``."""
    status: Status | None
    """The node's recorded result, only when the controller vouches for it (see
    :func:`steps.next_step`); an annotation alone is no result."""
    retry_requested: bool = False
    unverified: bool = False
    """The node carries a status annotation the controller cannot vouch for: it may have run an
    action, so even ``disable`` is run rather than assumed."""


@dataclass(frozen=True)
class Policy:
    retry_limit: int = 3
    """Tries of one action (the first included) before the controller waits for the operator."""
    backoff_s: float = 10.0
    backoff_max_s: float = 300.0
    max_active_jobs: int = 50

    def backoff(self, attempt: int) -> float:
        """Delay before try ``attempt + 1``: backoff_s × 2^(attempt-1), at most backoff_max_s."""
        # The exponent is capped: 2**attempt of a huge attempt is a huge integer (slow, big).
        return float(min(self.backoff_s * 2 ** min(max(attempt - 1, 0), 64), self.backoff_max_s))


@dataclass(frozen=True)
class InSync:
    """Nothing to do."""


@dataclass(frozen=True)
class Wait:
    reason: str
    after_s: float | None = None
    """Ask again after this many seconds; None: only when something changes."""


@dataclass(frozen=True)
class Create:
    action: str
    attempt: int
    replaces: JobView | None = None
    """A finished Job of the same name to delete (Background) first."""
    clear_retry: bool = False


@dataclass(frozen=True)
class Record:
    """Judge a finished Job by its agent's result and write that on the node (annotation, Event);
    delete the Job on success. A Job's Complete condition is not a success by itself: see
    :func:`status.outcome`."""

    job: JobView
    retry: str
    """What the annotation says about the next try, should the result be a failure."""


@dataclass(frozen=True)
class Delete:
    job: JobView
    reason: str


Step = InSync | Wait | Create | Record | Delete


def _epoch(rfc3339: str) -> float:
    try:
        return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()
    except (ValueError, OverflowError, OSError):  # year 0001 in local time, say
        return 0.0


def _retry_text(job: JobView, policy: Policy, now: float) -> str:
    if job.attempt >= policy.retry_limit:
        return (
            f"retries exhausted ({job.attempt}/{policy.retry_limit}); to retry, delete Job "
            f"{job.name} or annotate the node lj-runtimekit-controller/retry=now"
        )
    at = datetime.fromtimestamp(now + policy.backoff(job.attempt)).astimezone()
    return f"try {job.attempt + 1}/{policy.retry_limit} at {at:%Y-%m-%dT%H:%M:%S%z}"


def create_step(
    action: str,
    attempt: int,
    active: int,
    policy: Policy,
    *,
    replaces: JobView | None = None,
    clear_retry: bool = False,
) -> Step:
    """Create the Job of ``action``, or wait while ``max_active_jobs`` are running (any action)."""
    if active >= policy.max_active_jobs:
        return Wait(f"{active} agent Jobs active, at the limit {policy.max_active_jobs}", 1.0)
    return Create(action, attempt, replaces=replaces, clear_retry=clear_retry)


def _create(
    node: NodeView,
    attempt: int,
    active: int,
    policy: Policy,
    *,
    replaces: JobView | None = None,
    clear_retry: bool = False,
) -> Step:
    return create_step(
        node.desired, attempt, active, policy, replaces=replaces, clear_retry=clear_retry
    )


def _finished(node: NodeView, job: JobView, active: int, policy: Policy, now: float) -> Step | None:
    if node.status is None or node.status.job_uid != job.uid:
        return Record(job, retry=_retry_text(job, policy, now))
    if node.status.result == "succeeded":
        return Delete(job, "result already recorded")
    # Recorded as failed: a failed Job, or a Complete one without an agent result; kept for the
    # operator to read until a retry replaces it.
    if job.action != node.desired:
        return Delete(job, f"label now asks for {node.desired}")
    if node.retry_requested:
        return _create(node, 1, active, policy, replaces=job, clear_retry=True)
    if job.attempt >= policy.retry_limit:
        return Wait(f"{job.action} failed {job.attempt} times; waiting for the operator")
    due = (job.finished or job.created) + policy.backoff(job.attempt)
    if now < due:
        return Wait(f"retry {job.attempt + 1} of {job.action} backing off", due - now)
    return _create(node, job.attempt + 1, active, policy, replaces=job)


def decide(node: NodeView, jobs: list[JobView], active: int, policy: Policy, now: float) -> Step:
    """The next step for ``node`` given its Jobs; ``active`` counts running agent Jobs cluster-wide.

    Guarantees: never a Create while one of the node's Jobs runs (one agent per node at a time);
    a finished Job's result is recorded once (by Job uid) before anything else happens with it;
    a node whose status is unknown or unverified gets its desired action run, never assumed;
    a Job recorded as succeeded is deleted, one recorded as failed (whatever its condition) only
    to retry or when the label moved on; without Jobs, the recorded result decides whether the
    label's state is reached.
    """
    running = [j for j in jobs if j.phase == "running"]
    if running:
        return Wait(f"Job {running[0].name} ({running[0].action}) running")
    for job in sorted(jobs, key=lambda j: j.created):
        step = _finished(node, job, active, policy, now)
        if step is not None and not isinstance(step, Wait):
            return step
        if isinstance(step, Wait) and job.action == node.desired:
            return step
    status = node.status
    if status is None:
        if node.desired == "disable" and not node.unverified:
            return InSync()
        return _create(node, 1, active, policy)
    if status.action != node.desired:
        return _create(node, 1, active, policy)
    if status.result == "succeeded":
        return InSync()
    # Failed and its Job is gone: deleted by the operator to retry, or by a retry cut short.
    if node.retry_requested or status.attempt >= policy.retry_limit:
        return _create(node, 1, active, policy, clear_retry=node.retry_requested)
    due = _epoch(status.time) + policy.backoff(status.attempt)
    if now < due:
        return Wait(f"retry {status.attempt + 1} of {status.action} backing off", due - now)
    return _create(node, status.attempt + 1, active, policy)
