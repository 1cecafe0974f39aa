"""Settings of the device plugin: flag > environment > ConfigMap file > default.

Every field is one flag ``--health-interval``, one environment variable
``LJ_RUNTIMEKIT_DEVICE_PLUGIN_HEALTH_INTERVAL`` and one key ``health_interval`` of the ConfigMap
file (YAML, ``version: v1``; unknown versions and keys are rejected): the shared shape of
:mod:`.cli` and :mod:`.config` (docs/shape.md). This is the only module that reads the environment.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from lj_runtimekit_interface import sockets

from . import __version__, cli, config
from .errors import ConfigError
from .k8s_names import is_dns_subdomain

PROG = "lj-runtimekit-device-plugin"
ENV_PREFIX = "LJ_RUNTIMEKIT_DEVICE_PLUGIN_"
RESOURCE_KINDS = ("gpu", "gpu-core", "gpu-memory", "ppu", "gpu-vfio")
MIG_STRATEGIES = ("single", "mixed", "none")
PODS_SOURCES = ("auto", "kubelet", "apiserver")
MODES = ("device-plugin", "dra")
#: How partitions are published in mode dra (dra.offers.STATIC, dra.offers.DYNAMIC).
PARTITION_POLICIES = ("static", "dynamic")
#: Spellings of v1.13, kept until v1.15 with a warning (guide §4.1).
DEPRECATED = (
    cli.Deprecated("listen_address", "metrics_bind_address", part="host", until="v1.15.0"),
    cli.Deprecated("port", "metrics_bind_address", kind="int", part="port", until="v1.15.0"),
)
_doc = cli.setting
# A CDI vendor or class name (no Kubernetes name: CDI's own rule, as dra.cdi checks it).
_CDI_NAME = re.compile(r"[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?\Z")
# The name part of a DRA attribute name: a C identifier of at most 32 characters.
_C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,31}\Z")


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
        "Comma-separated resource kinds to advertise, of gpu, gpu-core, gpu-memory, ppu, "
        "gpu-vfio. A kind with no device on the node advertises nothing.",
        "gpu,gpu-core,gpu-memory,ppu,gpu-vfio",
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
    resource_gpu_vfio: str = _doc(
        "Extended resource name of whole GPUs bound to vfio-pci, for pass-through to a VM "
        "(docs/vfio.md); they are never advertised under the other GPU resources.",
        "aliyun.com/gpu-vfio",
    )
    mig_strategy: str = _doc(
        "How MIG partitions are advertised: `single` (folded into the whole-GPU resource), "
        "`mixed` (one resource per profile, <gpu resource>-mig-<profile>) or `none` (a MIG GPU "
        "is advertised as one whole GPU).",
        "single",
        choices=MIG_STRATEGIES,
    )
    health_interval: float = _doc(
        "Seconds between periodic health checks (ListDevices), besides the WatchDevices stream.",
        5.0,
    )
    rpc_timeout: float = _doc("Seconds one Runtime call may take.", 5.0)
    runtime_restart_grace: float = _doc(
        "Seconds after the Runtime was last seen alive (an answer, an open WatchDevices stream, a "
        "connection its socket took) during which a device-daemon.sock that takes no connection "
        "is a Runtime restarting: Allocate (and Prepare) waits for it, within rpc_timeout. "
        "Later, or before the Runtime was ever seen, the Runtime is down and Allocate fails at "
        "once naming the socket. 0: never wait for a missing socket. Default: the guide's "
        "longest reconnect backoff.",
        30.0,
    )
    allocate_timeout: float = _doc(
        "Seconds Allocate may take in all (the kubelet gives none) before failing clearly.", 10.0
    )
    pods_source: str = _doc(
        "Where the shared-GPU handshake and the reconciler find this node's pods: `auto` (the "
        "kubelet's read-only /pods while it answers, else the apiserver's spec.nodeName list; "
        "the kubelet is asked again a minute later), `kubelet` (read-only /pods only, the "
        "guide's way) or `apiserver` (the list only, for clusters that keep 10255 closed). The "
        "log line `pods_source` says which one answers.",
        "auto",
        choices=PODS_SOURCES,
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
    publish_inventory: bool = _doc(
        "Publish NodeDevices and node labels to the apiserver (--publish-inventory=false: not).",
        True,
    )
    node_label_prefix: str = _doc(
        "Prefix of the node labels the plugin writes (<prefix>/model, <prefix>/count, ...; "
        "docs/node-labels.md): a DNS subdomain of at most 63 characters that the plugin alone "
        "writes under. On a rename the labels under the old prefix are removed: the node label "
        "lj-runtimekit.aliyun.com/node-label-prefix records the prefix last written.",
        "lj-runtimekit.aliyun.com",
    )
    mode: str = _doc(
        "How the node's accelerators reach pods: `device-plugin` (extended resources through the "
        "kubelet's device plugin API) or `dra` (a Dynamic Resource Allocation driver: "
        "ResourceSlices, NodePrepareResources, CDI; docs/dra.md). One mode per node: a node never "
        "advertises the same devices both ways.",
        "device-plugin",
        choices=MODES,
    )
    dra_driver_name: str = _doc(
        "The DRA driver name: the ResourceSlices' spec.driver, the DeviceClasses' selector and the "
        "kubelet plugin's registered name (mode dra).",
        "lj-runtimekit.aliyun.com",
    )
    dra_plugin_dir: str = _doc(
        "The kubelet's DRA plugin directory; the driver's socket and checkpoint go in "
        "<dir>/<driver name>/ (mode dra). The path must be the same in the pod and on the host.",
        "/var/lib/kubelet/plugins",
    )
    dra_registry_dir: str = _doc(
        "The kubelet's plugin watcher directory, where the registration socket goes (mode dra).",
        "/var/lib/kubelet/plugins_registry",
    )
    dra_partitions: str = _doc(
        "How MIG instances and TDM slices are published in mode dra (docs/dra.md): `static` (a "
        "partitioned GPU as the partitions the Runtime has, e.g. from a layout of "
        "docs/partitioning.md) or `dynamic` (every GPU that supports MIG, else TDM, is published "
        "whole and as every partition that could be made on it; a claim's partition is made when "
        "the kubelet prepares it and removed when it unprepares it; needs a Runtime with "
        "ConfigService.CreatePartition).",
        "static",
        choices=PARTITION_POLICIES,
    )
    dra_topology_labels: str = _doc(
        "Node labels published as an attribute of every device of the node's ResourceSlices "
        "(mode dra), under the label's own key: the network-topology levels the scheduler packs "
        "gangs by (its topology_labels), comma-separated. Each must be <domain>/<name> with a "
        "name of letters, digits and '_' (a DRA attribute name); a node without the label has "
        "no such attribute.",
        "network.topology/block,network.topology/rack",
    )
    cdi_dir: str = _doc(
        "Where the CDI spec of each prepared claim is written for the container runtime "
        "(containerd reads /etc/cdi and /var/run/cdi; mode dra).",
        "/var/run/cdi",
    )
    cdi_kind: str = _doc(
        "The CDI kind (<vendor>/<class>) of the specs written for prepared claims (mode dra).",
        "aliyun.com/gpu",
    )
    nri: bool = _doc(
        "In mode dra, add the Runtime's injection annotations of a container's prepared claims "
        "to its OCI spec through containerd's NRI (CDI applies env, device nodes and mounts but "
        "not annotations), so the lj-runtime handler sees them (--nri=false: not).",
        True,
    )
    nri_socket: str = _doc(
        "containerd's NRI socket the NRI plugin connects to (mode dra, --nri); absent: retried "
        "with backoff, not fatal.",
        "/var/run/nri/nri.sock",
    )
    kubeconfig: str = cli.kubeconfig()
    metrics_bind_address: str = cli.metrics_bind_address("0.0.0.0:9502")
    health_probe_bind_address: str = cli.health_probe_bind_address()
    log_level: str = cli.log_level()
    log_format: str = cli.log_format()

    @property
    def annotation_patterns(self) -> tuple[str, ...]:
        return tuple(p.strip() for p in self.containerd_annotation_patterns.split(",") if p.strip())

    @property
    def topology_labels(self) -> tuple[str, ...]:
        return tuple(k.strip() for k in self.dra_topology_labels.split(",") if k.strip())

    @property
    def enabled(self) -> tuple[str, ...]:
        """The enabled resource kinds, in the order given."""
        return tuple(k.strip() for k in self.resources.split(",") if k.strip())

    def resource_name(self, kind: str) -> str:
        """The extended resource name configured for ``kind`` (one of RESOURCE_KINDS)."""
        return str(getattr(self, "resource_" + kind.replace("-", "_")))

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
            config.validate(self)
        except config.SettingsError as e:
            raise ConfigError(str(e)) from e
        bad = [k for k in self.enabled if k not in RESOURCE_KINDS]
        if bad:
            raise ConfigError(f"resources: unknown kinds {bad}; known: {list(RESOURCE_KINDS)}")
        names = [self.resource_name(k) for k in RESOURCE_KINDS]
        for n in names:
            if n.count("/") != 1 or not all(n.split("/")):
                raise ConfigError(f"resource name {n!r}: expected <domain>/<name>")
        if len(set(names)) != len(names):
            raise ConfigError(f"resource names must differ: {names}")
        prefix = self.node_label_prefix
        # 63, not DNS's 253: the prefix is recorded as a label value (nodedevices.PREFIX_LABEL)
        if len(prefix) > 63 or not is_dns_subdomain(prefix):
            raise ConfigError(
                f"node_label_prefix {prefix!r}: expected a DNS subdomain of at most 63 "
                "characters, lowercase letters, digits, '-' and '.', e.g. gpu.example.com"
            )
        if not is_dns_subdomain(self.dra_driver_name) or len(self.dra_driver_name) > 63:
            raise ConfigError(
                f"dra_driver_name {self.dra_driver_name!r}: expected a DNS subdomain of at most "
                "63 characters, e.g. gpu.example.com"
            )
        for key in self.topology_labels:
            if not _attribute_name(key):
                raise ConfigError(
                    f"dra_topology_labels: {key!r} cannot be a DRA attribute name: expected "
                    "<domain>/<name>, a DNS subdomain and a name of letters, digits and '_' "
                    "(at most 32), e.g. network.topology/block"
                )
        for name in ("dra_plugin_dir", "dra_registry_dir", "cdi_dir", "nri_socket"):
            if not getattr(self, name).startswith("/"):
                raise ConfigError(f"{name} {getattr(self, name)!r}: expected an absolute path")
        vendor, sep, klass = self.cdi_kind.partition("/")
        if not (sep and _CDI_NAME.match(vendor) and _CDI_NAME.match(klass)):
            raise ConfigError(
                f"cdi_kind {self.cdi_kind!r}: expected <vendor>/<class>, each starting with a "
                "letter and holding letters, digits, '_', '-', '.', e.g. aliyun.com/gpu"
            )
        for name in (
            "health_interval",
            "rpc_timeout",
            "allocate_timeout",
            "reconcile_interval",
            "release_grace",
        ):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} {getattr(self, name)}: expected a positive number")
        if not 0 <= self.runtime_restart_grace < math.inf:
            raise ConfigError(
                f"runtime_restart_grace {self.runtime_restart_grace}: expected a number of "
                "seconds, 0 or more"
            )


FIELDS = {f.name: f for f in dataclasses.fields(Settings)}


def parser() -> argparse.ArgumentParser:
    return cli.parser(
        PROG,
        "Registers the node's accelerators with the kubelet as extended resources.",
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


def _attribute_name(key: str) -> bool:
    """A fully qualified DRA attribute name: a DNS subdomain of at most 63 characters, ``/``, a
    C identifier of at most 32."""
    domain, sep, name = key.partition("/")
    return (
        bool(sep)
        and len(domain) <= 63
        and is_dns_subdomain(domain)
        and bool(_C_IDENTIFIER.match(name))
    )
