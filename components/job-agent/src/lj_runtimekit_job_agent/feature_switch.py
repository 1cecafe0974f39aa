"""The enable/disable action: the Runtime's features and containerd's ``lj-runtime`` handler.

Enable switches the Runtime's features on, then writes the handler that uses them and restarts
containerd; disable goes in the reverse order. :func:`prepare` reads and plans before anything
changes (a malformed config stops everything); :func:`converge` makes the change once the app
has the config daemon and has checked the Runtime's version, as :mod:`.partitioning` does for a
partition layout.
"""

from __future__ import annotations

import asyncio
import json
import posixpath
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from . import __version__, cri, host
from . import containerd_config as cc
from .plan import FileChange, plan
from .runtime import ConfigDaemon, FeatureState
from .settings import Settings

log = structlog.get_logger("lj_runtimekit_job_agent")


class HandlerNotLoaded(host.ContainerdNotBack):
    """containerd came back from its restart without the handler state the files ask for."""


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


@dataclass(frozen=True)
class Prepared:
    """What the node has and what the action will change, read before any change."""

    enable: bool
    changes: list[FileChange]
    marker: Path
    pending: bool
    want: bool
    loaded: frozenset[str] | None
    stale: bool
    facts: dict[str, Any]


async def prepare(settings: Settings) -> Prepared:
    """Plan the containerd edit and read the restart marker and containerd's loaded handlers."""
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
    return Prepared(enable, changes, marker, pending, want, loaded, stale, facts)


async def converge(
    settings: Settings,
    prepared: Prepared,
    daemon: ConfigDaemon,
    state: FeatureState,
    known: dict[str, Any],
) -> tuple[bool, str, str, dict[str, Any]]:
    """Make the change (or, dry, show it): ``(succeeded, reason, message, facts)``."""
    p = prepared
    enable, changes, marker, pending, stale = p.enable, p.changes, p.marker, p.pending, p.stale
    facts = dict(p.facts)
    facts.update(known)
    if settings.dry_run:
        for change in changes:
            sys.stdout.write(change.diff())
        facts["runtime_changed"] = state.enabled != enable
        return True, "DryRun", _summary(settings, dry=True, **facts), facts
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
        if p.loaded is not None:  # only a containerd that answered before is held to it
            await _confirm_loaded(settings, p.want)
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
        return False, "RuntimeStateMismatch", message, facts
    reason = "Done" if runtime_changed or changes or restart else "AlreadyDone"
    return True, reason, _summary(settings, **facts), facts


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
