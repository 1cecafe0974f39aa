"""Where a real node's private directories live on the host, and the supervisor's spec: the mounts
that give the node its own /etc, /run, /var/lib, /var/log and /usr/local (and optionally /dev),
its network, and its services. Pure: paths and data, no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lj_runtimekit_testkit.node.config import (
    CONTAINERD_SOCKET,
    KUBELET_DIR,
    KUBELET_HEALTHZ_PORT,
    KUBELET_SYSCTLS,
)

RUNTIME_SOCKET_DIR = "/run/amp/eKitC/xdm/sockets"
NODE_PATH = "/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin"
SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"


@dataclass(frozen=True)
class FakeDevice:
    """A character device node made in the node's private /dev (its numbers need no driver)."""

    path: str
    major: int
    minor: int


def accelerator_devices(paths: list[str], major: int) -> list[FakeDevice]:
    """Character devices at ``paths`` (e.g. the simulator inventory's /dev/nvidia0..,
    /dev/nvidiactl), numbered ``major``:0.. (a major no driver on the host claims)."""
    return [FakeDevice(p, major, i) for i, p in enumerate(paths)]


@dataclass(frozen=True)
class NodeLayout:
    """The host directory ``root`` holding one node's private trees."""

    root: Path

    # Node path prefix -> host directory. /usr/local is an overlay on the host's: what the node
    # writes there lands in its upper dir.
    def mapping(self) -> dict[str, Path]:
        return {
            "/etc": self.root / "etc",
            "/run": self.root / "run",
            "/var/run": self.root / "run",
            "/var/lib": self.root / "var-lib",
            "/var/log": self.root / "var-log",
            "/usr/local": self.root / "usr-local" / "upper",
        }

    @property
    def usr_local_work(self) -> Path:
        return self.root / "usr-local" / "work"

    @property
    def sysctl_dir(self) -> Path:
        return self.root / "sysctl"

    @property
    def spec_file(self) -> Path:
        return self.root / "spec.json"

    @property
    def supervisor_log(self) -> Path:
        return self.root / "supervisor.log"

    def host_path(self, node_path: str) -> Path:
        """Where ``node_path`` (as the node sees it) lives on the host. Paths under the node's
        private trees map into ``root`` — for /usr/local that is the overlay's upper dir, so a
        file the node only inherits from the host's /usr/local is not there (and writing through
        this path never reaches the host's own /usr/local). Other paths are the host's."""
        if not node_path.startswith("/"):
            raise ValueError(f"node paths are absolute, got {node_path!r}")
        for prefix, host_dir in self.mapping().items():
            if node_path == prefix or node_path.startswith(prefix + "/"):
                return host_dir / node_path[len(prefix) :].lstrip("/")
        return Path(node_path)

    def mounts(self, private_dev: bool) -> list[dict[str, str]]:
        m = self.mapping()
        mounts = [
            {"type": "bind", "source": str(m["/etc"]), "target": "/etc"},
            {"type": "bind", "source": str(m["/run"]), "target": "/run"},
            {"type": "bind", "source": str(m["/var/lib"]), "target": "/var/lib"},
            {"type": "bind", "source": str(m["/var/log"]), "target": "/var/log"},
            {
                "type": "overlay",
                "lower": "/usr/local",
                "upper": str(m["/usr/local"]),
                "work": str(self.usr_local_work),
                "target": "/usr/local",
            },
        ]
        if private_dev:
            mounts += [
                {"type": "tmpfs", "target": "/dev", "options": "mode=755,size=64k"},
                {
                    "type": "devpts",
                    "target": "/dev/pts",
                    "options": "newinstance,ptmxmode=0666,mode=620",
                },
                {"type": "tmpfs", "target": "/dev/shm", "options": "mode=1777,size=64m"},
                {"type": "mqueue", "target": "/dev/mqueue"},
            ]
        return mounts


def standard_devices() -> list[FakeDevice]:
    """What a minimal /dev holds (the host's devices of the same numbers)."""
    return [
        FakeDevice("/dev/null", 1, 3),
        FakeDevice("/dev/zero", 1, 5),
        FakeDevice("/dev/full", 1, 7),
        FakeDevice("/dev/random", 1, 8),
        FakeDevice("/dev/urandom", 1, 9),
        FakeDevice("/dev/kmsg", 1, 11),
        FakeDevice("/dev/tty", 5, 0),
    ]


def supervisor_spec(
    *,
    name: str,
    layout: NodeLayout,
    ip: str,
    prefixlen: int,
    gateway: str,
    apiserver_port: int,
    bin_dir: Path,
    python: str,
    kubelet_args: list[str],
    private_dev: bool,
    devices: list[FakeDevice],
    inventory: str | None,
) -> dict[str, Any]:
    """The JSON the supervisor (PID 1 of the node) reads."""
    log = "/var/log/lj-node"
    services: dict[str, Any] = {
        "containerd": {
            "argv": [str(bin_dir / "containerd"), "--config", "/etc/containerd/config.toml"],
            "log": f"{log}/containerd.log",
            "health": {"kind": "unix", "target": CONTAINERD_SOCKET},
        },
    }
    if inventory:
        services["runtime"] = {
            "argv": [
                python,
                "-m",
                "lj_runtimekit_testkit.simulator",
                "--socket-dir",
                RUNTIME_SOCKET_DIR,
                "--inventory",
                inventory,
                "--node",
                name,
                "--state-file",
                "/var/lib/lj-runtime-sim/state.json",
                "--log-format",
                "json",
            ],
            "log": f"{log}/runtime.log",
            "health": {"kind": "unix", "target": f"{RUNTIME_SOCKET_DIR}/control.sock"},
        }
    services["kubelet"] = {
        "argv": [
            str(bin_dir / "kubelet"),
            f"--config={KUBELET_DIR}/kubelet-config.yaml",
            f"--kubeconfig={KUBELET_DIR}/kubelet.kubeconfig",
            f"--node-ip={ip}",
            f"--hostname-override={name}",
            *kubelet_args,
        ],
        "log": f"{log}/kubelet.log",
        "health": {"kind": "http", "target": f"http://127.0.0.1:{KUBELET_HEALTHZ_PORT}/healthz"},
    }
    all_devices = [*standard_devices(), *devices] if private_dev else []
    return {
        "name": name,
        "env": {"PATH": NODE_PATH, "HOME": "/root", "LANG": "C.UTF-8"},
        "mounts": layout.mounts(private_dev),
        "devices": [{"path": d.path, "major": d.major, "minor": d.minor} for d in all_devices],
        "symlinks": {
            "/dev/fd": "/proc/self/fd",
            "/dev/stdin": "/proc/self/fd/0",
            "/dev/stdout": "/proc/self/fd/1",
            "/dev/stderr": "/proc/self/fd/2",
            "/dev/ptmx": "pts/ptmx",
        }
        if private_dev
        else {},
        "sysctl_files": {
            f"/proc/sys/{key}": str(layout.sysctl_dir / key.replace("/", "."))
            for key in KUBELET_SYSCTLS
        },
        "network": {
            "interface": "eth0",
            "ip": ip,
            "prefixlen": prefixlen,
            "gateway": gateway,
            "service_cidr": SERVICE_CIDR,
            "service_ip": SERVICE_IP,
            "apiserver": f"{gateway}:{apiserver_port}",
        },
        "services": services,
        "autostart": [s for s in ("containerd", "runtime") if s in services],
    }
