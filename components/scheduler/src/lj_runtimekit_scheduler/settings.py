"""Settings of the scheduler: flag > environment > ConfigMap file > default.

The config file (mounted from the ConfigMap) is YAML with ``version: v1``::

    version: v1
    schedulerName: lj-runtimekit-scheduler
    gpuStrategy: binpack          # or spread
    resource_gpu: aliyun.com/gpu  # same keys and names as the device plugin's ConfigMap
    plugins:
      - {name: NodeResourcesFit}
      - {name: GpuTopology, weight: 2}
      - {name: NodeAffinity, enabled: false}
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from . import __version__
from .errors import ConfigError
from .model import RESOURCE_KINDS, ResourceNames

DEFAULT_PLUGINS: tuple[tuple[str, int], ...] = (
    ("SchedulingGates", 0),
    ("UnsupportedFeatures", 0),
    ("NodeName", 0),
    ("NodeUnschedulable", 0),
    ("NodeReady", 0),
    ("NodeAffinity", 1),
    ("TaintToleration", 1),
    ("NodePorts", 0),
    ("NodeResourcesFit", 1),
    ("GpuFit", 2),
    ("AllocateHandshake", 0),
    ("GpuTopology", 1),
    ("DefaultBinder", 0),
)
"""Plugins enabled by default and their score weights (0: the plugin does not score)."""


@dataclass(frozen=True)
class PluginConfig:
    """One plugin of the profile."""

    name: str
    weight: int = 1
    """Multiplier of the plugin's normalised score (0-100) in the node's total."""


@dataclass(frozen=True)
class Settings:
    """The effective configuration, fixed at start."""

    log_level: str = "info"
    """Log level: debug, info, warning or error."""
    scheduler_name: str = "lj-runtimekit-scheduler"
    """Pods whose ``spec.schedulerName`` equals this are ours."""
    gpu_strategy: str = "binpack"
    """``binpack`` fills busy GPUs/nodes first (less fragmentation); ``spread`` the idle ones."""
    plugins: tuple[PluginConfig, ...] = field(
        default_factory=lambda: tuple(PluginConfig(n, w) for n, w in DEFAULT_PLUGINS)
    )
    """Enabled plugins, in order, with weights."""
    feature_label: str = "lj_runtimekit_enable"
    """Node label (value ``true``) that marks nodes whose GPUs we place onto."""
    kubeconfig: str | None = None
    """Path of a kubeconfig; ``None``: in-cluster config."""
    namespace: str = "kube-system"
    """Namespace of the leader-election Lease."""
    lease_name: str = "lj-runtimekit-scheduler"
    """Name of the Lease two replicas compete for."""
    leader_elect: bool = True
    """Take the Lease before scheduling; off for a single replica in tests."""
    lease_duration_s: float = 15.0
    """How long a Lease is valid without renewal (kube-scheduler's default: 15 s)."""
    metrics_port: int = 10259
    """Port of ``/metrics`` and ``/healthz`` (0: a free port)."""
    qps: float = 5000.0
    """Client-side request rate limit towards the apiserver (requests per second)."""
    burst: int = 5000
    """Client-side burst above ``qps``."""
    backoff_initial_s: float = 1.0
    """First retry delay of an unschedulable pod; doubles per attempt."""
    backoff_max_s: float = 10.0
    """Largest retry delay (kube-scheduler's podMaxBackoffSeconds default)."""
    unschedulable_retry_s: float = 60.0
    """A pod parked as unschedulable is retried at least this often, events or not."""
    assume_ttl_s: float = 30.0
    """An assumed pod whose binding is never seen is forgotten after this."""
    gang_timeout_s: float = 60.0
    """After this long incomplete, a gang gets one GangIncomplete warning (it holds nothing while
    it waits, so there is nothing to give back)."""
    event_series_interval_s: float = 30.0
    """Repeats of one Event (same pod, reason and note but its numbers) only raise its
    ``series.count``, written at most this often per Event (client-go's recorder: 30 min for
    its heartbeat; shorter here so ``kubectl describe`` shows a count that moves)."""
    resources: ResourceNames = field(default_factory=ResourceNames)
    """Extended resource names of whole GPUs, GPU core and memory shares and PPUs. Config keys
    ``resource_gpu``, ``resource_gpu_core``, ``resource_gpu_memory``, ``resource_ppu``: the same
    keys and defaults as the device plugin's ConfigMap, so a rename is copied line for line."""
    confirm_timeout_s: float = 300.0
    """How long a gang member bound after a same-shaped member on one node waits for the device
    plugin to confirm that one's devices before it is given back to the queue."""
    topology_labels: tuple[str, ...] = (
        "network.topology/block",
        "network.topology/rack",
    )
    """Node labels of the network-topology levels, widest first; gangs pack into the smallest."""

    def __post_init__(self) -> None:
        # Flags and environment reach here unchecked: say which one is wrong, before any I/O.
        for name in (
            "lease_duration_s",
            "qps",
            "backoff_initial_s",
            "backoff_max_s",
            "unschedulable_retry_s",
            "assume_ttl_s",
            "gang_timeout_s",
            "confirm_timeout_s",
            "event_series_interval_s",
        ):
            if not _positive(getattr(self, name)):
                raise ConfigError(f"{name} {getattr(self, name)!r}: expected a positive number")
        if self.burst < 1:
            raise ConfigError(f"burst {self.burst}: expected 1 or more")
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"metrics_port {self.metrics_port}: expected 0 to 65535")
        if self.log_level not in ("debug", "info", "warning", "error"):
            raise ConfigError(f"log_level {self.log_level!r}: expected debug, info, warning, error")
        if not self.scheduler_name:
            raise ConfigError("scheduler_name: expected a non-empty name")


