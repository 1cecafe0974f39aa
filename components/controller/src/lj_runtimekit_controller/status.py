"""The node annotation ``lj-runtimekit-controller/last-action-status``, read and written, and
the outcome it records, judged from the job agent's result. Pure.

The annotation is a JSON object; anything else (hand-edited, truncated) reads as no status and is
overwritten at the next result, never trusted. Likewise the only proof that an action succeeded
is the job agent's own result (JSON in its container's termination message), never the Job's
Complete condition alone.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

RESULTS = ("succeeded", "failed")
MAX_MESSAGE = 1024
#: A reason or version longer than this is not one the agent wrote; cut so a node annotation stays
#: small whatever a termination message holds.
MAX_WORD = 128
#: No controller counts tries this high (retry_limit is a handful); a larger one is forged.
MAX_ATTEMPT = 1_000_000
"""Characters of the agent's message kept in the annotation and Event."""


@dataclass(frozen=True)
class Status:
    """The last recorded result of an action on a node."""

    action: str
    result: str
    time: str
    """When the result was recorded, RFC 3339 UTC."""
    job: str
    job_uid: str
    attempt: int = 1
    agent_version: str = ""
    reason: str = ""
    message: str = ""
    retry: str = ""
    """For a failure: when the next try starts, or how to retry once the limit is reached."""

    def to_json(self) -> str:
        data = asdict(self)
        # Keep the keys an operator reads first in the order they read them.
        return json.dumps(
            {
                "action": data.pop("action"),
                "result": data.pop("result"),
                "time": data.pop("time"),
                "job": data.pop("job"),
                "agentVersion": data.pop("agent_version"),
                "message": data.pop("message"),
                "reason": data.pop("reason"),
                "attempt": data.pop("attempt"),
                "retry": data.pop("retry"),
                "jobUid": data.pop("job_uid"),
            },
            separators=(",", ":"),
        )


def parse(text: str | None) -> Status | None:
    """The status in ``text``, or None when absent or not one the controller wrote."""
    if not text:
        return None
    data = _json_object(text)
    if data is None:
        return None
    try:
        status = Status(
            action=str(data["action"]),
            result=str(data["result"]),
            time=str(data.get("time", "")),
            job=str(data.get("job", "")),
            job_uid=str(data.get("jobUid", "")),
            attempt=int(data.get("attempt", 1)),
            agent_version=str(data.get("agentVersion", "")),
            reason=str(data.get("reason", "")),
            message=str(data.get("message", "")),
            retry=str(data.get("retry", "")),
        )
    except (KeyError, TypeError, ValueError, OverflowError):  # "attempt": Infinity
        return None
    if status.action not in ("enable", "disable") or status.result not in RESULTS:
        return None
    if not 1 <= status.attempt <= MAX_ATTEMPT:
        # Anyone who may annotate nodes can write this: a negative count would retry without
        # end, a huge one makes the backoff's 2**attempt a huge integer. Not ours: ignored.
        return None
    return status


def _json_object(text: str) -> dict[str, Any] | None:
    """``text`` as a JSON object, or None (not JSON, not an object, nested beyond the parser)."""
    try:
        data: Any = json.loads(text)
    except (ValueError, RecursionError):  # "[[[[…" 4096 deep exhausts Python's stack
        return None
    return data if isinstance(data, dict) else None


@dataclass(frozen=True)
class Ended:
    """How the agent container of a Job's pod ended, as the kubelet reported it."""

    pod: str
    message: str
    """The termination message; empty when the container left none."""
    reason: str = ""
    """The kubelet's word for the end: ``Completed``, ``Error``, ``OOMKilled``…"""
    exit_code: int | None = None


@dataclass(frozen=True)
class AgentResult:
    """The fields of the job agent's result (JSON in its termination message) the controller
    trusts; the agent writes more."""

    action: str
    node: str
    succeeded: bool
    reason: str
    message: str
    agent_version: str
    devices_waited: tuple[str, ...] = ()
    """partition: the GPUs the change waits to find free."""
    blocked_by: tuple[str, ...] = ()
    """partition: who holds them (``gpu-0 by ns/pod/container (allocation)``)."""


