"""Settings of the controller: flag > environment > ConfigMap file > default.

Every field is one flag ``--job-image``, one environment variable
``LJ_RUNTIMEKIT_CONTROLLER_JOB_IMAGE`` and one key ``job_image`` of the ConfigMap file (YAML,
``version: v1``; unknown versions and keys are rejected). This is the only module that reads the
environment.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
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

ENV_PREFIX = "LJ_RUNTIMEKIT_CONTROLLER_"
CONFIG_VERSION = "v1"
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("auto", "json", "console")


def _doc(text: str, default: Any) -> Any:
    return field(default=default, metadata={"help": text})


@dataclass(frozen=True)
class Settings:
    """The effective configuration, fixed at start."""

    job_image: str = _doc("Image of the job agent the Jobs run (required).", "")
    namespace: str = _doc("Namespace of the agent Jobs, the Lease and the Events.", "kube-system")
    label_key: str = _doc("Node label that switches Runtime Kit on.", "lj_runtimekit_enable")
    label_value: str = _doc(
        "Value of the label that means enabled; any other means disabled.", "true"
    )
    node_selector: str = _doc(
        "Label selector of the nodes the controller watches; empty: every node.", ""
    )
    job_pod_annotations: str = _doc(
        "Extra annotations on the agent pods, comma-separated key=value.", ""
    )
    concurrency: int = _doc("Nodes reconciled at the same time (workers).", 10)
    max_active_jobs: int = _doc("Agent Jobs running at once, cluster-wide.", 50)
    api_qps: float = _doc("Apiserver requests per second, on average.", 20.0)
    api_burst: int = _doc("Apiserver requests allowed at once above the average.", 40)
    retry_limit: int = _doc("Tries of one action before waiting for the operator.", 3)
    retry_backoff: float = _doc("Seconds before the second try; doubles each try.", 10.0)
    retry_backoff_max: float = _doc("Longest wait between tries, seconds.", 300.0)
    job_deadline: int = _doc("activeDeadlineSeconds of an agent Job.", 600)
    job_backoff_limit: int = _doc("backoffLimit of an agent Job (pod retries inside one try).", 0)
    job_priority_class: str = _doc(
        "priorityClassName of the agent pods; empty: none.", "system-node-critical"
    )
    job_agent_args: str = _doc("Extra arguments for the agent, space-separated.", "")
    socket_dir: str = _doc(
        "The Runtime's socket directory on the nodes (mounted into the Job).",
        sockets.DEFAULT_SOCKET_DIR,
    )
    containerd_dir: str = _doc(
        "containerd's config directory on the nodes (mounted).", "/etc/containerd"
    )
    leader_elect: bool = _doc("Elect a leader through a Lease (set false for one replica).", True)
    lease_name: str = _doc("Name of the Lease.", "lj-runtimekit-controller")
    lease_duration: float = _doc("Seconds a Lease holds without renewal.", 15.0)
    renew_deadline: float = _doc("Seconds the leader retries renewing before it gives up.", 10.0)
    retry_period: float = _doc("Seconds between Lease tries.", 2.0)
    identity: str = _doc("This replica's Lease identity. Default: POD_NAME or hostname.", "")
    kubeconfig: str = _doc("Kubeconfig file; empty: the in-cluster ServiceAccount.", "")
    listen_address: str = _doc("Address of /metrics and /healthz.", "0.0.0.0")
    port: int = _doc("Port of /metrics and /healthz; 0 picks a free one.", 8080)
    log_level: str = _doc("Log level: debug, info, warning or error.", "info")
    log_format: str = _doc("Log format: json, console, or auto (json when not a terminal).", "auto")

    def __post_init__(self) -> None:
        if not self.job_image:
            raise ConfigError("job_image is required: the job agent's image (--job-image)")
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(f"log_level {self.log_level!r}: expected one of {LOG_LEVELS}")
        if self.log_format not in LOG_FORMATS:
            raise ConfigError(f"log_format {self.log_format!r}: expected one of {LOG_FORMATS}")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port {self.port}: expected 0..65535")
        for name in (
            "concurrency",
            "max_active_jobs",
            "api_burst",
            "retry_limit",
            "job_deadline",
            "api_qps",
            "retry_backoff",
            "retry_backoff_max",
            "lease_duration",
            "renew_deadline",
            "retry_period",
        ):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):  # inf would sleep or wait forever
                raise ConfigError(f"{name} {value}: expected a positive finite number")
        for item in filter(None, self.job_pod_annotations.split(",")):
            if "=" not in item:
                raise ConfigError(f"job_pod_annotations item {item!r}: expected key=value")
        if self.job_backoff_limit < 0:
            raise ConfigError(f"job_backoff_limit {self.job_backoff_limit}: expected >= 0")
        if not self.renew_deadline < self.lease_duration:
            raise ConfigError("renew_deadline must be shorter than lease_duration")


FIELDS = {f.name: f for f in dataclasses.fields(Settings)}


def _bool(raw: str) -> bool:
    if raw.lower() in ("1", "true", "yes", "on"):
        return True
    if raw.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(raw)


def _converter(name: str) -> Callable[[str], Any]:
    table: dict[str, Callable[[str], Any]] = {"int": int, "float": float, "bool": _bool}
    return table.get(str(FIELDS[name].type), str)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lj-runtimekit-controller",
        description="Turns the node label lj_runtimekit_enable into job-agent Jobs and records "
        f"their results on the node. Each flag also reads {ENV_PREFIX}<FLAG> and the key <flag> "
        "of the --config file.",
    )
    p.add_argument("--version", action="version", version=f"lj-runtimekit-controller {__version__}")
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
    unknown = sorted(str(k) for k in set(doc) - set(FIELDS))  # YAML keys may be numbers
    if unknown:
        raise ConfigError(f"config file {path}: unknown keys {unknown}; known: {sorted(FIELDS)}")
    return doc


def _coerce(name: str, raw: Any, where: str) -> Any:
    if isinstance(raw, dict | list) or raw is None:
        # str() would turn `job_image: [a, b]` into the image "['a', 'b']" without a word.
        raise ConfigError(f"{where}: {name}={raw!r} is not a valid {FIELDS[name].type}")
    try:
        if isinstance(raw, bool):
            raw = str(raw)
        return _converter(name)(str(raw))
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: {name}={raw!r} is not a valid {FIELDS[name].type}") from e


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
    if not values.get("identity"):
        values["identity"] = env.get("POD_NAME") or socket.gethostname()
    return Settings(**values)
