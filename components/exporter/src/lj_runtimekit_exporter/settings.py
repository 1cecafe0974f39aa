"""Settings of the exporter: flag > environment > ConfigMap file > default.

Every field is one flag ``--poll-interval``, one environment variable
``LJ_RUNTIMEKIT_EXPORTER_POLL_INTERVAL`` and one key ``poll_interval`` of the ConfigMap file
(YAML, ``version: v1``; unknown versions and keys are rejected): the shared shape of :mod:`.cli`
and :mod:`.config` (docs/shape.md). This is the only module that reads the environment.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from lj_runtimekit_interface import sockets

from . import __version__, cli, config
from .errors import ConfigError

PROG = "lj-runtimekit-exporter"
ENV_PREFIX = "LJ_RUNTIMEKIT_EXPORTER_"
PODS_SOURCES = ("kubelet", "apiserver", "none")
#: Spellings of v1.13, kept until v1.15 with a warning (guide §4.1).
DEPRECATED = (
    cli.Deprecated("listen_address", "metrics_bind_address", part="host", until="v1.15.0"),
    cli.Deprecated("port", "metrics_bind_address", kind="int", part="port", until="v1.15.0"),
)
_doc = cli.setting


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
        choices=PODS_SOURCES,
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
    kubeconfig: str = cli.kubeconfig()
    metrics_bind_address: str = cli.metrics_bind_address("0.0.0.0:9501")
    health_probe_bind_address: str = cli.health_probe_bind_address()
    log_level: str = cli.log_level()
    log_format: str = cli.log_format()

    @property
    def max_snapshot_age(self) -> float:
        """Seconds after which a snapshot serves no device series (a stuck poll loop)."""
        return 3 * self.poll_interval + 4 * self.rpc_timeout + self.kubelet_timeout

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
        for name in ("poll_interval", "rpc_timeout", "kubelet_timeout"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} {getattr(self, name)}: expected a positive number")


FIELDS = {f.name: f for f in dataclasses.fields(Settings)}


def parser() -> argparse.ArgumentParser:
    return cli.parser(
        PROG,
        "Prometheus metrics on :9501 from the Runtime, attributed to pods.",
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
    if not values.get("node_name"):
        values["node_name"] = env.get("NODE_NAME") or socket.gethostname()
    return Settings(**values), notes


def load(argv: list[str] | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """The effective settings; raises :class:`ConfigError` with what to fix."""
    return load_noting(argv, environ)[0]
