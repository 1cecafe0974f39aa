"""Settings of the controller: flag > environment > ConfigMap file > default.

Every field is one flag ``--job-image``, one environment variable
``LJ_RUNTIMEKIT_CONTROLLER_JOB_IMAGE`` and one key ``job_image`` of the ConfigMap file (YAML,
``version: v1``; unknown versions and keys are rejected): the shared shape of :mod:`.cli` and
:mod:`.config` (docs/shape.md). This is the only module that reads the environment.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from lj_runtimekit_interface import sockets

from . import __version__, cli, config
from .errors import ConfigError

PROG = "lj-runtimekit-controller"
ENV_PREFIX = "LJ_RUNTIMEKIT_CONTROLLER_"
_UNTIL = "v1.15.0"
#: Spellings of v1.13, kept until v1.15 with a warning (guide §4.1).
DEPRECATED = (
    cli.Deprecated("api_qps", "kube_api_qps", kind="float", until=_UNTIL),
    cli.Deprecated("api_burst", "kube_api_burst", kind="int", until=_UNTIL),
    cli.Deprecated("lease_name", "leader_elect_resource_name", until=_UNTIL),
    cli.Deprecated("lease_duration", "leader_elect_lease_duration", kind="float", until=_UNTIL),
    cli.Deprecated("renew_deadline", "leader_elect_renew_deadline", kind="float", until=_UNTIL),
    cli.Deprecated("retry_period", "leader_elect_retry_period", kind="float", until=_UNTIL),
    cli.Deprecated("listen_address", "metrics_bind_address", part="host", until=_UNTIL),
    cli.Deprecated("port", "metrics_bind_address", kind="int", part="port", until=_UNTIL),
)
#: Checked positive: zero workers, tries or tokens would stall the controller for good.
POSITIVE = (
    "concurrency",
    "max_active_jobs",
    "kube_api_burst",
    "retry_limit",
    "job_deadline",
    "kube_api_qps",
    "retry_backoff",
    "retry_backoff_max",
    "partition_wait_interval",
    "leader_elect_lease_duration",
    "leader_elect_renew_deadline",
    "leader_elect_retry_period",
)
_doc = cli.setting


@dataclass(frozen=True)
class Settings:
    """The effective configuration, fixed at start."""

    job_image: str = _doc("Image of the job agent the Jobs run (required).", "")
    namespace: str = _doc(
        "Namespace of the agent Jobs and the Events; also of the Lease while "
        "--leader-elect-resource-namespace is not given (as in v1.13).",
        "kube-system",
    )
    label_key: str = _doc("Node label that switches Runtime Kit on.", "lj_runtimekit_enable")
    label_value: str = _doc(
        "Value of the label that means enabled; any other means disabled.", "true"
    )
    layout_label_key: str = _doc(
        "Node label whose value names the node's partition layout (docs/partitioning.md); "
        "a node without it keeps its partitioning as it is.",
        "lj_runtimekit_partition_layout",
    )
    layouts_configmap: str = _doc(
        "ConfigMap (in --namespace) of the named partition layouts.",
        "lj-runtimekit-partition-layouts",
    )
    partition_wait_interval: float = _doc(
        "Seconds between tries of a layout that waits for GPUs in use to be released.", 30.0
    )
    node_selector: str = _doc(
        "Label selector of the nodes the controller watches; empty: every node.", ""
    )
    job_pod_annotations: str = _doc(
        "Extra annotations on the agent pods, comma-separated key=value.", ""
    )
    concurrency: int = _doc("Nodes reconciled at the same time (workers).", 10)
    max_active_jobs: int = _doc("Agent Jobs running at once, cluster-wide.", 50)
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
    pod_resources_dir: str = _doc(
        "The kubelet's pod-resources directory on the nodes, mounted read-only into partition "
        "Jobs only: the agent asks its kubelet.sock which pods hold a GPU bound to vfio-pci before "
        "changing it. The admission policy allows this path only.",
        "/var/lib/kubelet/pod-resources",
    )
    identity: str = _doc(
        "This replica's Lease holder identity. Default: POD_NAME (also read) or the hostname.", ""
    )
    kubeconfig: str = cli.kubeconfig()
    kube_api_qps: float = cli.kube_api_qps(20.0)
    kube_api_burst: int = cli.kube_api_burst(40)
    leader_elect: bool = cli.leader_elect()
    leader_elect_lease_duration: float = cli.leader_elect_lease_duration()
    leader_elect_renew_deadline: float = cli.leader_elect_renew_deadline()
    leader_elect_retry_period: float = cli.leader_elect_retry_period()
    leader_elect_resource_namespace: str = cli.leader_elect_resource_namespace()
    leader_elect_resource_name: str = cli.leader_elect_resource_name("lj-runtimekit-controller")
    metrics_bind_address: str = cli.metrics_bind_address("0.0.0.0:8080")
    health_probe_bind_address: str = cli.health_probe_bind_address()
    log_level: str = cli.log_level()
    log_format: str = cli.log_format()

    @property
    def metrics_address(self) -> tuple[str, int]:
        return cli.bind_address(self.metrics_bind_address)

    @property
    def port(self) -> int:
        """v1.13's name of the metrics port, read by tools written for it (until v1.15.0)."""
        return self.metrics_address[1]

    @property
    def listen_address(self) -> str:
        """v1.13's name of the metrics host, read by tools written for it (until v1.15.0)."""
        return self.metrics_address[0]

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
        if not self.job_image:
            raise ConfigError("job_image is required: the job agent's image (--job-image)")
        for name in POSITIVE:
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):  # inf would sleep or wait forever
                raise ConfigError(f"{name} {value}: expected a positive finite number")
        for item in filter(None, self.job_pod_annotations.split(",")):
            if "=" not in item:
                raise ConfigError(f"job_pod_annotations item {item!r}: expected key=value")
        if self.job_backoff_limit < 0:
            raise ConfigError(f"job_backoff_limit {self.job_backoff_limit}: expected >= 0")
        if not self.leader_elect_renew_deadline < self.leader_elect_lease_duration:
            raise ConfigError(
                "leader_elect_renew_deadline must be shorter than leader_elect_lease_duration"
            )
        # The elector renews every retry period: a period not shorter than the deadline would
        # give up leading after a single missed renewal (and the elector refuses it). Without
        # leader election no elector is built, and v1.13 started with any period.
        if self.leader_elect and not (
            self.leader_elect_retry_period < self.leader_elect_renew_deadline
        ):
            raise ConfigError(
                "leader_elect_retry_period must be shorter than leader_elect_renew_deadline"
            )


