"""Lifecycle of the job agent: one action, one result, one exit code."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import structlog

from . import __version__, host, logs, result
from .containerd_config import MalformedConfig
from .errors import JobAgentError
from .plan import FileChange, plan
from .runtime import ConfigDaemon, RuntimeUnavailable
from .settings import Settings

log = structlog.get_logger("lj_runtimekit_job_agent")


def _exit_code(error: JobAgentError) -> tuple[int, str]:
    if isinstance(error, RuntimeUnavailable):
        return result.EXIT_RUNTIME_UNAVAILABLE, "RuntimeUnavailable"
    if isinstance(error, MalformedConfig):
        return result.EXIT_CONFIG_REFUSED, "ContainerdConfigRefused"
    if isinstance(error, host.ContainerdNotBack):
        return result.EXIT_CONTAINERD_NOT_BACK, "ContainerdNotBack"
    return result.EXIT_FAILED, type(error).__name__


def _plan(settings: Settings) -> list[FileChange]:
    config = host.on_host(settings.host_root, settings.containerd_config)
    return plan(
        settings.action,
        settings.containerd_config,
        host.read(config),
        lambda p: host.read(host.on_host(settings.host_root, p)),
        settings.new_config_version,
    )


def _apply(settings: Settings, changes: list[FileChange]) -> None:
    # Drop-ins first, the main file last: containerd reads nothing half-done either way.
    for change in changes:
        path = host.on_host(settings.host_root, change.path)
        if change.after is None:
            host.remove(path)
        else:
            backup = host.write_atomic(path, change.after)
            log.info("containerd_config_written", path=str(path), backup=str(backup or ""))


async def act(settings: Settings) -> result.Result:
    """Run the action; errors surface as :class:`JobAgentError`."""
    enable = settings.action == "enable"
    changes = _plan(settings)  # before any change: a malformed config stops everything
    async with ConfigDaemon(settings.socket_dir, settings.rpc_timeout) as daemon:
        state = await daemon.state()
        if settings.dry_run:
            for change in changes:
                sys.stdout.write(change.diff())
            return _outcome(
                settings,
                True,
                "DryRun",
                "dry run: nothing changed",
                runtime_version=state.runtime_version,
                runtime_changed=state.enabled != enable,
                containerd_changed=bool(changes),
            )
        # Enable: Runtime first, then the handler that uses it; disable in the reverse order.
        runtime_changed = False
        if enable:
            runtime_changed, state = await daemon.set_enabled(True)
        _apply(settings, changes)
        restarted = False
        if changes and settings.restart_command:
            await host.restart_containerd(
                settings.restart_command, settings.confirm_command, settings.restart_timeout
            )
            restarted = True
        if not enable:
            runtime_changed, state = await daemon.set_enabled(False)
    facts: dict[str, Any] = {
        "runtime_version": state.runtime_version,
        "runtime_changed": runtime_changed,
        "containerd_changed": bool(changes),
        "containerd_restarted": restarted,
    }
    if state.enabled != enable:
        message = f"config daemon reports enabled={state.enabled} after SetFeatures"
        return _outcome(settings, False, "RuntimeStateMismatch", message, **facts)
    if runtime_changed or changes:
        return _outcome(settings, True, "Done", f"{settings.action}: done", **facts)
    message = f"{settings.action}: already in the wanted state"
    return _outcome(settings, True, "AlreadyDone", message, **facts)


def _outcome(
    settings: Settings, ok: bool, reason: str, message: str, **facts: Any
) -> result.Result:
    return result.Result(
        action=settings.action,
        node=settings.node_name,
        succeeded=ok,
        reason=reason,
        message=message,
        agent_version=__version__,
        **facts,
    )


async def run_async(settings: Settings) -> tuple[int, result.Result]:
    try:
        outcome = await act(settings)
        code = result.EXIT_OK if outcome.succeeded else result.EXIT_FAILED
    except JobAgentError as e:
        code, reason = _exit_code(e)
        outcome = _outcome(settings, False, reason, str(e))
    result.write(settings.termination_log, outcome)
    event = "action_succeeded" if outcome.succeeded else "action_failed"
    (log.info if outcome.succeeded else log.error)(
        event,
        action=settings.action,
        node=settings.node_name,
        reason=outcome.reason,
        message=outcome.message,
        exit_code=code,
    )
    return code, outcome


def run(settings: Settings) -> int:
    logs.configure(
        settings.log_level, None if settings.log_format == "auto" else settings.log_format == "json"
    )
    log.info("starting", version=__version__, settings=settings.__dict__)
    code, _ = asyncio.run(run_async(settings))
    return code
