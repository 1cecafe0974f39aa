"""A real node leaves the host as it found it: after stop, no process of it runs, its veth and
cgroups are gone, and the host's iptables, the sysctls the kubelet and the CNI plugins care about,
its links, cgroup tree, mounts and the directories a kubelet or containerd would write to are as
they were before the node started. Also: what an idle node costs (logged, not asserted)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import structlog
from kubernetes import client

from lj_runtimekit_testkit.cluster.fixtures import RealNodeFactory
from lj_runtimekit_testkit.cluster.handle import Cluster
from lj_runtimekit_testkit.cluster.launcher import ControlPlane
from lj_runtimekit_testkit.node import RealNode
from lj_runtimekit_testkit.node.cgroups import hierarchies

pytestmark = [pytest.mark.realnode, pytest.mark.cluster]

log = structlog.get_logger(__name__)

SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
    "net/ipv4/ip_forward",
    "net/ipv4/conf/all/forwarding",
    "net/ipv4/conf/all/route_localnet",
    "net/ipv6/conf/all/forwarding",
    "net/bridge/bridge-nf-call-iptables",
    "net/netfilter/nf_conntrack_max",
)
# Where a kubelet, containerd, runc, CNI or NRI write by default on a host.
HOST_PATHS = (
    "/etc/containerd",
    "/etc/cni",
    "/etc/kubernetes",
    "/etc/nri",
    "/etc/cdi",
    "/opt/containerd",
    "/opt/cni",
    "/opt/nri",
    "/var/lib/kubelet",
    "/var/lib/containerd",
    "/var/lib/cni",
    "/var/log/pods",
    "/var/log/containers",
    "/run/containerd",
    "/run/nri",
    "/run/cdi",
    "/run/amp",
    "/usr/libexec/kubernetes",
    "/usr/local/harp",
    "/usr/local/bin",
)
_COUNTERS = re.compile(r"\[\d+:\d+\]")
_OTHER_HARNESS_LINK = re.compile(r"^ljrk\d+")
_OTHER_HARNESS_CGROUP = re.compile(r"^ljrk-(\d+)-")


def _iptables() -> list[str]:
    out = []
    for tool in ("iptables-save", "ip6tables-save"):
        if shutil.which(tool) is None:
            continue
        proc = subprocess.run([tool], capture_output=True, text=True, check=False)
        out += [
            _COUNTERS.sub("", line)
            for line in proc.stdout.splitlines()
            if line and not line.startswith("#")
        ]
    return out


def _sysctls() -> dict[str, str]:
    values = {}
    for key in SYSCTLS:
        path = Path("/proc/sys") / key
        values[key] = path.read_text().strip() if path.exists() else "<absent>"
    return values


def _links(own_bridge: str) -> set[str]:
    names = set(os.listdir("/sys/class/net"))
    return {n for n in names if not _OTHER_HARNESS_LINK.match(n) or n.startswith(own_bridge)}


def _cgroups() -> set[str]:
    entries = set()
    for mount in hierarchies():
        for entry in mount.iterdir():
            match = _OTHER_HARNESS_CGROUP.match(entry.name)
            if entry.is_dir() and not (match and int(match.group(1)) != os.getpid()):
                entries.add(f"{mount}/{entry.name}")
    return entries


def _mounts(node_root: Path) -> set[str]:
    """Mount points on the host where a node's private mounts would show if they leaked."""
    watched = ("/etc", "/run", "/var/lib", "/var/log", "/usr/local", "/dev", "/proc/sys")
    points = set()
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4]
        if point.startswith(str(node_root)) or any(
            point == w or point.startswith(w + "/") for w in watched
        ):
            points.add(f"{point} {line.split(' - ')[1].split()[0]}")
    return points


def _paths() -> dict[str, list[str] | None]:
    listing: dict[str, list[str] | None] = {}
    for p in HOST_PATHS:
        path = Path(p)
        listing[p] = sorted(os.listdir(path)) if path.is_dir() else None
    return listing


def snapshot(control_plane: ControlPlane, node_root: Path) -> dict[str, Any]:
    assert control_plane.bridge is not None
    return {
        "iptables": _iptables(),
        "sysctls": _sysctls(),
        "links": _links(control_plane.bridge.name),
        "cgroups": _cgroups(),
        "mounts": _mounts(node_root),
        "paths": _paths(),
    }


def test_a_stopped_node_leaves_the_host_as_it_found_it(
    cluster: Cluster, real_nodes: RealNodeFactory, namespace: str
) -> None:
    cp = cluster.control_plane
    assert cp is not None
    root = cp.work_dir / "nodes" / "leaves-no-trace"
    before = snapshot(cp, root)

    node = real_nodes.add(name="leaves-no-trace", inventory="gpu-1x", private_dev=True)
    with cluster.api_client() as api:
        core = client.CoreV1Api(api)
        pod = client.V1Pod(
            metadata=client.V1ObjectMeta(name="trace"),
            spec=client.V1PodSpec(
                node_name=node.name,
                termination_grace_period_seconds=1,
                containers=[
                    client.V1Container(
                        name="probe",
                        image="localhost/lj-runtimekit/probe:v1",
                        image_pull_policy="Never",
                        args=["sleep"],
                    )
                ],
            ),
        )
        core.create_namespaced_pod(namespace, pod)
        deadline = time.monotonic() + 90
        while _phase(core, namespace) != "Running":
            assert time.monotonic() < deadline, "pod trace not Running within 90 s"
            time.sleep(0.1)
    during = snapshot(cp, root)
    assert any(c.endswith(f"/{node.cgroup_root}") for c in during["cgroups"])
    assert node.host_veth in during["links"]
    pid_ns = node.host_pids()
    assert {"containerd", "kubelet", "pause", "probe"} <= set(pid_ns), pid_ns

    node.stop()

    assert node.host_pids() == {}
    after = snapshot(cp, root)
    for key in before:
        assert after[key] == before[key], f"{key} changed by the node"


def _phase(core: client.CoreV1Api, ns: str) -> str:
    pod: Any = core.read_namespaced_pod("trace", ns)
    return str(pod.status.phase)


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def test_an_idle_node_costs_little(
    real_node: RealNode, record_property: Callable[[str, object], None]
) -> None:
    """Measured and logged, not asserted (two shared cores make timings noisy): kubelet and
    containerd CPU over 10 s of idling, and their resident memory."""
    pids = real_node.host_pids()
    daemons = {name: pids[name][0] for name in ("kubelet", "containerd")}
    hz = os.sysconf("SC_CLK_TCK")
    start = {name: _cpu_ticks(pid) for name, pid in daemons.items()}
    t0 = time.monotonic()
    time.sleep(10.0)  # the measurement window itself, not a wait for a condition
    elapsed = time.monotonic() - t0
    figures: dict[str, object] = {}
    for name, pid in daemons.items():
        cpu = (_cpu_ticks(pid) - start[name]) / hz / elapsed * 100
        figures[f"{name}_cpu_percent"] = round(cpu, 2)
        figures[f"{name}_rss_mib"] = round(_rss_kib(pid) / 1024, 1)
    log.info("idle_node", node=real_node.name, window_s=round(elapsed, 1), **figures)
    for key, value in figures.items():
        record_property(key, value)
    assert all(_rss_kib(pid) > 0 for pid in daemons.values())