@dataclass(frozen=True)
class Outcome:
    """What the controller records for a finished Job."""

    succeeded: bool
    reason: str
    message: str
    agent_version: str = ""
    devices_waited: tuple[str, ...] = ()
    blocked_by: tuple[str, ...] = ()


#: At most this many entries of a list of the agent's result are kept, each cut to MAX_WORD.
MAX_LIST = 64


def _words(value: object, size: int = MAX_WORD) -> tuple[str, ...]:
    """A list of strings of the agent's result, bounded; anything else is none."""
    if not isinstance(value, list):
        return ()
    return tuple(v[:size] for v in value[:MAX_LIST] if isinstance(v, str) and v)


def agent_result(text: str | None) -> AgentResult | None:
    """The job agent's result in ``text``, or None when ``text`` is not one (empty, raw output,
    JSON without ``action``, ``node`` and a boolean ``succeeded``)."""
    if not text:
        return None
    data = _json_object(text)
    if data is None:
        return None
    action, node, succeeded = data.get("action"), data.get("node"), data.get("succeeded")
    if not isinstance(action, str) or not isinstance(node, str) or not isinstance(succeeded, bool):
        return None
    return AgentResult(
        action=action,
        node=node,
        succeeded=succeeded,
        reason=str(data.get("reason", ""))[:MAX_WORD],
        message=str(data.get("message", ""))[:MAX_MESSAGE],
        agent_version=str(data.get("agent_version", ""))[:MAX_WORD],
        devices_waited=_words(data.get("devices_waited")),
        blocked_by=_words(data.get("blocked_by"), 512),
    )


def _how_it_ended(ended: Ended | None) -> str:
    if ended is None:
        return "no pod of it with a terminated agent container was found"
    text = f"pod {ended.pod}: agent container {ended.reason or 'terminated'}"
    if ended.exit_code is not None:
        text += f" (exit code {ended.exit_code})"
    return text + (", no termination message" if not ended.message else "")


def outcome(
    *,
    job: str,
    namespace: str,
    action: str,
    node: str,
    completed: bool,
    ended: Ended | None,
    detail: str = "",
) -> Outcome:
    """The result to record for the finished Job ``job`` of ``action`` on ``node``.

    Guarantees: succeeded only when the Job completed *and* its pod's agent container reported a
    job-agent result for the same action and node saying it succeeded. A Job's Complete condition
    alone proves nothing (a pod that never ran the agent completes too); a failed result carries
    the agent's own reason and message when it left them, else says what is known and where to look.
    """
    logs = f"kubectl -n {namespace} logs job/{job}"
    result = agent_result(ended.message if ended else None)
    if result is not None and (result.action, result.node) != (action, node):
        return Outcome(
            False,
            "AgentResultMismatch",
            f"Job {job} is for {action} on node {node} but its pod reported a job-agent result "
            f"for {result.action} on node {result.node}; not trusted: {logs}",
            result.agent_version,
        )
    if result is not None:
        if result.succeeded and not completed:
            message = f"Job {job} failed ({detail or 'no reason given'}) though the agent said: "
            return Outcome(False, "JobFailed", message + result.message, result.agent_version)
        reason = result.reason or ("Succeeded" if result.succeeded else "AgentFailed")
        return Outcome(
            result.succeeded,
            reason,
            result.message,
            result.agent_version,
            devices_waited=result.devices_waited,
            blocked_by=result.blocked_by,
        )
    if completed:
        return Outcome(
            False,
            "NoAgentResult",
            f"Job {job} completed but its pod reported no job-agent result "
            f"({_how_it_ended(ended)}): is the image the job agent (--job-image)? {logs}",
        )
    if ended is not None and ended.message:
        # FallbackToLogsOnError: the tail of the agent's output, e.g. a traceback.
        return Outcome(False, "AgentOutput", ended.message.strip()[-MAX_MESSAGE:])
    failed = f"Job {job} failed" + (f" ({detail})" if detail else "")
    return Outcome(False, "NoAgentResult", f"{failed}; {_how_it_ended(ended)}: {logs}")
