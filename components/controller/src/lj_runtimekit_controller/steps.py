"""What to do next about one node, and what a finished agent Job writes on it. Pure.

:func:`next_step` puts the two decisions together: the node's features' action
(:func:`reconcile.decide`) first, then its partition layout (:func:`partitioning.decide`), one
agent Job of the node at a time whichever it is for. :func:`recording` turns a finished Job's
outcome into what the action loop writes: the status annotation, the Event, the metric, the log
line, and whether the Job goes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from . import names, partitioning, reconcile, status
from .fence import Fence, for_waiting

NextStep = reconcile.Step | partitioning.Refuse


def next_step(
    name: str,
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    jobs: list[reconcile.JobView],
    desired_layout: partitioning.Desired | None,
    *,
    feature_label: tuple[str, str],
    active: int,
    policy: reconcile.Policy,
    now: float,
    wait_interval: float,
    vouched: Mapping[str, str],
) -> NextStep:
    """The next step for node ``name`` (its ``labels``, ``annotations`` and agent ``jobs``).

    ``feature_label`` is the (key, value) that asks for the features; ``active`` the agent Jobs
    running cluster-wide. Guarantees: a partition step only once the features' action is in sync
    or waits, and no new Job while another of the node runs.

    ``vouched`` maps a status annotation's key to the value this controller wrote there itself,
    from the agent Job it created (matched by the Job's uid when it was recorded). Guarantees: a
    status annotation is believed only when it is that very value; any other (forged, edited, or
    written before this controller started) counts as no result: the node's finished Jobs are
    recorded again from their agents' own results, and without a Job the desired action runs
    again (the agent finds it done and changes nothing)."""
    feature = _believed(annotations, names.STATUS_ANNOTATION, vouched)
    view = reconcile.NodeView(
        name=name,
        desired="enable" if labels.get(feature_label[0]) == feature_label[1] else "disable",
        status=status.parse(feature),
        retry_requested=names.RETRY_ANNOTATION in annotations,
        unverified=feature is None and names.STATUS_ANNOTATION in annotations,
    )
    features = [v for v in jobs if v.action in names.FEATURE_ACTIONS]
    layouts = [v for v in jobs if v.action == partitioning.ACTION]
    step = reconcile.decide(view, features, active, policy, now)
    if not isinstance(step, (reconcile.InSync, reconcile.Wait)):
        return step
    if any(v.phase == "running" for v in features):
        return step
    partition = partitioning.decide(
        desired_layout,
        partitioning.parse_status(
            _believed(annotations, names.PARTITION_STATUS_ANNOTATION, vouched)
        ),
        layouts,
        active=active,
        policy=policy,
        now=now,
        wait_interval=wait_interval,
        retry_requested=names.RETRY_ANNOTATION in annotations,
    )
    if isinstance(partition, reconcile.InSync):
        return step
    if isinstance(partition, reconcile.Create) and any(v.phase == "running" for v in jobs):
        return reconcile.Wait("another agent Job of the node runs")
    if isinstance(partition, reconcile.Wait) and isinstance(step, reconcile.Wait):
        # The sooner of the two requeues, so neither waits for the other.
        times = [s.after_s for s in (step, partition) if s.after_s is not None]
        return reconcile.Wait(partition.reason, min(times) if times else None)
    return partition


def _believed(annotations: Mapping[str, str], key: str, vouched: Mapping[str, str]) -> str | None:
    """The annotation ``key`` when it is what the controller wrote there, else None."""
    value = annotations.get(key)
    return value if value is not None and vouched.get(key) == value else None


@dataclass(frozen=True)
class Recording:
    """What the action loop writes for one finished agent Job."""

    annotation: tuple[str, str]
    """(key, JSON) of the node's status annotation."""
    event: tuple[str, str, str] | None
    """(reason, type, message) of the node's Event; None: none this time."""
    result: str
    """The ``actions`` metric's result label."""
    observe_duration: bool
    ok: bool
    """Logged at info (else warning)."""
    log_event: str
    log_fields: Mapping[str, object] = field(default_factory=dict)
    delete_job: bool = False
    fence: Fence | None = None
    """partition, waiting: the GPUs to fence from new pods while the change waits for them."""


def recording(
    name: str,
    step: reconcile.Record,
    out: status.Outcome,
    *,
    before: partitioning.PartitionStatus | None,
    now_text: str,
    wait_interval: float,
) -> Recording:
    """What to write for ``step``'s finished Job, judged ``out``; ``before`` is the node's
    partition status before it (for a layout that keeps waiting on the same pods: one Event)."""
    if step.job.action == partitioning.ACTION:
        return _partition_recording(
            name, step, out, before=before, now_text=now_text, wait_interval=wait_interval
        )
    job = step.job
    result = "succeeded" if out.succeeded else "failed"
    retry = "" if out.succeeded else step.retry
    st = status.Status(
        action=job.action,
        result=result,
        time=now_text,
        job=job.name,
        job_uid=job.uid,
        attempt=job.attempt,
        agent_version=out.agent_version,
        reason=out.reason,
        message=out.message,
        retry=retry,
    )
    text = f"{job.action} {result} (Job {job.name}, try {job.attempt}): {out.message}"
    if retry:
        text += f"; {retry}"
    reason = "ActionSucceeded" if out.succeeded else "ActionFailed"
    return Recording(
        annotation=(names.STATUS_ANNOTATION, st.to_json()),
        event=(reason, "Normal" if out.succeeded else "Warning", text),
        result=result,
        observe_duration=bool(job.finished),
        ok=out.succeeded,
        log_event="action_" + result,
        log_fields={
            "node": name,
            "action": job.action,
            "job": job.name,
            "attempt": job.attempt,
            "job_condition": job.phase,
            "reason": out.reason,
            "message": out.message,
        },
        delete_job=out.succeeded,
    )


def _partition_recording(
    name: str,
    step: reconcile.Record,
    out: status.Outcome,
    *,
    before: partitioning.PartitionStatus | None,
    now_text: str,
    wait_interval: float,
) -> Recording:
    job = step.job
    result = partitioning.result_of(out.succeeded, out.reason)
    retry = {
        "succeeded": "",
        "refused": "fix the layout or the node's label, or annotate the node "
        f"{names.RETRY_ANNOTATION}=now",
        "waiting": f"next try in {wait_interval:g} s",
        "failed": step.retry,
    }[result]
    st = partitioning.PartitionStatus(
        layout=job.layout,
        digest=job.digest,
        result=result,
        time=now_text,
        job=job.name,
        job_uid=job.uid,
        attempt=job.attempt,
        reason=out.reason,
        message=out.message[: partitioning.MAX_TEXT],
        retry=retry,
    )
    reason, kind = {
        "succeeded": ("PartitionConverged", "Normal"),
        "waiting": ("PartitionWaiting", "Normal"),
        "refused": ("PartitionLayoutRefused", "Warning"),
        "failed": ("PartitionFailed", "Warning"),
    }[result]
    text = f"layout {job.layout} (Job {job.name}, try {job.attempt}): {out.message}"
    if retry:
        text += f"; {retry}"
    # A layout that keeps waiting for the same pods says so once, not every try: the
    # annotation carries each try, the Event the first and every change of what blocks it.
    again = (
        result == "waiting"
        and before is not None
        and (before.layout, before.digest, before.result, before.message)
        == (st.layout, st.digest, st.result, st.message)
    )
    return Recording(
        annotation=(names.PARTITION_STATUS_ANNOTATION, st.to_json()),
        event=None if again else (reason, kind, text),
        result=result,
        observe_duration=bool(job.finished) and result == "succeeded",
        ok=result in ("succeeded", "waiting"),
        log_event="partition_" + result,
        log_fields={
            "node": name,
            "layout": job.layout,
            "job": job.name,
            "attempt": job.attempt,
            "reason": out.reason,
            "message": out.message,
        },
        delete_job=result in ("succeeded", "refused"),
        fence=for_waiting(st, out.devices_waited, out.blocked_by, now_text)
        if result == "waiting"
        else None,
    )
