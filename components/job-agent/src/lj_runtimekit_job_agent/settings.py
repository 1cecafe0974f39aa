"""Settings of the job agent: flag > environment > ConfigMap file > default.

The action is a positional argument (``enable``, ``disable`` or ``partition``); every other field
is one flag ``--host-root``, one environment variable ``LJ_RUNTIMEKIT_JOB_AGENT_HOST_ROOT`` and
one key ``host_root`` of an optional ConfigMap file (``--config``): the shared shape of
:mod:`.cli` and :mod:`.config` (docs/shape.md). The controller passes them in the Job's args
(``<action> --node-name=<node> --socket-dir=<dir> <its --job-agent-args>``, pinned by its
admission policy), so every v1.13 spelling of those args keeps its meaning. This is the only
module that reads the environment.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import posixpath
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from lj_runtimekit_interface import sockets

from . import __version__, cli, config
from .errors import ConfigError

PROG = "lj-runtimekit-job-agent"
ENV_PREFIX = "LJ_RUNTIMEKIT_JOB_AGENT_"
ACTIONS = ("enable", "disable", "partition")
LOG_LEVELS = cli.LOG_LEVELS
LOG_FORMATS = cli.LOG_FORMATS
SYSTEMD_CGROUP = ("auto", "true", "false")
_HOST_SHELL = "nsenter --target 1 --mount --uts --ipc --net --pid --"
#: What v1.13 read as a boolean in the environment (lower-cased) beyond Go's ParseBool spellings;
#: still read, with a deprecation note, until v1.15.0.
_V113_TRUE = ("1", "true", "yes", "on")
_V113_FALSE = ("0", "false", "no", "off", "")
_doc = cli.setting


@dataclass(frozen=True)
class Settings:
    """The effective configuration, fixed at start."""

    action: str = _doc("enable, disable or partition (positional).", "enable", choices=ACTIONS)
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
        choices=SYSTEMD_CGROUP,
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
    layout: str = _doc(
        "partition only (and required there): the partition layout to converge this node's GPUs "
        "to, as the controller writes it (the canonical JSON of docs/partitioning.md's layout).",
        "",
    )
    wait_for_release: float = _doc(
        "partition only: seconds to wait, polling every 2 s, for live allocations on GPUs that "
        "must change to end before giving up with exit 7 (AllocationsLive); 0: do not wait.",
        60.0,
    )
    vfio_resource: str = _doc(
        "partition only: the extended resource under which the device plugin gives GPUs bound to "
        "vfio-pci to pods (VMs), as its resource_gpu_vfio. Before changing a vfio-bound GPU the "
        "agent asks the kubelet which pods hold it under this resource: the Runtime makes no "
        "allocation for them.",
        "aliyun.com/gpu-vfio",
    )
    pod_resources_socket: str = _doc(
        "partition only: the kubelet's pod-resources socket, as the agent sees it (the controller "
        "mounts its directory into partition Jobs). Asked only when a GPU bound to vfio-pci must "
        "change; unreachable then: exit 7, that GPU is not changed.",
        "/var/lib/kubelet/pod-resources/kubelet.sock",
    )
    dry_run: bool = _doc(
        "Print the diff that would be applied; change nothing (--dry-run alone means true).",
        False,
    )
    log_level: str = cli.log_level()
    log_format: str = cli.log_format()

    def __post_init__(self) -> None:
        try:
            config.validate(self)  # choices, NUL, finite numbers
        except config.SettingsError as e:
            raise ConfigError(str(e)) from e
        # The v1.13 checks, kept with their messages (validate() above already refuses a value
        # outside the choices, so the first of these only speak for a subclass or a test).
        if self.action not in ACTIONS:
            raise ConfigError(f"action {self.action!r}: expected one of {ACTIONS}")
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
        if not self.pod_resources_socket.startswith("/"):
            raise ConfigError(
                f"pod_resources_socket {self.pod_resources_socket!r}: expected an absolute path"
            )
        if not self.vfio_resource:
            raise ConfigError("vfio_resource is empty: expected the vfio GPUs' resource name")
        if self.action == "partition" and not self.layout:
            raise ConfigError("action partition needs --layout (the layout's JSON)")
        if self.action != "partition" and self.layout:
            raise ConfigError(f"--layout is for the partition action only, not {self.action}")
        if not (self.wait_for_release >= 0 and math.isfinite(self.wait_for_release)):
            raise ConfigError(
                f"wait_for_release {self.wait_for_release}: expected 0 or a positive finite number"
            )
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


#: The settings read from flags, environment and file; ``action`` is the positional.
FIELDS = {f.name: f for f in dataclasses.fields(Settings) if f.name != "action"}
_BOOLS = tuple(name for name, f in FIELDS.items() if str(f.type) == "bool")


def parser() -> argparse.ArgumentParser:
    p = cli.parser(
        PROG,
        "Enables or disables Runtime Kit on this node: the Runtime's config daemon and "
        "containerd's lj-runtime handler; or (partition) converges the node's GPUs to a "
        "partition layout through the Runtime. Runs once, as the controller's Job.\n\nExit "
        "codes: 0 done, 1 failed, 2 usage or bad settings, 3 Runtime unavailable, 4 containerd "
        "config refused, 5 containerd not back after restart (or the handler not loaded by it), "
        "6 the Runtime older than a feature needs, 7 live allocations on GPUs to change "
        "(partition), 8 layout refused for this node's hardware (partition), 130 stopped by a "
        "signal.",
        FIELDS.values(),
        env_prefix=ENV_PREFIX,
        version=__version__,
    )
    p.add_argument("action", choices=ACTIONS, help="what to do on this node")
    return p


def _bare_bools(p: argparse.ArgumentParser, argv: Sequence[str]) -> list[str]:
    """``--dry-run`` as v1.13 read it: a switch that never takes the next word. The shared parser
    lets a bool flag take a value (``--dry-run false``), which would eat the action of
    ``--dry-run enable``; a next word that is no boolean stays where it is. An abbreviation
    argparse resolves to the flag (``--dry``) is read the same way."""
    options = [o for action in p._actions for o in action.option_strings]
    bools = {cli.flag_name(name) for name in _BOOLS}
    out = list(argv)
    for i, arg in enumerate(out[:-1]):
        if arg == "--":  # the rest are positionals
            break
        if not arg.startswith("--") or out[i + 1] in (*cli.TRUE, *cli.FALSE):
            continue
        matches = {o for o in options if o.startswith(arg)}
        if arg in bools or (len(matches) == 1 and matches <= bools):
            out[i] = f"{arg}=true"
    return out


def _v113_environment(environ: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """The environment with v1.13's extra boolean spellings (yes/on/no/off/empty, any case)
    rewritten to the shared ones, each with a deprecation note."""
    env = dict(environ)
    notes: list[str] = []
    for name in _BOOLS:
        key = cli.env_name(ENV_PREFIX, name)
        raw = env.get(key)
        if raw is None or raw.strip() in (*cli.TRUE, *cli.FALSE):
            continue
        word = raw.lower()
        value = "true" if word in _V113_TRUE else "false" if word in _V113_FALSE else None
        if value is not None:  # anything else the loader refuses, naming the variable
            env[key] = value
            notes.append(
                f"environment {key}={raw!r} is deprecated: use {value} (the old spelling goes "
                "in v1.15.0)"
            )
    return env, notes


def load_noting(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> tuple[Settings, list[str]]:
    """The effective settings and a note per deprecated spelling used; raises
    :class:`ConfigError` with what to fix (argparse exits 2 itself on an unknown flag)."""
    env, notes = _v113_environment(os.environ if environ is None else environ)
    p = parser()
    flags = vars(p.parse_args(_bare_bools(p, sys.argv[1:] if argv is None else argv)))
    try:
        values, more = config.load(Settings, flags=flags, environ=env, env_prefix=ENV_PREFIX)
    except config.SettingsError as e:
        raise ConfigError(str(e)) from e
    if not values.get("node_name"):
        values["node_name"] = env.get("NODE_NAME") or socket.gethostname()
    return Settings(**values), notes + more


def load(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """The effective settings; raises :class:`ConfigError` with what to fix."""
    return load_noting(argv, environ)[0]
