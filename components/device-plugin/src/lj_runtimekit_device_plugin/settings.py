"""Settings of the device plugin: flag > environment > ConfigMap file > default.

Every field is one flag ``--health-interval``, one environment variable
``LJ_RUNTIMEKIT_DEVICE_PLUGIN_HEALTH_INTERVAL`` and one key ``health_interval`` of the ConfigMap
file (YAML, ``version: v1``; unknown versions and keys are rejected). This is the only module that
reads the environment.
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

ENV_PREFIX = "LJ_RUNTIMEKIT_DEVICE_PLUGIN_"
CONFIG_VERSION = "v1"
RESOURCE_KINDS = ("gpu", "gpu-core", "gpu-memory", "ppu")
MIG_STRATEGIES = ("single", "mixed", "none")
PODS_SOURCES = ("kubelet", "apiserver")
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("auto", "json", "console")


def _doc(text: str, default: Any) -> Any:
    return field(default=default, metadata={"help": text})


@dataclass(frozen=True)
class Settings:
    """The effective configuration, fixed at start."""

    node_name: str = _doc(
        "Name of this node (NodeDevices object, labels, pod lookup). In a DaemonSet set NODE_NAME "
        "from the downward API (also read). Default: the hostname.",
        "",
    )
    socket_dir: str = _doc("Directory of the Runtime's sockets.", sockets.DEFAULT_SOCKET_DIR)
    plugin_dir: str = _doc(
        "The kubelet's device plugin directory (kubelet.sock and our sockets).",
        sockets.DEVICE_PLUGIN_DIR,
    )
    resources: str = _doc(
        "Comma-separated resource kinds to advertise, of gpu, gpu-core, gpu-memory, ppu. A kind "
        "with no device on the node advertises nothing.",
        "gpu,gpu-core,gpu-memory,ppu",
    )
    resource_gpu: str = _doc("Extended resource name of whole GPUs.", "aliyun.com/gpu")
    resource_gpu_core: str = _doc(
        "Extended resource name of GPU compute shares (100 per GPU).", "aliyun.com/gpu-core"
    )
    resource_gpu_memory: str = _doc(
        "Extended resource name of GPU memory shares (one per GiB); e.g. aliyun.com/gpu-mem.",
        "aliyun.com/gpu-memory",
    )
    resource_ppu: str = _doc("Extended resource name of whole PPUs.", "alibabacloud.com/ppu")
    mig_strategy: str = _doc(
        "How MIG partitions are advertised: `single` (folded into the whole-GPU resource), "
        "`mixed` (one resource per profile, <gpu resource>-mig-<profile>) or `none` (a MIG GPU "
        "is advertised as one whole GPU).",
        "single",
    )
    health_interval: float = _doc(
        "Seconds between periodic health checks (ListDevices), besides the WatchDevices stream.",
        5.0,
    )
    rpc_timeout: float = _doc("Seconds one Runtime call may take.", 5.0)
    allocate_timeout: float = _doc(
        "Seconds Allocate may take in all (the kubelet gives none) before failing clearly.", 10.0
    )
    pods_source: str = _doc(
        "Where the shared-GPU handshake finds pods: `kubelet` (read-only /pods, the guide's "
        "way) or `apiserver` (spec.nodeName list, for clusters that keep 10255 closed).",
        "kubelet",
    )
    kubelet_pods_url: str = _doc(
        "URL of the kubelet's read-only pod list.", "http://localhost:10255/pods"
    )
    pod_resources_socket: str = _doc(
        "The kubelet's pod-resources API socket (v1.PodResourcesLister): which container holds "
        "which devices, for releasing and attributing allocations. Mount "
        "/var/lib/kubelet/pod-resources into the pod.",
        "/var/lib/kubelet/pod-resources/kubelet.sock",
    )
    reconcile_interval: float = _doc(
        "Seconds between reconcile passes (besides one at start and after every Runtime or "
        "kubelet reconnect). A pass costs one ListAllocations, one pod-resources List and one "
        "pod list (about a millisecond each on a node; see the bench); an allocation is "
        "released at the second pass that finds it unheld, so a leak lives 1-2 intervals.",
        10.0,
    )
    release_grace: float = _doc(
        "Seconds an allocation is kept, however unheld, after a pass first saw it: the kubelet "
        "records a container's devices only after Allocate returns.",
        10.0,
    )
    containerd_annotation_patterns: str = _doc(
        "Comma-separated container_annotations patterns of containerd's lj-runtime handler "
        "(Go path.Match: * does not cross /); an injection annotation the Runtime returns that "
        "none passes is logged (injection_annotation_not_passed) and counted.",
        "xdm.amp.com*",
    )
    kubeconfig: str = _doc("Kubeconfig; empty means the in-cluster ServiceAccount.", "")
    publish_inventory: str = _doc(
        "Publish NodeDevices and node labels to the apiserver: `true` or `false`.", "true"
    )
    listen_address: str = _doc("Address of the /metrics and /healthz server.", "0.0.0.0")
    port: int = _doc("Port of /metrics and /healthz; 0 picks a free one.", 9502)
    log_level: str = _doc("Log level: debug, info, warning or error.", "info")
    log_format: str = _doc("Log format: json, console, or auto (json when not a terminal).", "auto")

    @property
    def annotation_patterns(self) -> tuple[str, ...]:
        return tuple(p.strip() for p in self.containerd_annotation_patterns.split(",") if p.strip())

    @property
    def enabled(self) -> tuple[str, ...]:
        """The enabled resource kinds, in the order given."""
        return tuple(k.strip() for k in self.resources.split(",") if k.strip())

    def resource_name(self, kind: str) -> str:
        """The extended resource name configured for ``kind`` (one of RESOURCE_KINDS)."""
        return str(getattr(self, "resource_" + kind.replace("-", "_")))

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, str) and "\x00" in v:
                raise ConfigError(f"{f.name} {v!r}: a NUL character is not allowed")
        for choice, allowed in (
            ("mig_strategy", MIG_STRATEGIES),
            ("pods_source", PODS_SOURCES),
            ("log_level", LOG_LEVELS),
            ("log_format", LOG_FORMATS),
            ("publish_inventory", ("true", "false")),
        ):
            if getattr(self, choice) not in allowed:
                raise ConfigError(f"{choice} {getattr(self, choice)!r}: expected one of {allowed}")
        bad = [k for k in self.enabled if k not in RESOURCE_KINDS]
        if bad:
            raise ConfigError(f"resources: unknown kinds {bad}; known: {list(RESOURCE_KINDS)}")
        names = [self.resource_name(k) for k in RESOURCE_KINDS]
        for n in names:
            if n.count("/") != 1 or not all(n.split("/")):
                raise ConfigError(f"resource name {n!r}: expected <domain>/<name>")
        if len(set(names)) != len(names):
            raise ConfigError(f"resource names must differ: {names}")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port {self.port}: expected 0..65535")
        for name in (
            "health_interval",
            "rpc_timeout",
            "allocate_timeout",
            "reconcile_interval",
            "release_grace",
        ):
            # inf would make a Runtime call or a pass wait forever: every wait must be bounded
            if not 0 < getattr(self, name) < math.inf:
                raise ConfigError(f"{name} {getattr(self, name)}: expected a positive number")


FIELDS = {f.name: f for f in dataclasses.fields(Settings)}


def _converter(name: str) -> Callable[[str], Any]:
    kind = FIELDS[name].type
    return {"int": int, "float": float}.get(str(kind), str)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lj-runtimekit-device-plugin",
        description="Registers the node's accelerators with the kubelet as extended resources. "
        f"Each flag also reads {ENV_PREFIX}<FLAG> and the key <flag> of the --config file.",
    )
    p.add_argument(
        "--version", action="version", version=f"lj-runtimekit-device-plugin {__version__}"
    )
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
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"config file {path}: {e.strerror}") from e
    except UnicodeDecodeError as e:
        raise ConfigError(f"config file {path} is not UTF-8: byte {e.start}: {e.reason}") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path} is not valid YAML: {e}") from e
    if not isinstance(doc, dict):
        raise ConfigError(f"config file {path}: expected a mapping with version: {CONFIG_VERSION}")
    version = doc.pop("version", None)
    if version != CONFIG_VERSION:
        raise ConfigError(
            f"config file {path}: version {version!r} unknown, expected {CONFIG_VERSION!r}"
        )
    unknown = sorted(str(k) for k in set(doc) - set(FIELDS))  # YAML keys need not be strings
    if unknown:
        raise ConfigError(f"config file {path}: unknown keys {unknown}; known: {sorted(FIELDS)}")
    return doc


def _coerce(name: str, raw: Any, where: str) -> Any:
    kind = str(FIELDS[name].type)
    if isinstance(raw, bool) and kind == "str":
        return "true" if raw else "false"
    # YAML gives bools, lists and maps too: only scalars of the field's kind are taken
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise ConfigError(f"{where}: {name}={raw!r} is not a valid {kind}")
    if kind == "str" and not isinstance(raw, str):
        return str(raw)
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
