"""Lifecycle of the job agent: one action, one result, one exit code."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import posixpath
import sys
import time
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import structlog

from . import (
    __version__,
    annotation_patterns,
    cri,
    host,
    lifecycle,
    logs,
    partitioning,
    result,
    versions,
)
from . import containerd_config as cc
from .containerd_config import MalformedConfig
from .errors import ConfigError, JobAgentError, PermanentError
from .plan import FileChange, plan
from .runtime import ConfigDaemon, FeatureState, RuntimeUnavailable, VersionUnknown, get_version
from .settings import Settings

log = structlog.get_logger("lj_runtimekit_job_agent")


class HandlerNotLoaded(host.ContainerdNotBack):
    """containerd came back from its restart without the handler state the files ask for."""


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
    if isinstance(error, HandlerNotLoaded):
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


def _read(settings: Settings, path: str) -> str | None:
    return host.read(host.resolve(settings.host_root, host.on_host(settings.host_root, path)))


def _handler(settings: Settings, config_text: str | None) -> cc.Handler:
    """The handler to write: the guide's values, SystemdCgroup as the node's runc (or as set)."""
    handler = cc.Handler(container_annotations=settings.annotation_patterns)
    if settings.systemd_cgroup != "auto":
        return handler.with_systemd_cgroup(settings.systemd_cgroup == "true")
    texts: list[str] = []
    if config_text is not None:
        texts.append(config_text)
        config_dir = posixpath.dirname(settings.containerd_config)
        for pattern in cc.imports_of(config_text, config_dir):
            for path in host.matching(settings.host_root, pattern):
                if posixpath.basename(path) != cc.DROPIN_NAME:
                    texts.append(_read(settings, path) or "")
    return handler.with_systemd_cgroup(cc.node_systemd_cgroup(texts))


def _plan(settings: Settings) -> tuple[list[FileChange], cc.Handler]:
    text = _read(settings, settings.containerd_config)
    handler = _handler(settings, text)
    changes = plan(
        settings.action,
        settings.containerd_config,
        text,
        lambda p: _read(settings, p),
        settings.new_config_version,
        handler=handler,
    )
    return changes, handler


def _apply(settings: Settings, changes: list[FileChange]) -> None:
    # In the plan's order: an operator's block is saved before it is replaced, restored before
    # its saved copy goes; containerd reads nothing half-done either way.
    for change in changes:
        path = host.on_host(settings.host_root, change.path)
        if change.after is not None:
            path = host.resolve(settings.host_root, path)
        if change.after is None:
            host.remove(path)
            log.info("containerd_config_removed", path=str(path))
        else:
            backup = host.write_atomic(path, change.after, backup=change.backup)
            log.info("containerd_config_written", path=str(path), backup=str(backup or ""))


def _mark_restart_pending(settings: Settings, marker: Path, changes: list[FileChange]) -> None:
    """Durably note, before the edit, that containerd must be restarted to load it."""
    note = {"action": settings.action, "files": [c.path for c in changes], "agent": __version__}
    host.write_atomic(marker, json.dumps(note) + "\n", backup=False)


async def _loaded(settings: Settings) -> frozenset[str] | None:
    """The handlers the running containerd has loaded; None when it cannot be asked (logged)."""
    if not settings.containerd_socket:
        return None
    try:
        return await cri.loaded_handlers(settings.containerd_socket, settings.rpc_timeout)
    except cri.ContainerdUnreachable as e:
        # Crash-only: the file edit and the marker still work without it; say what is unknown.
        log.warning(
            "containerd_handlers_unknown",
            socket=settings.containerd_socket,
            error=str(e),
            hint="cannot confirm containerd loaded the handler; the file and marker decide",
        )
        return None


def _wanted_loaded(settings: Settings, changes: list[FileChange]) -> bool:
    """Whether containerd should have an ``lj-runtime`` handler once the changes are applied:
    always after enable; after disable only when an operator's own handler is (back) there."""
    if settings.action == "enable":
        return True
    final = {c.path: c.after for c in changes}
    text = final.get(settings.containerd_config, _read(settings, settings.containerd_config))
    return text is not None and cc.handler_block(text) is not None


