"""Settings of the job agent: flag > environment > default.

The action is a positional argument (``enable`` or ``disable``); every other field is one flag
``--host-root`` and one environment variable ``LJ_RUNTIMEKIT_JOB_AGENT_HOST_ROOT``. The controller
passes them in the Job's command. This is the only module that reads the environment.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import posixpath
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from lj_runtimekit_interface import sockets

from . import __version__
from .errors import ConfigError

ENV_PREFIX = "LJ_RUNTIMEKIT_JOB_AGENT_"
ACTIONS = ("enable", "disable")
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("auto", "json", "console")
SYSTEMD_CGROUP = ("auto", "true", "false")
_HOST_SHELL = "nsenter --target 1 --mount --uts --ipc --net --pid --"


def _doc(text: str, default: Any) -> Any:
    return field(default=default, metadata={"help": text})


@dataclass(frozen=True)
class Settings:
    """The effective configuration, fixed at start."""

    action: str = _doc("enable or disable (positional).", "enable")
    node_name: str = _doc("This node's name, for the result. Default: NODE_NAME or hostname.", "")
    socket_dir: str = _doc("Directory of the Runtime's sockets.", sockets.DEFAULT_SOCKET_DIR)
    host_root: str = _doc(
        "Where the host's file system is seen; host paths below are read under it. Tests point "
        "it at a temp dir.",
        "/",
    )
    containerd_config: str = _doc(
        "containerd's config file, as a host path.", "/etc/containerd/config.toml"
    )
    new_config_version: int = _doc(
        "Config version written when the containerd config file does not exist (2 for "
        "containerd 1.x, 3 for 2.0-2.3, 4 for 2.4 and later).",
        2,
    )
    systemd_cgroup: str = _doc(
        "SystemdCgroup of the lj-runtime handler: auto (follow the node's own runc runtime in "
        "containerd's config, containerd's default false when it says nothing), true or false. "
        "It must match the kubelet's cgroup driver: runc with systemd cgroups on a cgroupfs node "
        "fails every container with 'expected cgroupsPath to be of format \"slice:prefix:name\"'.",
        "auto",
    )
    container_annotations: str = _doc(
        "The handler's container_annotations, comma-separated Go path.Match patterns; each "
        "injection annotation key (docs/contracts.md) must pass one, else the agent refuses.",
        "xdm.amp.com*",
    )
    restart_command: str = _doc(
        "Command that restarts containerd on the host; run only when a file really changed. "
        "Empty: never restart.",
        f"{_HOST_SHELL} systemctl restart containerd",
    )
    confirm_command: str = _doc(
        "Command that succeeds once containerd is back; polled after the restart. Empty: no check.",
        f"{_HOST_SHELL} systemctl is-active --quiet containerd",
    )
    restart_marker: str = _doc(
        "Host path of the durable 'containerd restart pending' marker: written before a config "
        "edit, removed once the restart is confirmed, so a run after a failed or interrupted "
        "restart restarts containerd instead of reporting success. Empty: "
        "<containerd config dir>/.lj-runtimekit-restart-pending.",
        "",
    )
    containerd_socket: str = _doc(
        "containerd's CRI socket, as the agent sees it, asked which handlers the running "
        "containerd has loaded: a handler in the file but not loaded (an edit never followed by a "
        "restart) is restarted, not reported done. The default reaches the host's socket through "
        "host PID 1's root (the agent runs with hostPID), so no extra mount is needed. Empty: do "
        "not ask; the file and the restart marker are then all the agent knows.",
        "/proc/1/root/run/containerd/containerd.sock",
    )
    restart_timeout: float = _doc("Seconds to wait for containerd to be back.", 60.0)
    rpc_timeout: float = _doc("Seconds one config daemon call may take.", 10.0)
    termination_log: str = _doc(
        "Where the JSON result goes (the pod's terminationMessagePath). Empty: nowhere.",
        "/dev/termination-log",
    )
    dry_run: bool = _doc("Print the diff that would be applied; change nothing.", False)
    log_level: str = _doc("Log level: debug, info, warning or error.", "info")
    log_format: str = _doc("Log format: json, console, or auto (json when not a terminal).", "auto")

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ConfigError(f"action {self.action!r}: expected one of {ACTIONS}")
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(f"log_level {self.log_level!r}: expected one of {LOG_LEVELS}")
        if self.log_format not in LOG_FORMATS:
            raise ConfigError(f"log_format {self.log_format!r}: expected one of {LOG_FORMATS}")
        if self.new_config_version not in (2, 3, 4):
            raise ConfigError(f"new_config_version {self.new_config_version}: expected 2, 3 or 4")
        if not self.containerd_config.startswith("/"):
            raise ConfigError(f"containerd_config {self.containerd_config!r}: expected a host path")
        if self.systemd_cgroup not in SYSTEMD_CGROUP:
            raise ConfigError(
                f"systemd_cgroup {self.systemd_cgroup!r}: expected one of {SYSTEMD_CGROUP}"
            )
        if self.restart_marker and not self.restart_marker.startswith("/"):
            raise ConfigError(f"restart_marker {self.restart_marker!r}: expected a host path")
        for name in ("restart_timeout", "rpc_timeout"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):  # inf: wait forever
                raise ConfigError(f"{name} {value}: expected a positive finite number")

    @property
    def annotation_patterns(self) -> tuple[str, ...]:
        return tuple(p.strip() for p in self.container_annotations.split(",") if p.strip())

    @property
    def marker_path(self) -> str:
        """The restart marker's host path."""
        directory = posixpath.dirname(self.containerd_config)
        return self.restart_marker or posixpath.join(directory, ".lj-runtimekit-restart-pending")


