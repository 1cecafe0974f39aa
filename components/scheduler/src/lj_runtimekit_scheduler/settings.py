"""Settings of the scheduler: flag > environment > ConfigMap file > default.

Every field is one flag ``--gpu-strategy``, one environment variable
``LJ_RUNTIMEKIT_SCHEDULER_GPU_STRATEGY`` and one key ``gpu_strategy`` of the ConfigMap file
(YAML, ``version: v1``; unknown versions and keys are rejected): the shared shape of :mod:`.cli`
and :mod:`.config` (docs/shape.md). This is the only module that reads the environment. The
ConfigMap file::

    version: v1
    scheduler_name: lj-runtimekit-scheduler
    gpu_strategy: binpack          # or spread
    resource_gpu: aliyun.com/gpu   # same keys and names as the device plugin's ConfigMap
    plugins:
      - {name: NodeResourcesFit}
      - {name: GpuTopology, weight: 2}
      - {name: NodeAffinity, enabled: false}

Plugin *names* are checked where the profile is built (:mod:`.profile`), against the registry;
here only the shape of each entry.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import __version__, cli, config, k8s_names, terms
from .errors import ConfigError
from .model import RESOURCE_KINDS, ResourceNames

PROG = "lj-runtimekit-scheduler"
ENV_PREFIX = "LJ_RUNTIMEKIT_SCHEDULER_"
STRATEGIES = ("binpack", "spread")
_UNTIL = "v1.15.0"
#: Spellings of v1.13, kept until v1.15 with a warning (guide §4.1).
DEPRECATED = (
    cli.Deprecated("no_leader_elect", "leader_elect", kind="bool", part="not", until=_UNTIL),
    cli.Deprecated("namespace", "leader_elect_resource_namespace", until=_UNTIL),
    cli.Deprecated("metrics_port", "metrics_bind_address", kind="int", part="port", until=_UNTIL),
    cli.Deprecated("qps", "kube_api_qps", kind="float", until=_UNTIL),
    cli.Deprecated("burst", "kube_api_burst", kind="int", until=_UNTIL),
    # the camelCase ConfigMap keys of v1.13 (never flags)
    *(
        cli.Deprecated(old, new, kind=kind, until=_UNTIL, flag=False)
        for old, new, kind in (
            ("schedulerName", "scheduler_name", "str"),
            ("gpuStrategy", "gpu_strategy", "str"),
            ("featureLabel", "feature_label", "str"),
            ("topologyLabels", "topology_labels", "yaml"),
            ("gangTimeoutSeconds", "gang_timeout", "float"),
            ("assumeTTLSeconds", "assume_ttl", "float"),
            ("confirmTimeoutSeconds", "confirm_timeout", "float"),
        )
    ),
)
#: v1.13's environment variables, outside the prefix rule: old name → new key.
OLD_ENV = {
    "LJ_SCHEDULER_LOG_LEVEL": "log_level",
    "LJ_SCHEDULER_NAME": "scheduler_name",
    "KUBECONFIG": "kubeconfig",
}

DEFAULT_PLUGINS: tuple[tuple[str, int], ...] = (
    ("SchedulingGates", 0),
    ("UnsupportedFeatures", 0),
    ("NodeName", 0),
    ("NodeUnschedulable", 0),
    ("TaintToleration", 1),
    ("NodeReady", 0),
    ("NodeAffinity", 1),
    ("NodePorts", 0),
    ("NodeResourcesFit", 1),
    ("VolumeRestrictions", 0),
    ("NodeVolumeLimits", 0),
    ("VolumeBinding", 0),
    ("VolumeZone", 0),
    ("GpuFit", 2),
    ("DraClaims", 0),
    ("AllocateHandshake", 0),
    ("PodTopologySpread", 2),
    ("InterPodAffinity", 2),
    ("DefaultPreemption", 0),
    ("GpuTopology", 1),
    ("DefaultBinder", 0),
)
"""Plugins enabled by default and their score weights (0: the plugin does not score). The
order is the Filter order, kube-scheduler's (NodeName, NodeUnschedulable, TaintToleration,
NodeAffinity, NodePorts, NodeResourcesFit, ...): a node failing two filters is counted under the
first in FailedScheduling, so the counts per reason are kube-scheduler's."""


@dataclass(frozen=True)
class PluginConfig:
    """One plugin of the profile."""

    name: str
    weight: int = 1
    """Multiplier of the plugin's normalised score (0-100) in the node's total."""

    def __repr__(self) -> str:  # as --help and the effective config show it
        return f"{self.name}:{self.weight}"


