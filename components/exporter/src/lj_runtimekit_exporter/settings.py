"""Settings of the exporter: flag > environment > ConfigMap file > default.

Every field is one flag ``--poll-interval``, one environment variable
``LJ_RUNTIMEKIT_EXPORTER_POLL_INTERVAL`` and one key ``poll_interval`` of the ConfigMap file
(YAML, ``version: v1``; unknown versions and keys are rejected). This is the only module that
reads the environment.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lj_runtimekit_interface import sockets

from . import __version__
from .errors import ConfigError

ENV_PREFIX = "LJ_RUNTIMEKIT_EXPORTER_"
CONFIG_VERSION = "v1"
PODS_SOURCES = ("kubelet", "apiserver", "none")
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("auto", "json", "console")


def _doc(text: str, default: Any) -> Any:
    return field(default=default, metadata={"help": text})


@dataclass(frozen=True)
class Settings:
    """The effective configuration, fixed at start."""

    node_name: str = _doc(
        "Name of this node: the `node` label and the apiserver's spec.nodeName selector. "
        "In a DaemonSet set NODE_NAME from the downward API (also read). Default: the hostname.",
        "",
    )
    socket_dir: str = _doc(
        "Directory of the Runtime's sockets (device-daemon.sock, monitor-daemon.sock).",
        sockets.DEFAULT_SOCKET_DIR,
    )
    listen_address: str = _doc("Address the HTTP server binds.", "0.0.0.0")
    port: int = _doc("Port of /metrics and /healthz (the guide's 9501); 0 picks a free one.", 9501)
    poll_interval: float = _doc(
        "Seconds between background polls of the Runtime and the pod list. Scrapes never call "
        "out; they read the last poll. Keep it at or below the Prometheus scrape interval.",
        5.0,
    )
    rpc_timeout: float = _doc("Seconds one Runtime call may take before the poll gives up.", 2.0)
    pods_source: str = _doc(
        "Where pods come from: `kubelet` (read-only /pods, the guide's way), `apiserver` "
        "(spec.nodeName watch, for clusters that keep 10255 closed) or `none` (no pod filter: "
        "attribution trusts the Runtime's allocation list).",
        "kubelet",
    )
    kubelet_pods_url: str = _doc(
        "URL of the kubelet's read-only pod list.", "http://localhost:10255/pods"
    )
    kubelet_timeout: float = _doc("Seconds one /pods or pod-resources request may take.", 2.0)
    pod_resources_socket: str = _doc(
        "The kubelet's pod-resources socket: which pod and container holds which device, the "
        "source of attribution (the pod source above is the fallback while it does not answer). "
        "Empty: not used.",
        "/var/lib/kubelet/pod-resources/kubelet.sock",
    )
    kubeconfig: str = _doc(
        "Kubeconfig for --pods-source=apiserver; empty means the in-cluster ServiceAccount.", ""
    )
    log_level: str = _doc("Log level: debug, info, warning or error.", "info")
    log_format: str = _doc("Log format: json, console, or auto (json when not a terminal).", "auto")

    @property
    def max_snapshot_age(self) -> float:
        """Seconds after which a snapshot serves no device series (a stuck poll loop)."""
        return 3 * self.poll_interval + 4 * self.rpc_timeout + self.kubelet_timeout

    def __post_init__(self) -> None:
        if self.pods_source not in PODS_SOURCES:
            raise ConfigError(f"pods_source {self.pods_source!r}: expected one of {PODS_SOURCES}")
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(f"log_level {self.log_level!r}: expected one of {LOG_LEVELS}")
        if self.log_format not in LOG_FORMATS:
            raise ConfigError(f"log_format {self.log_format!r}: expected one of {LOG_FORMATS}")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port {self.port}: expected 0..65535")
        for name in ("poll_interval", "rpc_timeout", "kubelet_timeout"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} {getattr(self, name)}: expected a positive number")


FIELDS = {f.name: f for f in dataclasses.fields(Settings)}


def _converter(name: str) -> Callable[[str], Any]:
    kind = FIELDS[name].type
    return {"int": int, "float": float}.get(str(kind), str)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lj-runtimekit-exporter",
        description="Prometheus metrics on :9501 from the Runtime, attributed to pods. Each "
        f"flag also reads {ENV_PREFIX}<FLAG> and the key <flag> of the --config file.",
    )
    p.add_argument("--version", action="version", version=f"lj-runtimekit-exporter {__version__}")
    p.add_argument(
        "--config",
        default=None,
        help=f"ConfigMap YAML file (version: {CONFIG_VERSION}); env {ENV_PREFIX}CONFIG",
    )
    for name, f in FIELDS.items():
        p.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            default=None,
            type=_converter(name),
            help=f"{f.metadata['help']} (default: {f.default!r})",
        )
    return p


def _from_file(path: str) -> dict[str, Any]:
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise ConfigError(f"config file {path}: {e.strerror}") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path} is not valid YAML: {e}") from e
    if not isinstance(doc, dict):
        raise ConfigError(f"config file {path}: expected a mapping with version: {CONFIG_VERSION}")
    version = doc.pop("version", None)
    if version != CONFIG_VERSION:
        raise ConfigError(
            f"config file {path}: version {version!r} unknown, expected {CONFIG_VERSION!r}"
        )
    unknown = sorted(set(doc) - set(FIELDS))
    if unknown:
        raise ConfigError(f"config file {path}: unknown keys {unknown}; known: {sorted(FIELDS)}")
    return doc


def _coerce(name: str, raw: Any, where: str) -> Any:
    kind = str(FIELDS[name].type)
    # YAML gives bools, lists and maps too: only scalars of the field's kind are taken
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise ConfigError(f"{where}: {name}={raw!r} is not a valid {kind}")
    try:
        return _converter(name)(str(raw))
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: {name}={raw!r} is not a valid {kind}") from e


def load(argv: list[str] | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """The effective settings; raises :class:`ConfigError` with what to fix."""
    env = os.environ if environ is None else environ
    args = vars(parser().parse_args(argv))
    config_path = args.pop("config") or env.get(ENV_PREFIX + "CONFIG")
    values: dict[str, Any] = {}
    if config_path:
        for k, v in _from_file(config_path).items():
            values[k] = _coerce(k, v, f"config file {config_path}")
    for name in FIELDS:
        raw = env.get(ENV_PREFIX + name.upper())
        if raw is not None:
            values[name] = _coerce(name, raw, f"environment {ENV_PREFIX}{name.upper()}")
    values.update({k: v for k, v in args.items() if v is not None})
    if not values.get("node_name"):
        values["node_name"] = env.get("NODE_NAME") or socket.gethostname()
    return Settings(**values)