FIELDS = {f.name: f for f in dataclasses.fields(Settings) if f.name != "action"}


def _bool(raw: str) -> bool:
    if raw.lower() in ("1", "true", "yes", "on"):
        return True
    if raw.lower() in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(raw)


def _converter(name: str) -> Callable[[str], Any]:
    kind = str(FIELDS[name].type)
    table: dict[str, Callable[[str], Any]] = {"int": int, "float": float, "bool": _bool}
    return table.get(kind, str)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lj-runtimekit-job-agent",
        description="Enables or disables Runtime Kit on this node: the Runtime's config daemon and "
        f"containerd's lj-runtime handler. Each flag also reads {ENV_PREFIX}<FLAG>. Exit codes: "
        "0 done, 1 failed, 2 usage, 3 Runtime unavailable, 4 containerd config refused, "
        "5 containerd not back after restart (or the handler not loaded by it), 130 stopped by a "
        "signal.",
    )
    p.add_argument("--version", action="version", version=f"lj-runtimekit-job-agent {__version__}")
    p.add_argument("action", choices=ACTIONS, help="what to do on this node")
    for name, f in FIELDS.items():
        flag = "--" + name.replace("_", "-")
        if f.type in (bool, "bool"):
            p.add_argument(
                flag, dest=name, default=None, action="store_true", help=f.metadata["help"]
            )
            continue
        p.add_argument(
            flag,
            dest=name,
            default=None,
            type=_converter(name),
            help=f"{f.metadata['help']} (default: {f.default!r})",
        )
    return p


def load(argv: list[str] | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """The effective settings; raises :class:`ConfigError` with what to fix."""
    env = os.environ if environ is None else environ
    args = vars(parser().parse_args(argv))
    values: dict[str, Any] = {"action": args.pop("action")}
    for name in FIELDS:
        raw = env.get(ENV_PREFIX + name.upper())
        if raw is not None:
            try:
                values[name] = _converter(name)(raw)
            except ValueError as e:
                raise ConfigError(f"environment {ENV_PREFIX}{name.upper()}={raw!r} invalid") from e
    values.update({k: v for k, v in args.items() if v is not None})
    if not values.get("node_name"):
        values["node_name"] = env.get("NODE_NAME") or socket.gethostname()
    return Settings(**values)