RESOURCE_KEYS = tuple("resource_" + k.replace("-", "_") for k in RESOURCE_KINDS)
DEFAULT_PROFILE = tuple(PluginConfig(n, w) for n, w in DEFAULT_PLUGINS)
_doc = cli.setting


@dataclass(frozen=True)
class Settings:
    """The effective configuration, fixed at start."""

    scheduler_name: str = _doc(
        "Pods whose spec.schedulerName equals this are ours.", "lj-runtimekit-scheduler"
    )
    gpu_strategy: str = _doc(
        "binpack fills busy GPUs and nodes first (less fragmentation); spread the idle ones.",
        "binpack",
        choices=STRATEGIES,
    )
    plugins: tuple[PluginConfig, ...] = _doc(
        "Changes to the default profile, as a YAML list of {name, weight, enabled}: a listed "
        "plugin gets its weight (the multiplier of its 0-100 score), enabled: false drops it, "
        "a plugin not enabled by default is added after the others.",
        DEFAULT_PROFILE,
        kind="yaml",
    )
    feature_label: str = _doc(
        "Node label (value true) that marks the nodes whose GPUs we place onto.",
        "lj_runtimekit_enable",
    )
    dra_driver_name: str = _doc(
        "The device plugin's DRA driver name (its dra_driver_name): nodes whose ResourceSlices "
        "list this driver's devices are in DRA mode, and our pods there get a ResourceClaim.",
        "lj-runtimekit.aliyun.com",
    )
    topology_labels: tuple[str, ...] = _doc(
        "Node labels of the network-topology levels, widest first, as a YAML list; gangs pack "
        "into the smallest domain that holds them.",
        ("network.topology/block", "network.topology/rack"),
        kind="yaml",
    )
    spread_defaulting: str = _doc(
        "Default topology spread constraints of a pod without its own that a Service, "
        "ReplicaSet, StatefulSet or ReplicationController selects (kube-scheduler's "
        "PodTopologySpread defaultingType): System is kube-scheduler's (hostname maxSkew 3, "
        "zone maxSkew 5, ScheduleAnyway); List is spread_default_constraints.",
        "System",
        choices=("System", "List"),
    )
    spread_default_constraints: tuple[terms.SpreadConstraint, ...] = _doc(
        "With spread_defaulting List: the default constraints, as a YAML list of "
        "topologySpreadConstraints entries without labelSelector (each pod's selector comes "
        "from the Services and controller that select it); [] gives no defaults.",
        (),
        kind="yaml",
    )
    gang_timeout: float = _doc(
        "Seconds after which an incomplete gang gets one GangIncomplete warning (it holds "
        "nothing while it waits, so there is nothing to give back).",
        60.0,
    )
    assume_ttl: float = _doc(
        "Seconds after which an assumed pod whose binding is never seen is forgotten.", 30.0
    )
    confirm_timeout: float = _doc(
        "Seconds a gang member bound after a same-shaped member on one node waits for the "
        "device plugin to confirm that one's devices before it goes back to the queue.",
        300.0,
    )
    volume_bind_timeout: float = _doc(
        "Seconds VolumeBinding waits at PreBind for the PV controller to bind a pod's claims "
        "before the pod goes back to the queue (kube-scheduler's bindTimeoutSeconds).",
        600.0,
    )
    pod_initial_backoff: float = _doc(
        "Seconds of the first retry delay of an unschedulable pod; doubles per attempt "
        "(kube-scheduler's podInitialBackoffSeconds).",
        1.0,
    )
    pod_max_backoff: float = _doc(
        "Seconds of the largest retry delay (kube-scheduler's podMaxBackoffSeconds).", 10.0
    )
    unschedulable_retry: float = _doc(
        "Seconds within which a pod parked as unschedulable is retried, events or not.", 60.0
    )
    event_series_interval: float = _doc(
        "Seconds between writes of one Event's series.count: repeats of an Event (same pod, "
        "reason and note but its numbers) only raise the count (client-go's recorder: 30 min; "
        "shorter here so kubectl describe shows a count that moves).",
        30.0,
    )
    resource_gpu: str = _doc("Extended resource name of whole GPUs.", "aliyun.com/gpu")
    resource_gpu_core: str = _doc(
        "Extended resource name of GPU core shares (100 per GPU).", "aliyun.com/gpu-core"
    )
    resource_gpu_memory: str = _doc(
        "Extended resource name of GPU memory shares (GiB).", "aliyun.com/gpu-memory"
    )
    resource_ppu: str = _doc("Extended resource name of whole PPUs.", "alibabacloud.com/ppu")
    kubeconfig: str = cli.kubeconfig()
    # kube-scheduler's clientConnection defaults (issue 21; make bench: docs in README)
    kube_api_qps: float = cli.kube_api_qps(50.0)
    kube_api_burst: int = cli.kube_api_burst(100)
    leader_elect: bool = cli.leader_elect()
    leader_elect_lease_duration: float = cli.leader_elect_lease_duration()
    leader_elect_renew_deadline: float = cli.leader_elect_renew_deadline()
    leader_elect_retry_period: float = cli.leader_elect_retry_period()
    leader_elect_resource_namespace: str = cli.leader_elect_resource_namespace()
    leader_elect_resource_name: str = cli.leader_elect_resource_name("lj-runtimekit-scheduler")
    # 9503, next to the exporter's 9501 and the device plugin's 9502: v1.13 served plain HTTP
    # on 10259, kube-scheduler's HTTPS port
    metrics_bind_address: str = cli.metrics_bind_address("0.0.0.0:9503")
    health_probe_bind_address: str = cli.health_probe_bind_address()
    log_level: str = cli.log_level()
    log_format: str = cli.log_format()

    @property
    def resources(self) -> ResourceNames:
        """The extended resource names, under the device plugin's ConfigMap keys."""
        return ResourceNames(
            self.resource_gpu, self.resource_gpu_core, self.resource_gpu_memory, self.resource_ppu
        )

    @property
    def metrics_address(self) -> tuple[str, int]:
        return cli.bind_address(self.metrics_bind_address)

    @property
    def metrics_port(self) -> int:
        """v1.13's name of the metrics port, read by tools written for it (until v1.15.0)."""
        return self.metrics_address[1]

    @property
    def namespace(self) -> str:
        """v1.13's name of the Lease's namespace, read by tools written for it (until v1.15.0)."""
        return self.leader_elect_resource_namespace

    @property
    def probe_address(self) -> tuple[str, int] | None:
        if not self.health_probe_bind_address:
            return None
        return cli.bind_address(self.health_probe_bind_address)

    def __post_init__(self) -> None:
        try:
            config.validate(self)  # choices, NUL, finite numbers, host:port
        except config.SettingsError as e:
            raise ConfigError(str(e)) from e
        # Flags and environment reach here unchecked: say which one is wrong, before any I/O.
        for name in (
            "leader_elect_lease_duration",
            "leader_elect_renew_deadline",
            "leader_elect_retry_period",
            "kube_api_qps",
            "pod_initial_backoff",
            "pod_max_backoff",
            "unschedulable_retry",
            "assume_ttl",
            "gang_timeout",
            "confirm_timeout",
            "volume_bind_timeout",
            "event_series_interval",
        ):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} {getattr(self, name)!r}: expected a positive number")
        if self.kube_api_burst < 1:
            raise ConfigError(f"kube_api_burst {self.kube_api_burst}: expected 1 or more")
        if self.leader_elect and not (
            self.leader_elect_retry_period
            < self.leader_elect_renew_deadline
            < self.leader_elect_lease_duration
        ):
            raise ConfigError(
                "leader election needs retry period < renew deadline < lease duration, got "
                f"{self.leader_elect_retry_period}, {self.leader_elect_renew_deadline}, "
                f"{self.leader_elect_lease_duration}"
            )
        if not self.scheduler_name:
            raise ConfigError("scheduler_name: expected a non-empty name")
        if not self.feature_label:
            raise ConfigError("feature_label: must be a non-empty string")
        if self.spread_defaulting == "System" and self.spread_default_constraints:
            raise ConfigError(
                "spread_default_constraints: only with spread_defaulting List (System is "
                "kube-scheduler's own defaults)"
            )
        if not k8s_names.is_dns_subdomain(self.dra_driver_name) or len(self.dra_driver_name) > 63:
            raise ConfigError(
                f"dra_driver_name {self.dra_driver_name!r}: expected a DNS subdomain of at most "
                "63 characters, e.g. gpu.example.com"
            )
        names = self.resources.all
        for kind, n in zip(RESOURCE_KINDS, names, strict=True):
            key = "resource_" + kind.replace("-", "_")
            if not n:
                raise ConfigError(f"{key}: must be a non-empty string")
            if n.count("/") != 1 or not all(n.split("/")):
                raise ConfigError(f"{key} {n!r}: expected <domain>/<name>")
        if len(set(names)) != len(names):
            keys = dict(zip(RESOURCE_KEYS, names, strict=True))
            raise ConfigError(f"resource names must differ: {keys}")