FIELDS = {f.name: f for f in dataclasses.fields(Settings)}


def parser() -> argparse.ArgumentParser:
    return cli.parser(
        PROG,
        "Turns the node label lj_runtimekit_enable into job-agent Jobs and records their "
        "results on the node.",
        dataclasses.fields(Settings),
        env_prefix=ENV_PREFIX,
        version=__version__,
        deprecated=DEPRECATED,
    )


def load_noting(
    argv: list[str] | None = None, environ: Mapping[str, str] | None = None
) -> tuple[Settings, list[str]]:
    """The effective settings and a note per deprecated spelling used; raises
    :class:`ConfigError` with what to fix."""
    env = os.environ if environ is None else environ
    flags = vars(parser().parse_args(argv))
    try:
        values, notes = config.load(
            Settings, flags=flags, environ=env, env_prefix=ENV_PREFIX, deprecated=DEPRECATED
        )
    except config.SettingsError as e:
        raise ConfigError(str(e)) from e
    if "leader_elect_resource_namespace" not in values and "namespace" in values:
        # v1.13 kept the Lease in --namespace: a replica of v1.13 and one of this version must
        # contend for the same Lease during a rolling update, or both would lead.
        values["leader_elect_resource_namespace"] = values["namespace"]
    if not values.get("identity"):
        values["identity"] = env.get("POD_NAME") or socket.gethostname()
    return Settings(**values), notes


def load(argv: list[str] | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """The effective settings; raises :class:`ConfigError` with what to fix."""
    return load_noting(argv, environ)[0]
