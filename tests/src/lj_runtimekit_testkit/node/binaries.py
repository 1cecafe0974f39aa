"""Where the real nodes' binaries are: the lookup of ``tests/cluster/build-node-binaries.sh``
(its cache directory, keyed by the versions pinned in ``tests/cluster/versions.env``)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from lj_runtimekit_testkit.cluster.binaries import pinned_versions
from lj_runtimekit_testkit.node.hostcmd import RealNodeError, RealNodeUnavailable

BINARIES = ("kubelet", "containerd", "ctr", "containerd-shim-runc-v2", "runc", "pause", "probe")
CNI_PLUGINS = ("bridge", "host-local", "loopback", "portmap")
HOST_TOOLS = ("unshare", "nsenter", "ip", "iptables", "mount")


def node_cache_dir(versions: dict[str, str] | None = None) -> Path:
    v = versions if versions is not None else pinned_versions()
    root = os.environ.get("LJ_RUNTIMEKIT_CACHE") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lj-runtimekit"
    )
    pause_tag = v["PAUSE_IMAGE"].rpartition(":")[2]
    key = (
        f"node-{v['KUBERNETES_VERSION']}_containerd-{v['CONTAINERD_VERSION']}"
        f"_runc-{v['RUNC_VERSION']}_pause-{pause_tag}"
    )
    return Path(root) / "node" / key


def pause_image() -> str:
    return pinned_versions()["PAUSE_IMAGE"]


def node_binaries_dir() -> Path:
    """The directory holding bin/, cni/ and images/, or :class:`RealNodeError` saying how to
    build it."""
    d = node_cache_dir()
    missing = [f"bin/{b}" for b in BINARIES if not os.access(d / "bin" / b, os.X_OK)]
    missing += [f"cni/{p}" for p in CNI_PLUGINS if not os.access(d / "cni" / p, os.X_OK)]
    missing += [
        f"images/{i}"
        for i in ("pause.oci.tar", "probe.oci.tar")
        if not (d / "images" / i).is_file()
    ]
    if missing:
        raise RealNodeError(
            f"real-node binaries {missing} not found in {d}: run `make k8s-bin` "
            "(tests/cluster/build-node-binaries.sh)"
        )
    return d


def host_support() -> str | None:
    """Why this machine cannot run real nodes at all (None when it can try)."""
    if sys.platform != "linux":
        return f"real nodes need Linux namespaces and cgroups; this is {sys.platform}"
    if os.geteuid() != 0:
        return (
            "real nodes need root (mount, network and PID namespaces, cgroups, a host bridge); "
            f"running as uid {os.geteuid()}"
        )
    missing = [t for t in HOST_TOOLS if shutil.which(t) is None]
    if missing:
        return f"real nodes need the host tools {missing} (util-linux, iproute2, iptables)"
    return None


def require_host() -> None:
    reason = host_support()
    if reason:
        raise RealNodeUnavailable(reason)