async def _confirm_loaded(settings: Settings, want: bool) -> None:
    """After a restart: poll the running containerd until it shows the wanted handler state."""
    deadline = time.monotonic() + settings.restart_timeout
    seen: frozenset[str] | str = "no answer"
    while time.monotonic() < deadline:
        try:
            loaded = await cri.loaded_handlers(settings.containerd_socket, settings.rpc_timeout)
        except cri.ContainerdUnreachable as e:
            seen = str(e)
        else:
            if (cc.HANDLER in loaded) == want:
                return
            seen = loaded
        await asyncio.sleep(0.2)
    raise HandlerNotLoaded(
        f"containerd restarted but its CRI does not show handler {cc.HANDLER!r} "
        f"{'loaded' if want else 'removed'} within {settings.restart_timeout:g}s "
        f"(it shows: {sorted(seen) if isinstance(seen, frozenset) else seen}); check "
        "`containerd config dump` and `journalctl -u containerd` on the node"
    )


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
    annotation_patterns.check(settings.annotation_patterns)
    enable = settings.action == "enable"
    changes, handler = _plan(settings)  # before any change: a malformed config stops everything
    marker = host.on_host(settings.host_root, settings.marker_path)
    pending = host.read(marker) is not None
    want = _wanted_loaded(settings, changes)
    loaded = await _loaded(settings)
    # The effect, not the file: a handler on disk that the running containerd never loaded (an
    # edit whose restart was lost with its marker, or made by someone else) still needs a restart.
    stale = loaded is not None and (cc.HANDLER in loaded) != want
    facts: dict[str, Any] = {
        "containerd_changed": bool(changes),
        "containerd_files": tuple(c.path for c in changes),
        "restart_was_pending": pending or stale,
        "systemd_cgroup": handler.systemd_cgroup if enable else None,
    }
    async with ConfigDaemon(settings.socket_dir, settings.rpc_timeout) as daemon:
        state = await daemon.state()
        await _check_runtime(settings, state, known, list(state.features) if enable else ())
        facts.update(known)
        if settings.dry_run:
            for change in changes:
                sys.stdout.write(change.diff())
            facts["runtime_changed"] = state.enabled != enable
            return _outcome(
                settings, True, "DryRun", _summary(settings, dry=True, **facts), **facts
            )
        # Enable: Runtime first, then the handler that uses it; disable in the reverse order.
        runtime_changed = False
        if enable:
            runtime_changed, state = await daemon.set_enabled(True)
        restart = bool(settings.restart_command) and (bool(changes) or pending or stale)
        if changes and settings.restart_command:
            _mark_restart_pending(settings, marker, changes)
        _apply(settings, changes)
        if restart:
            await host.restart_containerd(
                settings.restart_command, settings.confirm_command, settings.restart_timeout
            )
            if loaded is not None:  # only a containerd that answered before is held to it
                await _confirm_loaded(settings, want)
            host.remove(marker)
            log.info(
                "containerd_restarted",
                pending_before=pending,
                not_loaded_before=stale,
                files=facts["containerd_files"],
            )
        if not enable:
            runtime_changed, state = await daemon.set_enabled(False)
    facts.update(runtime_changed=runtime_changed, containerd_restarted=restart)
    if state.enabled != enable:
        message = f"config daemon reports enabled={state.enabled} after SetFeatures"
        return _outcome(settings, False, "RuntimeStateMismatch", message, **facts)
    reason = "Done" if runtime_changed or changes or restart else "AlreadyDone"
    return _outcome(settings, True, reason, _summary(settings, **facts), **facts)


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


def _summary(settings: Settings, dry: bool = False, **facts: Any) -> str:
    """What the run did (or, dry, would do), in words the controller records on the node."""
    on = "on" if settings.action == "enable" else "off"
    enable = settings.action == "enable"
    parts = [
        f"Runtime features {'switched' if facts['runtime_changed'] else 'already'} {on}",
    ]
    if facts["containerd_files"]:
        files = ", ".join(facts["containerd_files"])
        parts.append(f"lj-runtime handler {'written' if enable else 'removed'} ({files} edited)")
    else:
        where = "in" if enable else "absent from"
        parts.append(f"lj-runtime handler already {where} {settings.containerd_config}")
    if facts["systemd_cgroup"] is not None:
        source = "the node's runc" if settings.systemd_cgroup == "auto" else "--systemd-cgroup"
        parts.append(f"SystemdCgroup={str(facts['systemd_cgroup']).lower()} as {source}")
    needed = bool(facts["containerd_files"]) or facts["restart_was_pending"]
    if needed and not settings.restart_command:
        parts.append("containerd NOT restarted (no --restart-command): restart it to load this")
    elif needed and dry:
        parts.append("containerd would be restarted")
    elif facts.get("containerd_restarted"):
        late = (
            " (finishing a restart an earlier run left pending)"
            if facts["restart_was_pending"] and not facts["containerd_files"]
            else ""
        )
        parts.append(f"containerd restarted and answering{late}")
    return f"{'dry run: ' if dry else ''}{settings.action}: " + "; ".join(parts)


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
