"""Settings of the operator: flag > environment > ConfigMap file > default.

Every field is one flag ``--rollout-deadline``, one environment variable
``LJ_RUNTIMEKIT_OPERATOR_ROLLOUT_DEADLINE`` and one key ``rollout_deadline`` of the ConfigMap file
(YAML, ``version: v1``; unknown versions and keys are rejected): the shared shape of :mod:`.cli`
and :mod:`.config` (docs/shape.md). This is the only module that reads the environment.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from . import __version__, cli, config
from .errors import ConfigError

PROG = "lj-runtimekit-operator"
ENV_PREFIX = "LJ_RUNTIMEKIT_OPERATOR_"
#: Checked positive and finite: zero or infinity would spin or never decide.
POSITIVE = (
    "rollout_deadline",
    "teardown_deadline",
    "progress_interval",
    "resync_period",
    "kube_api_qps",
    "kube_api_burst",
    "leader_elect_lease_duration",
    "leader_elect_renew_deadline",
    "leader_elect_retry_period",
)
_doc = cli.setting


@dataclass(frozen=True)
class Settings:
    """The effective configuration, fixed at start."""

    rollout_deadline: float = _doc(
        "Seconds a component's new version has to become ready before the operator rolls it "
        "back to the last version that was ready (pods in ImagePullBackOff, ErrImagePull or "
        "CrashLoopBackOff fail it at once).",
        300.0,
    )
    teardown_deadline: float = _doc(
        "Seconds a deleted RuntimeKitPolicy waits for the controller to disable the nodes (the "
        "feature label taken off, the lj-runtime handler out of containerd) before it removes "
        "the suite anyway, with a Warning Event NodesNotDisabled naming the nodes left enabled.",
        600.0,
    )
    progress_interval: float = _doc(
        "Seconds between looks at the workloads while a component is rolling out.", 2.0
    )
    resync_period: float = _doc(
        "Seconds between full reconciles (every object applied again, strays removed) when "
        "nothing changed; a policy change is acted on at once.",
        300.0,
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
    leader_elect_resource_name: str = cli.leader_elect_resource_name("lj-runtimekit-operator")
    metrics_bind_address: str = cli.metrics_bind_address("0.0.0.0:9504")
    health_probe_bind_address: str = cli.health_probe_bind_address()
    log_level: str = cli.log_level()
    log_format: str = cli.log_format()

    @property
    def metrics_address(self) -> tuple[str, int]:
        return cli.bind_address(self.metrics_bind_address)

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
        for name in POSITIVE:
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ConfigError(f"{name} {value}: expected a positive finite number")
        if not self.leader_elect_renew_deadline < self.leader_elect_lease_duration:
            raise ConfigError(
                "leader_elect_renew_deadline must be shorter than leader_elect_lease_duration"
            )
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
        "Installs, configures and upgrades the suite from the cluster's RuntimeKitPolicy.",
        dataclasses.fields(Settings),
        env_prefix=ENV_PREFIX,
        version=__version__,
    )


def load_noting(
    argv: list[str] | None = None, environ: Mapping[str, str] | None = None
) -> tuple[Settings, list[str]]:
    """The effective settings and a note per deprecated spelling used (none yet); raises
    :class:`ConfigError` with what to fix."""
    env = os.environ if environ is None else environ
    flags = vars(parser().parse_args(argv))
    try:
        values, notes = config.load(Settings, flags=flags, environ=env, env_prefix=ENV_PREFIX)
    except config.SettingsError as e:
        raise ConfigError(str(e)) from e
    if not values.get("identity"):
        values["identity"] = env.get("POD_NAME") or socket.gethostname()
    return Settings(**values), notes


def load(argv: list[str] | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """The effective settings; raises :class:`ConfigError` with what to fix."""
    return load_noting(argv, environ)[0]
