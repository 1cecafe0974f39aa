"""The local control plane: etcd, kube-apiserver (RBAC, service accounts), kube-controller-manager,
kube-scheduler and kwok, on loopback with free ports, in one work directory.

With ``node_network=True`` it also claims a host bridge for real nodes
(:mod:`lj_runtimekit_testkit.node`): the apiserver then listens on every address (nodes reach it at
the bridge address, which joins its certificate) and holds a kubelet client certificate.

``ControlPlane.start()`` returns when every component answers its health check (deadlines, no
sleeps); ``stop()`` stops every process group and is also registered with ``atexit`` and run on
SIGTERM, so an interrupted test run leaves no process behind.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import functools
import os
import shutil
import signal
import socket
import ssl
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from lj_runtimekit_testkit.cluster.binaries import binaries_dir
from lj_runtimekit_testkit.cluster.kubeconfig import write_kubeconfig
from lj_runtimekit_testkit.cluster.pki import Pki, write_pki
from lj_runtimekit_testkit.cluster.processes import BinaryProcess, wait_until
from lj_runtimekit_testkit.cluster.stages import stages_yaml
from lj_runtimekit_testkit.node.bridge import HostBridge

log = structlog.get_logger(__name__)

SERVICE_CIDR = "10.96.0.0/16"
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
FEATURE_GATES = "--feature-gates=GenericWorkload=true"
"""On the apiserver, KCM and kube-scheduler: the Workload/PodGroup API and gang scheduling of
pods with ``spec.schedulingGroup`` (beta, off by default in 1.37). KCM needs it too: its
PodGroup protection controller lifts the finalizer the apiserver puts on every PodGroup, and its
resource-claim controller refuses to make the claims of a pod in a PodGroup without it. Pods
without ``spec.schedulingGroup`` are scheduled as before."""
RUNTIME_CONFIG = "--runtime-config=scheduling.k8s.io/v1beta1=true"
"""Serve ``scheduling.k8s.io/v1beta1`` (Workload, PodGroup): a beta group off by default."""


def _exit_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit so finalizers and atexit stop the binaries."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


# Ports handed out by any harness process on this host in the last PORT_HOLD_S seconds. A port
# is free when asked for but bound only later by the binary given it; parallel test workers (and
# a demo beside them) would otherwise be given the same one in between.
PORTS_FILE = Path(tempfile.gettempdir()) / "lj-runtimekit-ports"
PORT_HOLD_S = 120.0


def free_port() -> int:
    """A loopback port that is free now and no other harness process was given recently."""
    with PORTS_FILE.with_suffix(".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        now = time.time()
        held: dict[int, float] = {}
        with contextlib.suppress(OSError, ValueError):
            for entry in PORTS_FILE.read_text().split():
                given, _, when = entry.partition("@")
                if now - float(when) < PORT_HOLD_S:
                    held[int(given)] = float(when)
        port = 0
        for _ in range(100):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("127.0.0.1", 0))
                port = int(s.getsockname()[1])
            if port not in held:
                break
        held[port] = now
        tmp = PORTS_FILE.with_suffix(f".{os.getpid()}")
        tmp.write_text(" ".join(f"{p}@{w}" for p, w in held.items()))
        tmp.replace(PORTS_FILE)
        return port


def _https_ok(url: str, context: ssl.SSLContext) -> bool:
    try:
        with urllib.request.urlopen(url, context=context, timeout=2) as resp:
            return bool(resp.status == 200)
    except (OSError, ssl.SSLError):
        return False


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def _healthy(url: str, insecure: ssl.SSLContext) -> bool:
    return _https_ok(url, insecure) if url.startswith("https:") else _http_ok(url)


_MADE_WORK_DIRS: set[Path] = set()
"""The work dirs :class:`ControlPlane` made itself: its stop removes them (a caller's stays)."""


def _fresh_work_dir() -> Path:
    made = Path(tempfile.mkdtemp(prefix="lj-cluster-"))
    _MADE_WORK_DIRS.add(made)
    return made


@dataclass
class ControlPlane:
    """A local control plane in ``work_dir`` (a fresh temp dir when not given, removed at stop)."""

    work_dir: Path = field(default_factory=_fresh_work_dir)
    start_deadline_s: float = 90.0
    processes: list[BinaryProcess] = field(default_factory=list)
    apiserver_port: int = 0
    scheduler_client: tuple[float, int] | None = None
    """kube-scheduler's client (QPS, burst), written to its KubeSchedulerConfiguration; None
    keeps its defaults (50, 100)."""
    node_network: bool = False
    """Claim a host bridge for real nodes and let the apiserver serve them there."""
    watch_cache: bool = False
    """The apiserver's watch cache (on in production). Off by default: an idle apiserver with
    it spends about 6 % of a core keeping ~70 resource caches in step with etcd, against about
    2 % without (measured on 1.37.2, two cores), and `make test` keeps three or four control
    planes running at once. Clients see the same API either way (lists and watches are served
    from etcd instead); benchmarks turn it on, so that their figures are a production
    apiserver's, and so does `make cluster-up`."""
    bridge: HostBridge | None = None
    kubeconfig: Path = field(init=False)
    logs_dir: Path = field(init=False)
    pki: Pki = field(init=False)

    def __post_init__(self) -> None:
        self.kubeconfig = self.work_dir / "admin.kubeconfig"
        self.logs_dir = self.work_dir / "logs"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    def start(self) -> None:
        started = time.monotonic()
        atexit.register(self.stop)
        _exit_on_sigterm()
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        log.info(
            "control_plane_ready",
            kubeconfig=str(self.kubeconfig),
            logs=str(self.logs_dir),
            start_s=round(time.monotonic() - started, 2),
        )

    def _start(self) -> None:
        bins = binaries_dir()
        if self.node_network and self.bridge is None:
            self.bridge = HostBridge.claim()
        extra_ips = (self.bridge.ip,) if self.bridge else ()
        self.pki = write_pki(self.work_dir / "pki", extra_ips=extra_ips)
        self.apiserver_port = free_port()
        write_kubeconfig(self.kubeconfig, self.server, self.pki)
        etcd = self._etcd(bins)
        wait_until(
            "etcd healthy",
            lambda: _http_ok(f"{etcd}/health"),
            self.start_deadline_s,
            watched=self.processes,
        )
        self._apiserver(bins, etcd)
        client = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        client.load_cert_chain(str(self.pki.admin_cert), str(self.pki.admin_key))
        wait_until(
            "kube-apiserver ready",
            lambda: _https_ok(f"{self.server}/readyz", client),
            self.start_deadline_s,
            watched=self.processes,
        )
        checks = self._controllers(bins)
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE
        for name, url in checks.items():
            wait_until(
                f"{name} healthy",
                functools.partial(_healthy, url, insecure),
                self.start_deadline_s,
                watched=self.processes,
            )

    def _spawn(self, name: str, argv: list[str]) -> BinaryProcess:
        proc = BinaryProcess(name, argv, self.logs_dir / f"{name}.log")
        self.processes.append(proc)
        proc.start()
        return proc

    def _etcd(self, bins: Path) -> str:
        client, peer = free_port(), free_port()
        url = f"http://127.0.0.1:{client}"
        self._spawn(
            "etcd",
            [
                str(bins / "etcd"),
                f"--data-dir={self.work_dir / 'etcd'}",
                f"--listen-client-urls={url}",
                f"--advertise-client-urls={url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=default=http://127.0.0.1:{peer}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        return url

    def _apiserver(self, bins: Path, etcd: str) -> None:
        pki = self.pki
        node_args: list[str] = []
        if self.bridge is not None:
            # Nodes in their own network namespaces dial the bridge address; the apiserver binds
            # one address only, so all of them. It reaches kubelets (logs, exec) as an admin.
            node_args = [
                f"--kubelet-client-certificate={pki.admin_cert}",
                f"--kubelet-client-key={pki.admin_key}",
                # Node names do not resolve here; their InternalIP (the veth address) does.
                "--kubelet-preferred-address-types=InternalIP,Hostname",
            ]
        self._spawn(
            "kube-apiserver",
            [
                str(bins / "kube-apiserver"),
                f"--etcd-servers={etcd}",
                f"--bind-address={'0.0.0.0' if self.bridge else '127.0.0.1'}",
                *node_args,
                "--advertise-address=127.0.0.1",
                # Loopback may not be a Service endpoint; nothing in the cluster dials it anyway.
                "--endpoint-reconciler-type=none",
                f"--secure-port={self.apiserver_port}",
                f"--cert-dir={self.work_dir / 'apiserver-certs'}",
                f"--tls-cert-file={pki.serving_cert}",
                f"--tls-private-key-file={pki.serving_key}",
                f"--client-ca-file={pki.ca_cert}",
                "--authorization-mode=Node,RBAC",
                f"--service-account-key-file={pki.sa_pub}",
                f"--service-account-signing-key-file={pki.sa_key}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--allow-privileged=true",
                "--enable-priority-and-fairness=false",
                FEATURE_GATES,
                RUNTIME_CONFIG,
                "--profiling=false",
                f"--watch-cache={'true' if self.watch_cache else 'false'}",
                "--v=1",
            ],
        )

    def _controllers(self, bins: Path) -> dict[str, str]:
        pki, kubeconfig = self.pki, str(self.kubeconfig)
        kcm_port, sched_port, kwok_port = free_port(), free_port(), free_port()
        common = [
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            "--leader-elect=false",
            FEATURE_GATES,
            "--v=1",
        ]
        self._spawn(
            "kube-controller-manager",
            [
                str(bins / "kube-controller-manager"),
                *common,
                f"--secure-port={kcm_port}",
                f"--cert-dir={self.work_dir / 'kcm-certs'}",
                "--controllers=*",
                f"--service-account-private-key-file={pki.sa_key}",
                f"--root-ca-file={pki.ca_cert}",
                f"--cluster-signing-cert-file={pki.ca_cert}",
                f"--cluster-signing-key-file={pki.ca_key}",
                "--use-service-account-credentials=true",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--concurrent-job-syncs=20",
            ],
        )
        sched_config: list[str] = []
        if self.scheduler_client is not None:
            qps, burst = self.scheduler_client
            config = self.work_dir / "kube-scheduler-config.yaml"
            config.write_text(
                "apiVersion: kubescheduler.config.k8s.io/v1\n"
                "kind: KubeSchedulerConfiguration\n"
                "leaderElection: {leaderElect: false}\n"
                f"clientConnection: {{kubeconfig: {kubeconfig}, qps: {qps}, burst: {burst}}}\n"
            )
            sched_config = [f"--config={config}"]
        self._spawn(
            "kube-scheduler",
            [
                str(bins / "kube-scheduler"),
                *common,
                *sched_config,
                f"--secure-port={sched_port}",
                f"--cert-dir={self.work_dir / 'scheduler-certs'}",
            ],
        )
        stages = self.work_dir / "kwok-stages.yaml"
        stages.write_text(stages_yaml())
        self._spawn(
            "kwok",
            [
                str(bins / "kwok"),
                f"--kubeconfig={kubeconfig}",
                f"--config={stages}",
                f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
                "--node-lease-duration-seconds=40",
                f"--server-address=127.0.0.1:{kwok_port}",
                "--cidr=10.244.0.0/16",
                "--node-ip=10.250.0.1",
            ],
        )
        return {
            "kube-controller-manager": f"https://127.0.0.1:{kcm_port}/healthz",
            "kube-scheduler": f"https://127.0.0.1:{sched_port}/healthz",
            "kwok": f"http://127.0.0.1:{kwok_port}/healthz",
        }

    def log_tails(self, lines: int = 15) -> str:
        """The last lines of every binary's log, for a failed test's report."""
        return "\n".join(
            f"----- {p.name} ({p.log_path}) -----\n{p.tail(lines)}" for p in self.processes
        )

    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    def stop(self) -> None:
        """Stop every binary, the latest started first; safe to call twice."""
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)
        # SIGTERM to all first, then wait: the grace periods overlap. One after another, five
        # binaries slow to stop on a loaded machine took up to 50 s (a CI run's SIGTERM test
        # waited 60 s for the holder and failed once).
        for proc in reversed(self.processes):
            proc.terminate()
        for proc in reversed(self.processes):
            proc.stop()
        if self.bridge is not None:
            self.bridge.release()
        if self.work_dir in _MADE_WORK_DIRS:
            shutil.rmtree(self.work_dir, ignore_errors=True)
            _MADE_WORK_DIRS.discard(self.work_dir)
        log.info("control_plane_stopped", work_dir=str(self.work_dir))
