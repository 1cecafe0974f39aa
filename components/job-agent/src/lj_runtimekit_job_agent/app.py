"""Lifecycle of the job agent: one action, one result, one exit code."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from typing import Any

import structlog

from . import (
    __version__,
    annotation_patterns,
    feature_switch,
    host,
    lifecycle,
    logs,
    partitioning,
    result,
    versions,
)
from .containerd_config import MalformedConfig
from .errors import ConfigError, JobAgentError, PermanentError
from .runtime import ConfigDaemon, FeatureState, RuntimeUnavailable, VersionUnknown, get_version
from .settings import Settings

log = structlog.get_logger("lj_runtimekit_job_agent")


class RuntimeTooOld(PermanentError):
    """The node's Runtime is older than a feature the action would switch on needs."""


def _exit_code(error: JobAgentError) -> tuple[int, str]:
    if isinstance(error, partitioning.LayoutRefused):
        return result.EXIT_LAYOUT_REFUSED, "LayoutRefused"
    if isinstance(error, partitioning.AllocationsLive):
        return result.EXIT_BUSY, "AllocationsLive"
    if isinstance(error, partitioning.PartitioningFailed):
        return result.EXIT_FAILED, "PartitioningFailed"
    if isinstance(error, RuntimeTooOld):
        return result.EXIT_RUNTIME_TOO_OLD, "RuntimeTooOld"
    if isinstance(error, feature_switch.HandlerNotLoaded):
        return result.EXIT_CONTAINERD_NOT_BACK, "HandlerNotLoaded"
    if isinstance(error, RuntimeUnavailable):
        return result.EXIT_RUNTIME_UNAVAILABLE, "RuntimeUnavailable"
    if isinstance(error, (MalformedConfig, host.NotUtf8)):
        return result.EXIT_CONFIG_REFUSED, "ContainerdConfigRefused"
    if isinstance(error, host.ContainerdNotBack):
        return result.EXIT_CONTAINERD_NOT_BACK, "ContainerdNotBack"
    if isinstance(error, ConfigError):
        return result.EXIT_USAGE, "InvalidSettings"
    return result.EXIT_FAILED, type(error).__name__


async def _check_runtime(
    settings: Settings, state: FeatureState, known: dict[str, Any], wanted: Collection[str]
) -> None:
    """Ask the Runtime's version (GetVersion) before acting, note it in ``known`` (the result
    carries it whatever happens next), and refuse an action under a Runtime older than a feature
    it needs (``wanted``): :class:`RuntimeTooOld`, before anything on the node changes."""
    try:
        got = await get_version(settings.socket_dir, settings.rpc_timeout)
    except VersionUnknown as e:
        # The config daemon reports the same Runtime's version: degrade to it, and say so.
        log.warning(
            "runtime_version_unknown",
            error=str(e),
            using=f"ConfigService's runtime_version {state.runtime_version!r}",
        )
        version, driver = state.runtime_version, ""
    else:
        version, driver = got.version or state.runtime_version, got.driver_version
    known.update(runtime_version=version, driver_version=driver)
    log.info("runtime_version", runtime_version=version, driver_version=driver or "unknown")
    if not wanted:
        return  # switching off needs no feature
    if versions.parse(version) is None:
        log.warning(
            "runtime_version_unreadable",
            runtime_version=version,
            effect="no feature minimum checked (guide §4.1: v{major}.{feature}.{iteration})",
        )
    missing = versions.unmet(version, wanted, versions.FEATURE_MINIMUM)
    if missing:
        raise RuntimeTooOld(versions.refusal(version, missing))


async def act(settings: Settings, known: dict[str, Any] | None = None) -> result.Result:
    """Run the action; errors surface as :class:`JobAgentError`. ``known`` gets the facts
    learnt on the way (the Runtime's version), for a result of an action that fails later."""
    known = {} if known is None else known
    if settings.action == "partition":
        return await _partition(settings, known)
    return await _switch(settings, known)