ENV = {
    "log_level": "LJ_SCHEDULER_LOG_LEVEL",
    "scheduler_name": "LJ_SCHEDULER_NAME",
    "kubeconfig": "KUBECONFIG",
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lj-runtimekit-scheduler",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"lj-runtimekit-scheduler {__version__}")
    p.add_argument("--config", type=Path, help="versioned YAML config file (from the ConfigMap)")
    p.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        help="log level (env LJ_SCHEDULER_LOG_LEVEL; default: info)",
    )
    p.add_argument("--scheduler-name", help="schedulerName of our pods (env LJ_SCHEDULER_NAME)")
    p.add_argument("--gpu-strategy", choices=["binpack", "spread"], help="GPU placement strategy")
    p.add_argument("--kubeconfig", help="kubeconfig path (env KUBECONFIG; default: in-cluster)")
    p.add_argument("--namespace", help="namespace of the leader Lease (default: kube-system)")
    p.add_argument("--no-leader-elect", action="store_true", help="schedule without a Lease")
    p.add_argument("--metrics-port", type=int, help="port of /metrics and /healthz (default 10259)")
    p.add_argument("--qps", type=float, help="apiserver client QPS (default 5000)")
    p.add_argument("--burst", type=int, help="apiserver client burst (default 5000)")
    return p