FIELDS = {f.name: f for f in dataclasses.fields(Settings)}


def plugins(entries: Any, source: str = "plugins") -> tuple[PluginConfig, ...]:
    """The profile: the defaults changed by ``entries`` (a list of {name, weight, enabled})."""
    if not isinstance(entries, list):
        raise ConfigError(f"{source}: plugins must be a list of {{name, weight, enabled}}")
    chosen = {n: w for n, w in DEFAULT_PLUGINS}
    order = [n for n, _ in DEFAULT_PLUGINS]
    for e in entries:
        if not isinstance(e, Mapping) or not isinstance(e.get("name"), str):
            raise ConfigError(f"{source}: each plugin needs a name, got {e!r}")
        name = e["name"]
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


def topology_labels(labels: Any, source: str = "topology_labels") -> tuple[str, ...]:
    if not isinstance(labels, list) or not all(isinstance(x, str) and x for x in labels):
        raise ConfigError(f"{source}: topologyLabels must be a list of label keys")
    return tuple(labels)


def spread_defaults(
    entries: Any, source: str = "spread_default_constraints"
) -> tuple[terms.SpreadConstraint, ...]:
    """The List defaults: topologySpreadConstraints entries, none with a labelSelector."""
    if not isinstance(entries, list):
        raise ConfigError(f"{source}: expected a list of topologySpreadConstraints entries")
    out = []
    for i, e in enumerate(entries):
        where = f"{source}[{i}]"
        if isinstance(e, Mapping) and e.get("labelSelector") is not None:
            raise ConfigError(
                f"{where}: a default constraint has no labelSelector (each pod's is deduced "
                "from the Services and controller that select it)"
            )
        try:
            out.append(terms.constraint(dict(e) if isinstance(e, Mapping) else e, {}, where))
        except ValueError as err:
            raise ConfigError(str(err)) from err
    return tuple(out)


