"""PID 1 of a real node: ``python -m lj_runtimekit_testkit.node.supervisor SPEC.json``, started by
``unshare --mount --uts --ipc --net --pid --fork --mount-proc``.

It holds the node's namespaces: makes the private mounts the spec lists (its own /etc, /run,
/var/lib, /var/log, /usr/local, fake sysctl files, optionally /dev), configures the node's network
once the host has moved the veth in, then runs the node's services (containerd, kubelet, the
runtime simulator) and restarts any of them that exits, as systemd would. It reaps every orphan
(containerd's shims are reparented to it). Requests come on a unix socket, one line each:
``start|stop|restart|is-active <service>`` and ``status``; the ``systemctl`` shim on the node
speaks it, so ``nsenter --target 1 ... systemctl restart containerd`` from a hostPID pod works.

SIGTERM stops the services (kubelet first) and exits; the kernel then kills whatever else runs in
the node's PID namespace (pods, shims).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CONTROL_SOCKET = "/run/lj-node/control.sock"
_RESTART_DELAY_S = 1.0
_STOP_GRACE_S = 15.0


_say_lock = threading.Lock()


def say(event: str, **kv: object) -> None:
    """One log line on stdout (the host keeps it in the node's supervisor.log)."""
    fields = " ".join(f"{k}={v}" for k, v in kv.items())
    line = f"{time.strftime('%H:%M:%S')} supervisor {event} {fields}".rstrip() + "\n"
    with _say_lock:
        sys.stdout.write(line)
        sys.stdout.flush()


class SetupError(RuntimeError):
    """A step of the node's setup failed; the message names the step and the cause."""


def sh(argv: list[str], what: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SetupError(
            f"{what}: `{' '.join(argv)}` exited {proc.returncode}: {proc.stderr.strip()}"
        )


# ---------------------------------------------------------------------------- mounts and network


def apply_mounts(spec: dict[str, Any]) -> None:
    for m in spec["mounts"]:
        target = m["target"]
        kind = m["type"]
        if kind == "bind":
            sh(["mount", "--bind", m["source"], target], f"bind {m['source']} on {target}")
        elif kind == "overlay":
            opts = f"lowerdir={m['lower']},upperdir={m['upper']},workdir={m['work']}"
            sh(["mount", "-t", "overlay", "overlay", "-o", opts, target], f"overlay on {target}")
        elif kind == "tmpfs":
            os.makedirs(target, exist_ok=True)
            sh(
                ["mount", "-t", "tmpfs", "-o", m.get("options", "mode=755"), "tmpfs", target],
                f"tmpfs on {target}",
            )
        elif kind in ("devpts", "mqueue"):
            os.makedirs(target, exist_ok=True)
            sh(
                ["mount", "-t", kind, "-o", m.get("options", "rw"), kind, target],
                f"{kind} on {target}",
            )
        else:
            raise SetupError(f"unknown mount type {kind!r} for {target}")
    for d in spec.get("devices", []):
        path = d["path"]
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        try:
            os.mknod(
                path,
                0o666 | (0o020000 if d.get("kind", "c") == "c" else 0o060000),
                os.makedev(d["major"], d["minor"]),
            )
            os.chmod(path, 0o666)
        except OSError as e:
            raise SetupError(f"mknod {path} ({d['major']}:{d['minor']}): {e}") from e
    for link, target in spec.get("symlinks", {}).items():
        with contextlib.suppress(FileExistsError):
            os.symlink(target, link)
    for node_path, host_file in spec.get("sysctl_files", {}).items():
        sh(["mount", "--bind", host_file, node_path], f"fake sysctl {node_path}")
    say("mounts_ready", count=len(spec["mounts"]))


def wait_interface(name: str, deadline_s: float) -> None:
    deadline = time.monotonic() + deadline_s
    while True:
        devs = Path("/proc/net/dev").read_text()
        if any(line.strip().startswith(f"{name}:") for line in devs.splitlines()):
            return
        if time.monotonic() > deadline:
            raise SetupError(
                f"interface {name} did not appear in the node's network namespace within "
                f"{deadline_s:.0f} s: the host creates it (ip link add ... netns <pid>)"
            )
        time.sleep(0.02)


def apply_network(net: dict[str, Any]) -> None:
    wait_interface(net["interface"], 30.0)
    iface, gw = net["interface"], net["gateway"]
    sh(["ip", "link", "set", "lo", "up"], "bring lo up")
    sh(["ip", "addr", "add", f"{net['ip']}/{net['prefixlen']}", "dev", iface], f"address {iface}")
    sh(["ip", "link", "set", iface, "up"], f"bring {iface} up")
    # Only the Service range leaves through the host, to reach the apiserver: no default route.
    sh(["ip", "route", "add", net["service_cidr"], "via", gw, "dev", iface], "route to Services")
    Path("/proc/sys/net/ipv4/ip_forward").write_text("1\n")  # this netns only
    # kube-proxy's job for the one Service the node needs: `kubernetes` -> the apiserver.
    dnat = [
        "-d",
        f"{net['service_ip']}/32",
        "-p",
        "tcp",
        "--dport",
        "443",
        "-j",
        "DNAT",
        "--to-destination",
        net["apiserver"],
    ]
    for chain in ("PREROUTING", "OUTPUT"):
        sh(
            ["iptables", "-w", "-t", "nat", "-A", chain, *dnat],
            f"DNAT kubernetes Service ({chain})",
        )
    say("network_ready", ip=net["ip"], apiserver=net["apiserver"])


# ---------------------------------------------------------------------------------- services


@dataclass
class Service:
    name: str
    argv: list[str]
    log: str
    health: dict[str, str]
    env: dict[str, str]
    pid: int = 0
    wanted: bool = False
    restarts: int = 0
    last_exit: int | None = None
    restart_at: float = 0.0
    exited: threading.Condition = field(default_factory=threading.Condition)

    def healthy(self) -> bool:
        kind, target = self.health.get("kind", ""), self.health.get("target", "")
        if kind == "unix":
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(1.0)
                try:
                    s.connect(target)
                except OSError:
                    return False
                return True
        if kind == "http":
            try:
                with urllib.request.urlopen(target, timeout=1.0) as resp:
                    return bool(resp.status == 200)
            except OSError:
                return False
        return self.pid > 0


class Supervisor:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.phase = "starting"
        self.services = {
            name: Service(name, s["argv"], s["log"], s.get("health", {}), s.get("env", {}))
            for name, s in spec["services"].items()
        }
        self.lock = threading.RLock()
        self.stopping = False

    # -- processes

    def _spawn(self, svc: Service) -> None:
        os.makedirs(os.path.dirname(svc.log), exist_ok=True)
        fd = os.open(svc.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            svc.pid = os.posix_spawn(
                svc.argv[0],
                svc.argv,
                {**self.spec.get("env", {}), **svc.env},
                file_actions=[
                    (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                    (os.POSIX_SPAWN_DUP2, fd, 1),
                    (os.POSIX_SPAWN_DUP2, fd, 2),
                ],
                setsid=True,
                setsigmask=(),
                setsigdef=(signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGPIPE),
            )
        finally:
            os.close(fd)
        say("service_started", service=svc.name, pid=svc.pid)

    def start(self, name: str, deadline_s: float = 60.0) -> None:
        svc = self._service(name)
        with self.lock:
            svc.wanted = True
            if svc.pid == 0:
                self._spawn(svc)
        self._wait_healthy(svc, deadline_s)

    def stop(self, name: str) -> None:
        svc = self._service(name)
        with self.lock:
            svc.wanted = False
            pid = svc.pid
        if pid == 0:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        with svc.exited:
            if not svc.exited.wait_for(lambda: svc.pid != pid, _STOP_GRACE_S):
                say("service_killed", service=name, pid=pid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                svc.exited.wait_for(lambda: svc.pid != pid, _STOP_GRACE_S)
        say("service_stopped", service=name, pid=pid)

    def restart(self, name: str) -> None:
        self.stop(name)
        self.start(name)

    def _wait_healthy(self, svc: Service, deadline_s: float) -> None:
        deadline = time.monotonic() + deadline_s
        while not svc.healthy():
            if svc.pid == 0 and not svc.wanted:
                raise SetupError(f"{svc.name} was stopped while starting")
            if time.monotonic() > deadline:
                raise SetupError(
                    f"{svc.name} not healthy within {deadline_s:.0f} s "
                    f"(pid {svc.pid}, last exit {svc.last_exit}); see {svc.log}"
                )
            time.sleep(0.05)

    def _service(self, name: str) -> Service:
        name = name.removesuffix(".service")
        if name not in self.services:
            raise SetupError(f"unknown service {name!r} (known: {', '.join(self.services)})")
        return self.services[name]

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            for svc in self.services.values():
                if svc.pid == pid:
                    code = os.waitstatus_to_exitcode(status)
                    with svc.exited:
                        svc.pid, svc.last_exit = 0, code
                        svc.exited.notify_all()
                    say("service_exited", service=svc.name, pid=pid, code=code)
                    if svc.wanted and not self.stopping:
                        svc.restarts += 1
                        svc.restart_at = time.monotonic() + _RESTART_DELAY_S

    def restart_due(self) -> None:
        now = time.monotonic()
        with self.lock:
            for svc in self.services.values():
                if svc.wanted and svc.pid == 0 and svc.restart_at and now >= svc.restart_at:
                    svc.restart_at = 0.0
                    self._spawn(svc)

    def status(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "services": {
                s.name: {
                    "active": s.pid != 0,
                    "wanted": s.wanted,
                    "pid": s.pid,
                    "restarts": s.restarts,
                    "last_exit": s.last_exit,
                }
                for s in self.services.values()
            },
        }

    # -- control socket

    def handle(self, line: str) -> str:
        words = line.split()
        if words == ["status"]:
            return json.dumps(self.status())
        if len(words) != 2:
            usage = "`<start|stop|restart|is-active> <service>` or `status`"
            return f"error: expected {usage}, got {line!r}"
        verb, name = words
        try:
            if verb == "is-active":
                svc = self._service(name)
                return "active" if svc.pid else ("activating" if svc.wanted else "inactive")
            if verb == "start":
                self.start(name)
            elif verb == "stop":
                self.stop(name)
            elif verb == "restart":
                self.restart(name)
            else:
                return f"error: unknown verb {verb!r}"
        except SetupError as e:
            return f"error: {e}"
        say("request_done", request=line)
        return "ok"

    def serve_control(self) -> None:
        os.makedirs(os.path.dirname(CONTROL_SOCKET), exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(CONTROL_SOCKET)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(CONTROL_SOCKET)
        server.listen(16)

        def one(conn: socket.socket) -> None:
            with conn, conn.makefile("rw") as f:
                line = f.readline().strip()
                f.write(self.handle(line) + "\n")
                f.flush()

        def loop() -> None:
            while True:
                conn, _ = server.accept()
                threading.Thread(target=one, args=(conn,), daemon=True).start()

        threading.Thread(target=loop, name="control", daemon=True).start()

    # -- lifecycle

    def boot(self) -> None:
        apply_mounts(self.spec)
        self.serve_control()
        self.phase = "network"
        apply_network(self.spec["network"])
        self.phase = "services"
        for name in self.spec.get("autostart", []):
            self.start(name)
        self.phase = "running"
        say("running", services=",".join(self.spec.get("autostart", [])))

    def shutdown(self) -> None:
        self.stopping = True
        self.phase = "stopping"
        for name in reversed(list(self.spec["services"])):
            self.stop(name)


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[1]).read_text())
    if os.getpid() != 1:
        say("warning_not_pid1", pid=os.getpid())
    with contextlib.suppress(OSError):
        socket.sethostname(spec["name"])
    # Signals are taken synchronously by the main loop; threads and children must not get them
    # (children get a clean mask through posix_spawn).
    signals = {signal.SIGCHLD, signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    sup = Supervisor(spec)
    booted = threading.Event()
    failure: list[Exception] = []

    def boot() -> None:
        try:
            sup.boot()
        except Exception as e:  # noqa: BLE001 - reported by the main loop, which then exits
            failure.append(e)
        finally:
            booted.set()

    threading.Thread(target=boot, name="boot", daemon=True).start()
    while True:
        info = signal.sigtimedwait(signals, 0.2)
        if info is not None and info.si_signo in (signal.SIGTERM, signal.SIGINT):
            say("stopping", signal=signal.Signals(info.si_signo).name)
            threading.Thread(target=sup.shutdown, daemon=True).start()
            _drain_until(sup, signals)
            return 0
        sup.reap()
        if failure:
            say("setup_failed", error=str(failure[0]))
            print(f"node setup failed: {failure[0]}", file=sys.stderr, flush=True)
            sup.stopping = True
            for svc in sup.services.values():
                if svc.pid:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(svc.pid, signal.SIGKILL)
            return 1
        if booted.is_set():
            sup.restart_due()


def _drain_until(sup: Supervisor, signals: set[signal.Signals]) -> None:
    """Keep reaping while the services stop, so stop() sees them exit."""
    deadline = time.monotonic() + 3 * _STOP_GRACE_S
    while time.monotonic() < deadline:
        signal.sigtimedwait(signals, 0.1)
        sup.reap()
        if all(s.pid == 0 for s in sup.services.values()):
            return


if __name__ == "__main__":
    sys.exit(main(sys.argv))