def parse_file(data: Any, source: str) -> dict[str, Any]:
    """Validate a config document and return the Settings fields it sets."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: expected a mapping with 'version: v1'")
    if data.get("version") != "v1":
        raise ConfigError(f"{source}: unknown config version {data.get('version')!r}; expected v1")
    known = {
        "version",
        "schedulerName",
        "gpuStrategy",
        "plugins",
        "featureLabel",
        "topologyLabels",
        "gangTimeoutSeconds",
        "assumeTTLSeconds",
        "confirmTimeoutSeconds",
        *RESOURCE_KEYS,
    }
    unknown = sorted(str(k) for k in set(data) - known)  # YAML keys may be numbers or null
    if unknown:
        raise ConfigError(f"{source}: unknown keys {unknown}; known: {sorted(known)}")
    out: dict[str, Any] = {}
    if "schedulerName" in data:
        out["scheduler_name"] = _str(data["schedulerName"], source, "schedulerName")
    if "gpuStrategy" in data:
        if data["gpuStrategy"] not in ("binpack", "spread"):
            raise ConfigError(f"{source}: gpuStrategy must be binpack or spread")
        out["gpu_strategy"] = data["gpuStrategy"]
    if "featureLabel" in data:
        out["feature_label"] = _str(data["featureLabel"], source, "featureLabel")
    if "topologyLabels" in data:
        labels = data["topologyLabels"]
        if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
            raise ConfigError(f"{source}: topologyLabels must be a list of label keys")
        out["topology_labels"] = tuple(labels)
    for key, attr in (
        ("gangTimeoutSeconds", "gang_timeout_s"),
        ("assumeTTLSeconds", "assume_ttl_s"),
        ("confirmTimeoutSeconds", "confirm_timeout_s"),
    ):
        if key in data:
            if not _positive(data[key]):
                raise ConfigError(f"{source}: {key} must be a positive number, got {data[key]!r}")
            out[attr] = float(data[key])
    if "plugins" in data:
        out["plugins"] = _plugins(data["plugins"], source)
    if any(k in data for k in RESOURCE_KEYS):
        out["resources"] = _resource_names(data, source)
    return out


RESOURCE_KEYS = tuple("resource_" + k.replace("-", "_") for k in RESOURCE_KINDS)


def _resource_names(data: Mapping[str, Any], source: str) -> ResourceNames:
    given = {
        k.removeprefix("resource_"): _str(data[k], source, k) for k in RESOURCE_KEYS if k in data
    }
    names = ResourceNames(**given)
    for key, n in zip(RESOURCE_KEYS, names.all, strict=True):
        if n.count("/") != 1 or not all(n.split("/")):
            raise ConfigError(f"{source}: {key} {n!r}: expected <domain>/<name>")
    if len(set(names.all)) != len(names.all):
        raise ConfigError(f"{source}: resource names must differ: {list(names.all)}")
    return names


def _positive(value: Any) -> bool:
    """A finite number above 0; YAML's true, .nan and .inf are none."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def _str(value: Any, source: str, key: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{source}: {key} must be a non-empty string")
    return value


def _plugins(entries: Any, source: str) -> tuple[PluginConfig, ...]:
    from .plugins.registry import REGISTRY

    if not isinstance(entries, list):
        raise ConfigError(f"{source}: plugins must be a list of {{name, weight, enabled}}")
    chosen = {n: w for n, w in DEFAULT_PLUGINS}
    order = [n for n, _ in DEFAULT_PLUGINS]
    for e in entries:
        if not isinstance(e, Mapping) or not isinstance(e.get("name"), str):
            raise ConfigError(f"{source}: each plugin needs a name, got {e!r}")
        name = e["name"]
        if name not in REGISTRY:
            raise ConfigError(f"{source}: unknown plugin {name!r}; known: {sorted(REGISTRY)}")
        weight = e.get("weight", chosen.get(name, 1))
        if not isinstance(weight, int) or weight < 0:
            raise ConfigError(f"{source}: weight of {name} must be a non-negative integer")
        if e.get("enabled", True) is False:
            chosen.pop(name, None)
            continue
        chosen[name] = weight
        if name not in order:
            order.append(name)
    return tuple(PluginConfig(n, chosen[n]) for n in order if n in chosen)


def load(argv: list[str] | None = None, env: Mapping[str, str] | None = None) -> Settings:
    args = parser().parse_args(argv)
    environ = os.environ if env is None else env
    values: dict[str, Any] = {}
    if args.config is not None:
        try:
            doc = yaml.safe_load(args.config.read_text())
        except (OSError, yaml.YAMLError) as e:
            raise ConfigError(f"cannot read config file {args.config}: {e}") from e
        values.update(parse_file(doc, str(args.config)))
    for attr, var in ENV.items():
        if environ.get(var):
            values[attr] = environ[var]
    flags = {
        "log_level": args.log_level,
        "scheduler_name": args.scheduler_name,
        "gpu_strategy": args.gpu_strategy,
        "kubeconfig": args.kubeconfig,
        "namespace": args.namespace,
        "metrics_port": args.metrics_port,
        "qps": args.qps,
        "burst": args.burst,
    }
    values.update({k: v for k, v in flags.items() if v is not None})
    if args.no_leader_elect:
        values["leader_elect"] = False
    return Settings(**values)
