"""The policy's status: per component ``{name, version, ready, message, …}``, the conditions
Ready, Progressing and Degraded with reasons, observedGeneration. Pure: records in, JSON out (and
back: the status is where the operator keeps what it must remember across restarts — the last
ready image of each component, a failed image, when a rollout started).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from .rollout import Record

Obj = dict[str, Any]
READY, PROGRESSING, DEGRADED = "Ready", "Progressing", "Degraded"


def timestamp(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _epoch(text: Any) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None  # hand-edited: the rollout's clock starts again


def epoch(text: Any) -> float | None:
    """The epoch of a timestamp the status holds; None when absent or not one."""
    return _epoch(text)


def deleting(message: str, gave_up: str, prior: Sequence[Mapping[str, Any]], now: str) -> list[Obj]:
    """The conditions of a deleted policy while the operator undoes it: not Ready, Progressing
    (reason Deleting, ``message`` what it waits for), Degraded NodesNotDisabled once the deadline
    passed with nodes still enabled (``gave_up`` says which)."""
    return [
        condition(READY, False, "Deleting", message, prior=prior, now=now),
        condition(PROGRESSING, True, "Deleting", message, prior=prior, now=now),
        condition(DEGRADED, True, "NodesNotDisabled", gave_up, prior=prior, now=now)
        if gave_up
        else condition(DEGRADED, False, "AsExpected", "", prior=prior, now=now),
    ]


def record_to_json(r: Record) -> Obj:
    out: Obj = {
        "name": r.name,
        "enabled": r.enabled,
        "version": r.version,
        "image": r.image,
        "ready": r.ready,
        "message": r.message[:1024],
        "lastReadyVersion": r.last_ready_version,
        "lastReadyImage": r.last_ready_image,
    }
    if r.failed_image:
        out["failedImage"] = r.failed_image
    if r.rollout_image and r.rollout_started is not None:
        out["rollout"] = {"image": r.rollout_image, "startedAt": timestamp(r.rollout_started)}
    return out


def _s(entry: Mapping[str, Any], key: str) -> str:
    v = entry.get(key)
    return v if isinstance(v, str) else ""


def records(status: Mapping[str, Any] | None) -> dict[str, Record]:
    """The records a status holds, by component; anything malformed reads as not known."""
    out: dict[str, Record] = {}
    items = (status or {}).get("components")
    for entry in items if isinstance(items, list) else []:
        if not isinstance(entry, Mapping) or not _s(entry, "name"):
            continue
        rollout = entry.get("rollout") if isinstance(entry.get("rollout"), Mapping) else {}
        assert isinstance(rollout, Mapping)
        failed = _s(entry, "failedImage")
        out[_s(entry, "name")] = Record(
            name=_s(entry, "name"),
            enabled=entry.get("enabled") is not False,
            version=_s(entry, "version"),
            image=_s(entry, "image"),
            ready=entry.get("ready") is True,
            message=_s(entry, "message"),
            last_ready_version=_s(entry, "lastReadyVersion"),
            last_ready_image=_s(entry, "lastReadyImage"),
            failed_image=failed,
            failed_message=_s(entry, "message") if failed else "",
            rollout_image=_s(rollout, "image"),
            rollout_started=_epoch(rollout.get("startedAt")),
        )
    return out


def condition(
    kind: str,
    true: bool,
    reason: str,
    message: str,
    *,
    prior: Sequence[Mapping[str, Any]],
    now: str,
) -> Obj:
    """A condition; its lastTransitionTime moves only when its status does."""
    status = "True" if true else "False"
    old = next((c for c in prior if isinstance(c, Mapping) and c.get("type") == kind), None)
    since = now
    if old is not None and old.get("status") == status and old.get("lastTransitionTime"):
        since = str(old["lastTransitionTime"])
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message[:2048],
        "lastTransitionTime": since,
    }


def conditions(
    enabled: Sequence[Record], prior: Sequence[Mapping[str, Any]], now: str
) -> list[Obj]:
    """Ready: every enabled component ready at the policy's image. Progressing: one is rolling
    out. Degraded: one failed (reason RolloutFailed) and runs its last ready version."""
    failed = [r for r in enabled if r.failed_image]
    rolling = [r for r in enabled if not r.ready and not r.failed_image]
    if failed:
        ready = condition(
            READY,
            False,
            "RolloutFailed",
            "; ".join(r.failed_message for r in failed),
            prior=prior,
            now=now,
        )
    elif rolling:
        names = ", ".join(f"{r.name} ({r.message})" for r in rolling)
        ready = condition(
            READY, False, "ComponentsNotReady", f"not ready: {names}", prior=prior, now=now
        )
    else:
        names = ", ".join(f"{r.name} {r.version}" for r in enabled) or "no component enabled"
        ready = condition(READY, True, "AllComponentsReady", names, prior=prior, now=now)
    if rolling:
        progressing = condition(
            PROGRESSING,
            True,
            "RollingOut",
            "; ".join(f"{r.name}: {r.message}" for r in rolling),
            prior=prior,
            now=now,
        )
    else:
        progressing = condition(
            PROGRESSING, False, "Converged", "nothing is rolling out", prior=prior, now=now
        )
    if failed:
        degraded = condition(
            DEGRADED,
            True,
            "RolloutFailed",
            "; ".join(r.failed_message for r in failed),
            prior=prior,
            now=now,
        )
    else:
        degraded = condition(DEGRADED, False, "AsExpected", "", prior=prior, now=now)
    return [ready, progressing, degraded]


def refused(reason: str, message: str, prior: Sequence[Mapping[str, Any]], now: str) -> list[Obj]:
    """The conditions of a policy the operator cannot follow (a second policy, a bad spec):
    Degraded with ``reason``, not Ready, not progressing."""
    return [
        condition(READY, False, reason, message, prior=prior, now=now),
        condition(PROGRESSING, False, reason, message, prior=prior, now=now),
        condition(DEGRADED, True, reason, message, prior=prior, now=now),
    ]


def with_error(
    conds: list[Obj], reason: str, message: str, prior: Sequence[Mapping[str, Any]], now: str
) -> list[Obj]:
    """``conds`` with Degraded set by an error of this pass (the apiserver refused a write)."""
    return [
        condition(DEGRADED, True, reason, message, prior=prior, now=now)
        if c["type"] == DEGRADED
        else c
        for c in conds
    ]