async def _switch(settings: Settings, known: dict[str, Any]) -> result.Result:
    """Switch the Runtime's features and containerd's handler on or off
    (:mod:`.feature_switch`)."""
    annotation_patterns.check(settings.annotation_patterns)
    prepared = await feature_switch.prepare(settings)
    async with ConfigDaemon(settings.socket_dir, settings.rpc_timeout) as daemon:
        state = await daemon.state()
        wanted = list(state.features) if prepared.enable else ()
        await _check_runtime(settings, state, known, wanted)
        ok, reason, message, facts = await feature_switch.converge(
            settings, prepared, daemon, state, known
        )
    return _outcome(settings, ok, reason, message, **facts)


async def _partition(settings: Settings, known: dict[str, Any]) -> result.Result:
    """Converge the node's GPUs to ``--layout`` (:mod:`.partitioning`); containerd's config and
    the Runtime's features are not touched."""
    layout = partitioning.read_layout(settings.layout)  # no layout: refused before any call
    known.update(layout=layout.name, layout_digest=layout.digest())
    async with ConfigDaemon(settings.socket_dir, settings.rpc_timeout) as daemon:
        state = await daemon.state()
        await _check_runtime(settings, state, known, partitioning.features(layout))
        reason, message = await partitioning.converge(settings, layout, daemon, known)
    return _outcome(settings, True, reason, message, **known)


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
    known: dict[str, Any] = {}
    try:
        outcome = await act(settings, known)
        code = result.EXIT_OK if outcome.succeeded else result.EXIT_FAILED
    except JobAgentError as e:
        code, reason = _exit_code(e)
        outcome = _outcome(settings, False, reason, str(e), **known)
    except Exception as e:  # a bug or an input nobody foresaw: still a result the controller reads
        log.exception("action_crashed", action=settings.action)
        code = result.EXIT_FAILED
        outcome = _outcome(settings, False, "InternalError", f"{type(e).__name__}: {e}")
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


async def _until_signal(settings: Settings, tasks: lifecycle.Tasks) -> int:
    """Run the action as the one task; a signal (``tasks.stop``) stops it with a result that says
    so, a second one exits at once (:func:`lifecycle.on_signals`).

    Stopping mid-action is safe: every file is replaced atomically and the restart marker,
    written before the edit, makes the next run finish the restart.
    """
    codes: list[int] = []

    async def action() -> None:
        code, _ = await run_async(settings)
        codes.append(code)
        tasks.stop.set()  # done: nothing else to wait for

    tasks.spawn("action", action())
    await tasks.wait()
    await tasks.cancel()  # the action, if a signal came first (and its running command with it)
    if codes:  # finished, possibly in the same moment the signal came
        return codes[0]
    if tasks.fatal:  # run_async writes a result for every error; this is its own failure
        return result.EXIT_FAILED
    message = (
        "stopped by a signal before the action finished; files are whole, and the next run "
        "finishes it (restarting containerd if an edit is not loaded yet)"
        if settings.action != "partition"
        # each GPU changes by whole Runtime calls; the next run skips the GPUs already done
        else "stopped by a signal before the layout was reached; the next run continues from "
        "the GPUs not yet as it says"
    )
    result.write(settings.termination_log, _outcome(settings, False, "Interrupted", message))
    log.error("action_interrupted", action=settings.action, exit_code=result.EXIT_INTERRUPTED)
    return result.EXIT_INTERRUPTED


def run(settings: Settings, deprecations: Sequence[str] = ()) -> int:
    """The action's exit code (result.py): 0 done, 1 failed, 2 bad settings, 3 Runtime
    unavailable, 4 containerd config refused, 5 containerd not back or the handler not loaded,
    6 the Runtime older than a feature the action needs, 7 live allocations on GPUs to change
    (partition), 8 layout refused (partition), 130 stopped by a signal (a second signal: 130 at
    once)."""
    logs.configure(settings.log_level, settings.log_format)
    for note in deprecations:
        log.warning("deprecated_setting", note=note)
    log.info("starting", version=__version__, settings=dataclasses.asdict(settings))
    codes: list[int] = []

    async def main(tasks: lifecycle.Tasks) -> None:
        codes.append(await _until_signal(settings, tasks))

    failed = lifecycle.run(main, name="job_agent")
    return codes[0] if codes else failed
