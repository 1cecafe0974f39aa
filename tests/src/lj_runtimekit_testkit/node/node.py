"""A real node: kubelet + containerd + runc in private namespaces, joined to the harness' control
plane. See the package docstring for what it is made of; this module is its life cycle on the
host side (prepare, start, wait Ready, operate, stop and leave the host as it was)."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from lj_runtimekit_testkit.cluster.pki import issue_from_ca
from lj_runtimekit_testkit.cluster.processes import BinaryProcess, ProcessExited
from lj_runtimekit_testkit.node import cgroups, seed
from lj_runtimekit_testkit.node.binaries import node_binaries_dir, pause_image, require_host
from lj_runtimekit_testkit.node.config import (
    CNI_CONF_DIR,
    DRIVER_LIBS,
    KUBELET_DIR,
    KUBELET_SYSCTLS,
    RUNTIME_RECORDS,
    XPU_RUNTIME,
    NodeConfig,
    cni_conflist,
    containerd_config,
    kubelet_config,
    node_kubeconfig,
)
from lj_runtimekit_testkit.node.hostcmd import RealNodeError, free_char_major, run
from lj_runtimekit_testkit.node.layout import (
    NODE_PATH,
    FakeDevice,
    NodeLayout,
    accelerator_devices,
    supervisor_spec,
)

if TYPE_CHECKING:
    from lj_runtimekit_testkit.cluster.launcher import ControlPlane

log = structlog.get_logger(__name__)

_HERE = Path(__file__).resolve().parent
SERVICES = ("containerd", "kubelet", "runtime")


@dataclass
class RealNode:
    """One real node. ``start()`` returns once the Node is Ready; ``stop()`` is idempotent and also
    runs at exit and on SIGTERM (through the control plane's handler)."""

    name: str
    control_plane: ControlPlane
    index: int
    root: Path
    inventory: str | None = None
    """Runtime simulator inventory (name in tests/inventories or a YAML path); None: no Runtime."""
    private_dev: bool = False
    """A private /dev with the standard devices and ``devices`` (default: the device nodes of
    ``inventory``, so that what the Runtime injects exists on the node)."""
    devices: list[FakeDevice] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    ready_deadline_s: float = 120.0
    read_only_port: int = 10255
    """The kubelet's read-only port (``/pods``); 0: closed, as in clusters that refuse it."""
    seed_images: tuple[Path, ...] = ()
    """Image archives the node's containerd starts with, besides pause and probe (see
    :mod:`~lj_runtimekit_testkit.node.seed`); :meth:`import_image` of one of them is a no-op."""
    ip: str = ""
    start_s: float = 0.0
    layout: NodeLayout = field(init=False)
    cgroup_root: str = field(init=False)
    host_veth: str = field(init=False)
    _proc: BinaryProcess | None = field(default=None, init=False, repr=False)
    _pid: int = field(default=0, init=False)
    _pid_ns: str = field(default="", init=False)
    _seen: dict[int, str] = field(default_factory=dict, init=False, repr=False)
    _stopped: bool = field(default=False, init=False)
    _seeded: frozenset[Path] = field(default=frozenset(), init=False, repr=False)

    def __post_init__(self) -> None:
        self.layout = NodeLayout(self.root)
        self.cgroup_root = f"{cgroups.PREFIX}{os.getpid()}-{self.name}"
        bridge = self.control_plane.bridge
        self.host_veth = f"{bridge.name if bridge else 'ljrk'}n{self.index}"

    # ------------------------------------------------------------------------------- public API

    @property
    def pid(self) -> int:
        """Host pid of the node's supervisor (PID 1 inside the node)."""
        return self._pid

    @property
    def process_group(self) -> int:
        """Host process group of the node (its ``unshare``; killing it kills the node)."""
        return self._proc.pid if self._proc else -1

    def host_path(self, node_path: str) -> Path:
        """Where a path of the node lives on the host."""
        return self.layout.host_path(node_path)

    def live_path(self, node_path: str) -> str:
        """``node_path`` through the supervisor's root (``/proc/<pid>/root/...``): the node's view
        exactly, while it runs, and short enough for a unix socket address (108 bytes), which a
        path under ``host_path`` may not be."""
        self._require_running()
        return f"/proc/{self._pid}/root{node_path}"

    def exec(
        self,
        argv: list[str],
        *,
        check: bool = True,
        timeout: float = 120.0,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside the node's namespaces (mount, UTS, IPC, net, PID) with the node's
        PATH; ``check`` raises :class:`RealNodeError` with its output when it exits non-zero."""
        self._require_running()
        cmd = [
            "nsenter",
            "--target",
            str(self._pid),
            "--mount",
            "--uts",
            "--ipc",
            "--net",
            "--pid",
            "--wd=/",
            "--",
            *argv,
        ]
        env = {"PATH": NODE_PATH, "HOME": "/root", "LANG": "C.UTF-8"}
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env=env, input=input, check=False
        )
        if check and proc.returncode != 0:
            raise RealNodeError(
                f"node {self.name}: `{' '.join(argv)}` exited {proc.returncode}:\n"
                f"{proc.stdout}{proc.stderr}"
            )
        return proc

    def import_image(self, archive: Path) -> None:
        """Import one OCI/Docker image archive into the node's containerd (namespace k8s.io);
        an archive the node was seeded with is there already."""
        if archive.resolve() in self._seeded:
            return
        node_view = str(archive)
        if self.layout.host_path(node_view) != archive:  # hidden by a private dir in the node
            staged = self.layout.host_path("/var/lib/lj-import") / archive.name
            staged.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(archive, staged)
            node_view = f"/var/lib/lj-import/{archive.name}"
        self.exec(
            ["ctr", "-n", "k8s.io", "images", "import", "--platform", "linux/amd64", node_view]
        )

    def restart(self, service: str) -> None:
        """Restart ``containerd``, ``kubelet`` or ``runtime`` (the simulator); returns when it
        answers its health check again."""
        if service not in SERVICES:
            raise ValueError(f"unknown service {service!r}; one of {SERVICES}")
        self._ask(f"restart {service}")

    def is_active(self, service: str) -> bool:
        return self._ask(f"is-active {service}", check=False) == "active"

    def status(self) -> dict[str, Any]:
        """The supervisor's view: phase and, per service, pid, restarts, last exit code."""
        answer: dict[str, Any] = json.loads(self._ask("status", check=False))
        return answer

    def runtime_records(self) -> list[dict[str, Any]]:
        """What reached the ``xpu-container-runtime`` stand-in, one dict per ``create``."""
        path = self.host_path(RUNTIME_RECORDS)
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def add_containerd_config(self, toml: str) -> None:
        """Append ``toml`` to the node's /etc/containerd/config.toml (restart to apply)."""
        with self.host_path("/etc/containerd/config.toml").open("a") as f:
            f.write(toml)

    def log_tails(self, lines: int = 30) -> str:
        parts = []
        for path in (
            self.layout.supervisor_log,
            self.host_path("/var/log/lj-node/containerd.log"),
            self.host_path("/var/log/lj-node/kubelet.log"),
            self.host_path("/var/log/lj-node/runtime.log"),
        ):
            if path.exists():
                text = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"----- {path} -----\n" + "\n".join(text))
        return "\n".join(parts)

    def host_pids(self) -> dict[str, list[int]]:
        """Host pids of the node's processes (its supervisor's descendants and everything in its
        PID namespace, pods' own namespaces included), by command name."""
        found: dict[str, list[int]] = {}
        for pid in self._processes():
            with contextlib.suppress(OSError):
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
                found.setdefault(comm, []).append(pid)
        return found

    # ------------------------------------------------------------------------------- start

    def start(self) -> None:
        require_host()
        if self.control_plane.bridge is None:
            raise RealNodeError(
                "the control plane was started without node_network=True: its apiserver listens "
                "on loopback only, which a node in its own network namespace cannot reach"
            )
        started = time.monotonic()
        atexit.register(self.stop)
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        self.start_s = time.monotonic() - started
        log.info(
            "real_node_ready",
            node=self.name,
            ip=self.ip,
            start_s=round(self.start_s, 2),
            root=str(self.root),
        )

    def _start(self) -> None:
        bins = node_binaries_dir()
        bridge = self.control_plane.bridge
        assert bridge is not None
        self.ip = bridge.allocate_ip()
        self._prepare(bins)
        cgroups.sweep_stale()
        cgroups.create_root(self.cgroup_root)
        self._proc = BinaryProcess(
            f"node-{self.name}",
            [
                "unshare",
                "--mount",
                "--uts",
                "--ipc",
                "--net",
                "--pid",
                "--fork",
                "--kill-child",
                "--mount-proc",
                "--propagation",
                "private",
                sys.executable,
                str(_HERE / "supervisor.py"),
                str(self.layout.spec_file),
            ],
            self.layout.supervisor_log,
        )
        self._proc.start()
        self._pid = self._find_supervisor()
        self._pid_ns = os.readlink(f"/proc/{self._pid}/ns/pid")
        run(
            [
                "ip",
                "link",
                "add",
                self.host_veth,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                str(self._pid),
            ],
            f"node {self.name}: create its veth",
        )
        run(
            ["ip", "link", "set", self.host_veth, "master", bridge.name, "up"],
            f"node {self.name}: attach its veth to {bridge.name}",
        )
        self._wait(
            lambda: self._phase() == "running",
            "supervisor running (mounts, network, containerd)",
            60.0,
        )
        images = bins / "images"
        self.import_image(images / "pause.oci.tar")
        self.import_image(images / "probe.oci.tar")
        self._ask("start kubelet")
        self._wait(self._ready, "Node Ready", self.ready_deadline_s)

    def _prepare(self, bins: Path) -> None:
        ly = self.layout
        if self.root.exists():
            shutil.rmtree(self.root)
        for d in ly.mapping().values():
            d.parent.mkdir(parents=True, exist_ok=True)
        # The node's /etc starts as a copy of the host's (3.5 MB here): passwd, resolv.conf,
        # alternatives (iptables) and the rest work, and nothing it writes reaches the host.
        run(["cp", "-a", "/etc", str(ly.mapping()["/etc"])], "copy /etc for the node")
        for key in ("/run", "/var/lib", "/var/log", "/usr/local"):
            ly.mapping()[key].mkdir(parents=True, exist_ok=True)
        archives = [bins / "images" / "pause.oci.tar", bins / "images" / "probe.oci.tar"]
        archives += self.seed_images
        seed.install(seed.seed_store(bins, archives), ly.host_path("/var/lib/containerd"))
        self._seeded = frozenset(a.resolve() for a in archives)
        ly.usr_local_work.mkdir(parents=True, exist_ok=True)
        ly.sysctl_dir.mkdir(parents=True, exist_ok=True)
        for key, value in KUBELET_SYSCTLS.items():
            (ly.sysctl_dir / key.replace("/", ".")).write_text(value + "\n")
        (ly.host_path("/etc/hostname")).write_text(self.name + "\n")

        bridge = self.control_plane.bridge
        assert bridge is not None
        cfg = NodeConfig(
            name=self.name,
            ip=self.ip,
            apiserver=f"https://{bridge.ip}:{self.control_plane.apiserver_port}",
            pod_subnet=f"10.245.{self.index}.0/24",
            cgroup_root=f"/{self.cgroup_root}",
            pause_image=pause_image(),
            cni_bin_dir=str(bins / "cni"),
            read_only_port=self.read_only_port,
        )
        self._write("/etc/containerd/config.toml", containerd_config(cfg))
        self._write(f"{CNI_CONF_DIR}/10-ljrk-bridge.conflist", cni_conflist(cfg))
        self._write(f"{KUBELET_DIR}/kubelet-config.yaml", kubelet_config(cfg))
        pki = self.control_plane.pki
        pki_dir = ly.host_path(f"{KUBELET_DIR}/pki")
        pki_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(pki.ca_cert, pki_dir / "ca.crt")
        issue_from_ca(
            pki,
            pki_dir / "kubelet-client.crt",
            pki_dir / "kubelet-client.key",
            f"system:node:{self.name}",
            "system:nodes",
        )
        issue_from_ca(
            pki,
            pki_dir / "kubelet-serving.crt",
            pki_dir / "kubelet-serving.key",
            f"system:node:{self.name}",
            "system:nodes",
            server_ips=(self.ip,),
            dns_names=(self.name,),
        )
        self._write(
            f"{KUBELET_DIR}/kubelet.kubeconfig",
            node_kubeconfig(
                cfg.apiserver,
                f"{KUBELET_DIR}/pki/ca.crt",
                f"{KUBELET_DIR}/pki/kubelet-client.crt",
                f"{KUBELET_DIR}/pki/kubelet-client.key",
            ),
        )
        local_bin = ly.host_path("/usr/local/bin")
        local_bin.mkdir(parents=True, exist_ok=True)
        for b in ("kubelet", "containerd", "ctr", "containerd-shim-runc-v2", "runc"):
            (local_bin / b).symlink_to(bins / "bin" / b)
        shebang = f"#!{sys.executable} -I\n"
        self._write(
            "/usr/local/bin/systemctl",
            shebang + (_HERE / "systemctl_shim.py").read_text(),
            mode=0o755,
        )
        self._write(
            XPU_RUNTIME, shebang + (_HERE / "xpu_runtime_standin.py").read_text(), mode=0o755
        )
        # The driver libraries the Runtime's injection bind-mounts (simulator.ledger.DRIVER_MOUNT)
        # exist on a node with the Runtime installed. The device plugin path gives the mount to
        # the CRI, where containerd makes a missing host path; a CDI spec (DRA) does not.
        if self.inventory:
            self._write(f"{DRIVER_LIBS}/README", "the Runtime simulator's driver libraries\n")
        if self.private_dev and not self.devices and self.inventory:
            self.devices = accelerator_devices(
                _inventory_device_nodes(self.inventory), free_char_major()
            )
        args = [f"--node-labels={','.join(f'{k}={v}' for k, v in self.labels.items())}"]
        spec = supervisor_spec(
            name=self.name,
            layout=ly,
            ip=self.ip,
            prefixlen=bridge.prefixlen,
            gateway=bridge.ip,
            apiserver_port=self.control_plane.apiserver_port,
            bin_dir=bins / "bin",
            python=sys.executable,
            kubelet_args=args if self.labels else [],
            private_dev=self.private_dev,
            devices=self.devices,
            inventory=self.inventory,
        )
        ly.spec_file.write_text(json.dumps(spec, indent=2))

    def _write(self, node_path: str, text: str, mode: int = 0o644) -> None:
        path = self.layout.host_path(node_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(mode)

    def _find_supervisor(self) -> int:
        """The host pid of unshare's child (PID 1 of the node's PID namespace)."""
        assert self._proc is not None
        parent = self._proc.pid
        found: list[int] = []

        def probe() -> bool:
            found[:] = [p for p in _children(parent)]
            return bool(found)

        self._wait(probe, "the node's supervisor to start under unshare", 10.0)
        return found[0]

    # ------------------------------------------------------------------------------- polling

    def _wait(self, probe: Any, what: str, deadline_s: float) -> None:
        deadline = time.monotonic() + deadline_s
        interval = 0.02
        while True:
            if self._proc is not None:
                try:
                    self._proc.check_running()
                except ProcessExited as e:
                    raise RealNodeError(
                        f"node {self.name}: its supervisor exited while waiting for {what}:\n{e}\n"
                        + self.log_tails()
                    ) from e
            if probe():
                return
            if time.monotonic() > deadline:
                raise RealNodeError(
                    f"node {self.name}: {what} not reached within {deadline_s:.0f} s\n"
                    + self.log_tails()
                )
            time.sleep(interval)
            interval = min(interval * 1.5, 0.5)

    def _phase(self) -> str:
        try:
            return str(json.loads(self._ask("status", check=False)).get("phase", ""))
        except (RealNodeError, ValueError):
            return ""

    def _ready(self) -> bool:
        with _api(self.control_plane) as api:
            try:
                node = client.CoreV1Api(api).read_node(self.name)
            except ApiException as e:
                if e.status == 404:
                    return False
                raise
        for cond in (node.status.conditions if node.status else None) or []:
            if cond.type == "Ready":
                return bool(cond.status == "True")
        return False

    def _processes(self) -> list[int]:
        """Live host pids of the node: its PID namespace's members, the supervisor's descendants
        (containers sit in PID namespaces of their own), and any seen at stop still alive."""
        table = _table()
        pids = set(_pids_in_ns(self._pid_ns)) if self._pid_ns else set()
        if self._pid and self._pid in table and not self._stopped:
            pids.add(self._pid)
        changed = True
        while changed:
            children = {p for p, (ppid, _) in table.items() if ppid in pids} - pids
            changed = bool(children)
            pids |= children
        pids |= {p for p, start in self._seen.items() if p in table and table[p][1] == start}
        return sorted(pids)

    def _require_running(self) -> None:
        if not self._pid or self._stopped:
            raise RealNodeError(f"node {self.name} is not running")

    def _ask(self, line: str, *, check: bool = True, timeout: float = 180.0) -> str:
        """One request to the supervisor's control socket (reached through /proc/<pid>/root, a
        path short enough for a unix socket whatever the work dir)."""
        self._require_running()
        path = f"/proc/{self._pid}/root/run/lj-node/control.sock"
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(timeout)
                s.connect(path)
                s.sendall(line.encode() + b"\n")
                data = b""
                while chunk := s.recv(65536):
                    data += chunk
        except OSError as e:
            raise RealNodeError(f"node {self.name}: supervisor not reachable at {path}: {e}") from e
        answer = data.decode().strip()
        if check and answer != "ok":
            raise RealNodeError(f"node {self.name}: `{line}` failed: {answer}\n" + self.log_tails())
        return answer

    # ------------------------------------------------------------------------------- stop

    def stop(self) -> None:
        """Stop everything the node started and undo what it made on the host: processes, veth,
        cgroups, the Node object. Safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)
        self._seen = _starts(self._processes())  # pods in their own PID namespaces too
        if self._proc is not None:
            self._proc.stop(grace_s=40.0)
        if self._pid_ns:
            deadline = time.monotonic() + 30.0
            while pids := self._processes():
                if time.monotonic() > deadline:
                    for pid in pids:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
                    log.warning("real_node_processes_killed", node=self.name, pids=pids)
                    break
                time.sleep(0.05)
        if Path(f"/sys/class/net/{self.host_veth}").exists():
            run(["ip", "link", "del", self.host_veth], f"delete veth {self.host_veth}", check=False)
        left = cgroups.remove_root(self.cgroup_root)
        if left:
            log.warning("real_node_cgroups_left", node=self.name, cgroups=left)
        with contextlib.suppress(OSError):
            shutil.rmtree(self.layout.host_path("/var/lib"))  # images and snapshots; logs stay
        self._delete_node_object()
        log.info("real_node_stopped", node=self.name, root=str(self.root))

    def _delete_node_object(self) -> None:
        if not self.control_plane.processes or any(
            p.popen is None or p.popen.poll() is not None for p in self.control_plane.processes
        ):
            return
        with contextlib.suppress(Exception), _api(self.control_plane) as api:
            client.CoreV1Api(api).delete_node(self.name, _request_timeout=5)


def _inventory_device_nodes(inventory: str) -> list[str]:
    from lj_runtimekit_testkit.simulator.inventory import VFIO_CONTROL_NODE, Kind
    from lj_runtimekit_testkit.simulator.inventory_file import load_inventory

    inv = load_inventory(inventory)
    paths = [p for d in inv.devices for p in d.device_nodes]
    # A GPU may be bound to vfio-pci while the node runs (SetDeviceBinding): its IOMMU group's
    # node and the vfio container must exist then, or a pod given them cannot start.
    gpus = [d for d in inv.devices if d.kind is Kind.GPU]
    vfio = [f"/dev/vfio/{d.group}" for d in gpus] + ([VFIO_CONTROL_NODE] if gpus else [])
    return list(dict.fromkeys([*paths, *inv.control_device_nodes, *vfio]))


def _api(control_plane: ControlPlane) -> client.ApiClient:
    from kubernetes import config

    configuration = client.Configuration()
    config.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=str(control_plane.kubeconfig), client_configuration=configuration
    )
    return client.ApiClient(configuration)


def _children(parent: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{entry}/stat").read_text()
            if int(stat.rpartition(")")[2].split()[1]) == parent:
                kids.append(int(entry))
    return kids


def _table() -> dict[int, tuple[int, str]]:
    """pid -> (ppid, start time) of every live process (zombies left out)."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()
                if fields[0] != "Z":
                    table[int(entry)] = (int(fields[1]), fields[19])
    return table


def _starts(pids: list[int]) -> dict[int, str]:
    table = _table()
    return {pid: table[pid][1] for pid in pids if pid in table}


def _pids_in_ns(pid_ns: str) -> list[int]:
    """Host pids of every live process in the PID namespace ``pid_ns`` (a /proc/*/ns/pid link)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{entry}/ns/pid") == pid_ns:
                stat = Path(f"/proc/{entry}/stat").read_text()
                if stat.rpartition(")")[2].split()[0] != "Z":
                    pids.append(int(entry))
    return pids
