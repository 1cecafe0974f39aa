"""``lj-cluster up --nodes N [--real-nodes M]`` / ``lj-cluster down``: the local control plane in
the background, with N KWOK nodes and M real nodes (kubelet + containerd + runc in private
namespaces, each with the runtime simulator of ``--inventory``; root and Linux only).

``up`` starts a detached supervisor (``lj-cluster serve``), waits until it reports ready in the
state file, and prints the kubeconfig path on its last line. ``down`` stops that supervisor, which
stops the real nodes, then every binary.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from lj_runtimekit_testkit.cluster.handle import Cluster
from lj_runtimekit_testkit.cluster.launcher import ControlPlane
from lj_runtimekit_testkit.cluster.processes import group_alive, process_alive
from lj_runtimekit_testkit.node import RealNodes, host_support


def _default_state_dir() -> Path:
    return Path(tempfile.gettempdir()) / f"lj-cluster-{os.getuid()}"


def _serve(state_dir: Path, nodes: int, real_nodes: int, inventory: str) -> int:
    state = state_dir / "state.json"
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    if real_nodes and (reason := host_support()):
        (state_dir / "error.txt").write_text(f"--real-nodes {real_nodes}: {reason}\n")
        return 1
    control_plane = ControlPlane(
        work_dir=state_dir / "work", node_network=real_nodes > 0, watch_cache=True
    )
    pool = RealNodes(control_plane)
    started = time.monotonic()
    try:
        control_plane.start()
        up_s = time.monotonic() - started
        handle = Cluster.from_control_plane(control_plane)
        t = time.monotonic()
        handle.create_gpu_nodes(nodes, enable=True) if nodes else None
        nodes_s = time.monotonic() - t
        t = time.monotonic()
        for _ in range(real_nodes):
            pool.add(inventory=inventory, private_dev=True)
        real_s = time.monotonic() - t
        state.write_text(
            json.dumps(
                {
                    "pid": os.getpid(),
                    "kubeconfig": str(control_plane.kubeconfig),
                    "logs_dir": str(control_plane.logs_dir),
                    "pids": control_plane.pids() + [n.process_group for n in pool.nodes],
                    "start_s": round(up_s, 2),
                    "nodes": nodes,
                    "nodes_s": round(nodes_s, 2),
                    "real_nodes": [
                        {"name": n.name, "ip": n.ip, "root": str(n.root)} for n in pool.nodes
                    ],
                    "real_nodes_s": round(real_s, 2),
                }
            )
        )
        while not stop.wait(1.0):
            for proc in control_plane.processes:
                proc.check_running()
    except BaseException as e:
        (state_dir / "error.txt").write_text(f"{e}\n{control_plane.log_tails(20)}")
        raise
    finally:
        pool.stop()
        control_plane.stop()
        state.unlink(missing_ok=True)
    return 0


def _up(state_dir: Path, nodes: int, real_nodes: int, inventory: str, deadline_s: float) -> int:
    state = state_dir / "state.json"
    if state.exists():
        info = json.loads(state.read_text())
        if process_alive(info["pid"]):
            print(
                f"a cluster is already up (pid {info['pid']}); `lj-cluster down` first",
                file=sys.stderr,
            )
            print(info["kubeconfig"])
            return 0
        state.unlink()
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / "error.txt").unlink(missing_ok=True)
    log = (state_dir / "supervisor.log").open("ab")
    cmd = [sys.executable, "-m", "lj_runtimekit_testkit.cluster", "--state-dir", str(state_dir)]
    cmd += ["serve", "--nodes", str(nodes), "--real-nodes", str(real_nodes)]
    cmd += ["--inventory", inventory]
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
    )
    deadline = time.monotonic() + deadline_s
    while not state.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            error = state_dir / "error.txt"
            print(
                error.read_text() if error.exists() else f"see {state_dir}/supervisor.log",
                file=sys.stderr,
            )
            proc.terminate()
            return 1
        time.sleep(0.2)
    info = json.loads(state.read_text())
    print(
        f"control plane up in {info['start_s']} s; {nodes} KWOK nodes Ready in {info['nodes_s']} s"
    )
    for node in info.get("real_nodes", []):
        print(f"real node {node['name']} ({node['ip']}): {node['root']}")
    if info.get("real_nodes"):
        print(f"{len(info['real_nodes'])} real nodes Ready in {info['real_nodes_s']} s")
    print(f"logs: {info['logs_dir']}")
    print(info["kubeconfig"])
    return 0


def _down(state_dir: Path, deadline_s: float) -> int:
    state = state_dir / "state.json"
    if not state.exists():
        print("no cluster is up", file=sys.stderr)
        return 0
    info = json.loads(state.read_text())
    pid = int(info["pid"])
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        state.unlink(missing_ok=True)
        return 0
    deadline = time.monotonic() + deadline_s
    while process_alive(pid) or any(group_alive(p) for p in info["pids"]):
        if time.monotonic() > deadline:
            for p in [pid, *info["pids"]]:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p, signal.SIGKILL)
            break
        time.sleep(0.1)
    state.unlink(missing_ok=True)
    print("cluster stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lj-cluster", description=__doc__)
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=_default_state_dir(),
        help="where the state file, the supervisor log and the cluster's files live",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the control plane in the background")
    up.add_argument(
        "--nodes",
        type=int,
        default=0,
        help="KWOK GPU nodes to create (labelled lj_runtimekit_enable=true)",
    )
    real_help = (
        "real nodes to start (kubelet + containerd + runc in private namespaces on a host "
        "bridge, each with the runtime simulator; needs root on Linux and `make k8s-bin`)"
    )
    inventory_help = (
        "the real nodes' runtime simulator inventory (name in tests/inventories or path)"
    )
    up.add_argument("--real-nodes", type=int, default=0, help=real_help)
    up.add_argument("--inventory", default="gpu-8x-nvlink", help=inventory_help)
    up.add_argument("--deadline", type=float, default=600.0, help="seconds to wait for readiness")
    serve = sub.add_parser("serve", help="run the control plane in the foreground (used by up)")
    serve.add_argument("--nodes", type=int, default=0)
    serve.add_argument("--real-nodes", type=int, default=0, help=real_help)
    serve.add_argument("--inventory", default="gpu-8x-nvlink", help=inventory_help)
    down = sub.add_parser("down", help="stop the control plane started by up")
    down.add_argument("--deadline", type=float, default=90.0, help="seconds before SIGKILL")
    args = parser.parse_args(argv)
    if args.command == "up":
        return _up(args.state_dir, args.nodes, args.real_nodes, args.inventory, args.deadline)
    if args.command == "serve":
        return _serve(args.state_dir, args.nodes, args.real_nodes, args.inventory)
    return _down(args.state_dir, args.deadline)


if __name__ == "__main__":
    sys.exit(main())