def parser() -> argparse.ArgumentParser:
    return cli.parser(
        PROG,
        "A Kubernetes scheduler (Scheduler Framework shape) for GPU pods: GPU fit, GPU choice on "
        "the node, topology, gangs.",
        dataclasses.fields(Settings),
        env_prefix=ENV_PREFIX,
        version=__version__,
        deprecated=DEPRECATED,
    )


def _old_environment(env: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """``env`` with v1.13's variables under their new names (a new one set wins), and a note
    per old one used."""
    out, notes = dict(env), []
    for old, key in OLD_ENV.items():
        if old not in env:
            continue
        new = cli.env_name(ENV_PREFIX, key)
        out.setdefault(new, env[old])
        notes.append(f"environment {old} is deprecated: use {new} (the old name goes in {_UNTIL})")
    return out, notes


def load_noting(
    argv: list[str] | None = None, environ: Mapping[str, str] | None = None
) -> tuple[Settings, list[str]]:
    """The effective settings and a note per deprecated spelling used; raises
    :class:`ConfigError` with what to fix."""
    env, old_notes = _old_environment(os.environ if environ is None else environ)
    flags = vars(parser().parse_args(argv))
    try:
        values, notes = config.load(
            Settings, flags=flags, environ=env, env_prefix=ENV_PREFIX, deprecated=DEPRECATED
        )
    except config.SettingsError as e:
        raise ConfigError(str(e)) from e
    if "plugins" in values:
        values["plugins"] = plugins(values["plugins"])
    if "topology_labels" in values:
        values["topology_labels"] = topology_labels(values["topology_labels"])
    if "spread_default_constraints" in values:
        values["spread_default_constraints"] = spread_defaults(values["spread_default_constraints"])
    try:
        return Settings(**values), old_notes + notes
    except ConfigError as e:
        # a value may come from a deprecated key of the file, which the message cannot name
        if flags.get("config"):
            raise ConfigError(f"{e} (flags, environment or {flags['config']})") from e
        raise


def load(argv: list[str] | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """The effective settings; raises :class:`ConfigError` with what to fix."""
    return load_noting(argv, environ)[0]
