"""The node annotation ``lj-runtimekit-controller/last-action-status``: read and written. Pure.

A JSON object; anything else (hand-edited, truncated) reads as no status and is overwritten at
the next result, never trusted.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

RESULTS = ("succeeded", "failed")


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
    try:
        data: Any = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict):
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
    except (KeyError, TypeError, ValueError):
        return None
    if status.action not in ("enable", "disable") or status.result not in RESULTS:
        return None
    return status


@dataclass(frozen=True)
class AgentReport:
    """What the agent's termination message says (JSON written by the job agent)."""

    reason: str
    message: str
    agent_version: str


def agent_report(message: str | None, fallback: str) -> AgentReport:
    """The agent's report from its termination message; raw text or ``fallback`` otherwise."""
    if not message:
        return AgentReport("NoTerminationMessage", fallback, "")
    try:
        data: Any = json.loads(message)
    except ValueError:
        return AgentReport("AgentOutput", message.strip()[-1024:], "")
    if not isinstance(data, dict):
        return AgentReport("AgentOutput", message.strip()[-1024:], "")
    return AgentReport(
        reason=str(data.get("reason", "")),
        message=str(data.get("message", ""))[:1024],
        agent_version=str(data.get("agent_version", "")),
    )
