"""Throughput and latency of lj-runtimekit-scheduler against kube-scheduler, same cluster.

For each client setting (QPS/burst, given to both schedulers: kube-scheduler through its
KubeSchedulerConfiguration, ours through --kube-api-qps/--kube-api-burst) one local control
plane with KWOK GPU nodes. Each phase creates the same pods, first for kube-scheduler, then
(once those are deleted) for ours, on the same nodes, and times create → bound from a watch:
single-GPU pods, mixed shared/whole pods, then gangs (pod-group annotations; kube-scheduler,
which has no gangs, places the same pods one by one).

    .venv/bin/python components/scheduler/bench/run.py --out build/bench [--nodes 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from lj_runtimekit_testkit.bench import Figure, write
from lj_runtimekit_testkit.cluster.handle import Cluster
from lj_runtimekit_testkit.cluster.launcher import ControlPlane

ROOT = Path(__file__).resolve().parents[3]
CRD = ROOT / "deploy" / "crds" / "nodedevices.lj-runtimekit.aliyun.com.yaml"
OURS, THEIRS = "lj-runtimekit-scheduler", "default-scheduler"
POOL = "bench"
GROUP = "lj-runtimekit-scheduler/pod-group"
GROUP_SIZE = "lj-runtimekit-scheduler/pod-group-size"


class BoundWatch:
    """Records when each pod of a namespace is first seen with a node (raw watch, no models)."""

    def __init__(self, core: Any, namespace: str) -> None:
        self.core, self.namespace = core, namespace
        self.bound: dict[str, float] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                self._watch_once()
            except Exception as e:  # noqa: BLE001 - a broken watch is opened again
                if self.stop.is_set():
                    return  # the phase is over: the apiserver may be gone already
                print(f"bench: pod watch broke ({e!r}), watching again", file=sys.stderr)
                time.sleep(0.5)

    def _watch_once(self) -> None:
        """One watch (a fresh one lists every pod first, so no binding is missed)."""
        resp = self.core.list_namespaced_pod(
            self.namespace, watch=True, timeout_seconds=30, _preload_content=False
        )
        try:
            buf = b""
            for chunk in resp.stream(65536):
                buf += chunk
                *lines, buf = buf.split(b"\n")
                now = time.monotonic()
                for line in lines:
                    if not line.strip():
                        continue
                    obj = json.loads(line)["object"]
                    name = obj["metadata"]["name"]
                    if (obj.get("spec") or {}).get("nodeName") and name not in self.bound:
                        self.bound[name] = now
                if self.stop.is_set():
                    return
        finally:
            resp.release_conn()


def rss_peak_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def make_nodes(cluster: Cluster, n: int, pool: str) -> list[str]:
    names = cluster.create_gpu_nodes(
        n, prefix=f"bench-{pool}", gpus=8, enable=True, labels={"bench-pool": pool}, deadline_s=900
    )
    with cluster.api_client(pool_size=16) as api:
        custom = client.CustomObjectsApi(api)

        def inventory(name: str) -> None:
            body = {
                "apiVersion": "lj-runtimekit.aliyun.com/v1",
                "kind": "NodeDevices",
                "metadata": {"name": name},
                "spec": {"nodeName": name},
            }
            obj: Any = custom.create_cluster_custom_object(
                "lj-runtimekit.aliyun.com", "v1", "nodedevices", body
            )
            obj["status"] = {
                "devices": [
                    {
                        "id": f"gpu-{i}",
                        "kind": "GPU",
                        "index": i,
                        "memoryBytes": 80 * 2**30,
                        "healthy": True,
                        "numaNode": i // 4,
                        "nvlinkIsland": i // 4,
                    }
                    for i in range(8)
                ]
            }
            custom.replace_cluster_custom_object_status(
                "lj-runtimekit.aliyun.com", "v1", "nodedevices", name, obj
            )

        with ThreadPoolExecutor(16) as pool_:
            list(pool_.map(inventory, names))
    return names


Shape = tuple[dict[str, str], dict[str, str]]
"""(resource limits, annotations) of one pod."""


def pod_body(name: str, scheduler: str, pool: str, shape: Shape) -> dict[str, Any]:
    limits, annotations = shape
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "schedulerName": scheduler,
            "restartPolicy": "Never",
            "nodeSelector": {"bench-pool": pool},
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "resources": {"requests": {"cpu": "10m", **limits}, "limits": limits},
                }
            ],
        },
    }


def phase(
    cluster: Cluster, scheduler: str, pool: str, shapes: list[Shape], deadline_s: float
) -> dict[str, float]:
    """Create one pod per shape; returns pods/s, p50/p99 latency (s) and the bound count."""
    ns = f"bench-{uuid.uuid4().hex[:6]}"
    with cluster.api_client(pool_size=32) as api:
        core: Any = client.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": ns}})
        while True:
            try:
                core.read_namespaced_service_account("default", ns)
                break
            except client.exceptions.ApiException:
                time.sleep(0.2)
        watch = BoundWatch(core, ns)
        created: dict[str, float] = {}

        def create(i: int) -> None:
            name = f"p-{i}"
            created[name] = time.monotonic()
            resp = core.create_namespaced_pod(
                ns, pod_body(name, scheduler, pool, shapes[i]), _preload_content=False
            )
            resp.drain_conn()
            resp.release_conn()

        start = time.monotonic()
        with ThreadPoolExecutor(16) as ex:
            list(ex.map(create, range(len(shapes))))
        created_s = time.monotonic() - start
        end = start + deadline_s
        while len(watch.bound) < len(shapes) and time.monotonic() < end:
            time.sleep(0.2)
        watch.stop.set()
        done = sorted(watch.bound.values())
        lat = sorted(watch.bound[n] - created[n] for n in watch.bound)
        # free the pool for the next phase
        for _ in range(10):
            try:
                core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
                break
            except client.exceptions.ApiException as e:
                # 8000 deletions can outlast the apiserver's 60 s request timeout; the deletion
                # goes on server-side, ask again for what is left
                if e.status != 504:
                    raise
        while core.list_namespaced_pod(ns, limit=1).items:
            time.sleep(0.5)
    span = (done[-1] - start) if done else float("inf")
    return {
        "pods_per_s": len(done) / span if done else 0.0,
        # the arrival rate: while binds are held at the client QPS, pods created faster wait
        # longer, so latencies of two phases compare only with their arrival rates alongside
        "created_per_s": len(shapes) / created_s if shapes else 0.0,
        "bound": float(len(done)),
        "p50_s": statistics.median(lat) if lat else 0.0,
        "p99_s": lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else 0.0,
    }


def shapes(args: argparse.Namespace) -> dict[str, list[Shape]]:
    gang = {"aliyun.com/gpu": "8"}
    return {
        "single-GPU": [({"aliyun.com/gpu": "1"}, {})] * args.pods,
        "mixed": [
            ({"aliyun.com/gpu": "2"}, {})
            if i % 2
            else ({"aliyun.com/gpu-core": "25", "aliyun.com/gpu-memory": "10"}, {})
            for i in range(args.mixed)
        ],
        f"gang ({args.gangs}x{args.gang_size}, 8 GPUs each)": [
            (gang, {GROUP: f"gang-{g}", GROUP_SIZE: str(args.gang_size)})
            for g in range(args.gangs)
            for _ in range(args.gang_size)
        ],
    }


def run(args: argparse.Namespace, qps: float, burst: int) -> list[Figure]:
    """One control plane whose two schedulers both use client ``qps``/``burst``."""
    work = Path(tempfile.mkdtemp(prefix="lj-sched-bench-"))
    cp = ControlPlane(work_dir=work, scheduler_client=(qps, burst))
    cp.start()
    ours: subprocess.Popen[bytes] | None = None
    client_label = f"client {qps:g}/{burst}"
    try:
        cluster = Cluster.from_control_plane(cp)
        with cluster.api_client() as api:
            client.ApiextensionsV1Api(api).create_custom_resource_definition(
                yaml.safe_load(CRD.read_text())
            )
        time.sleep(2)
        make_nodes(cluster, args.nodes, POOL)
        ours = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "lj_runtimekit_scheduler",
                "--kubeconfig",
                cluster.kubeconfig,
                "--leader-elect=false",
                "--metrics-bind-address",
                "127.0.0.1:0",
                "--log-level",
                "warning",
                "--kube-api-qps",
                str(qps),
                "--kube-api-burst",
                str(burst),
            ],
            stderr=open(work / "ours.log", "wb"),  # noqa: SIM115
        )
        time.sleep(5)
        theirs_pid = next(p.pid for p in cp.processes if p.name == "kube-scheduler")
        figures = []
        results: dict[str, dict[str, float]] = {}
        for label, pods in shapes(args).items():
            t = phase(cluster, THEIRS, POOL, pods, args.deadline)
            o = phase(cluster, OURS, POOL, pods, args.deadline)
            results[f"{label} theirs"], results[f"{label} ours"] = t, o
            where = f"{len(pods)} {label} pods, {args.nodes} nodes, {client_label}"
            figures += [
                Figure(
                    f"pods/s, {where}", o["pods_per_s"], "pods/s", t["pods_per_s"], "kube-scheduler"
                ),
                Figure(f"p50 create→bound, {where}", o["p50_s"], "s", t["p50_s"], "kube-scheduler"),
                Figure(f"p99 create→bound, {where}", o["p99_s"], "s", t["p99_s"], "kube-scheduler"),
                Figure(f"pods bound, {where}", o["bound"], "pods", t["bound"], "kube-scheduler"),
                Figure(
                    f"pods created/s, {where}",
                    o["created_per_s"],
                    "pods/s",
                    t["created_per_s"],
                    "kube-scheduler",
                ),
            ]
        figures.append(
            Figure(
                f"peak RSS, {client_label}",
                rss_peak_mib(ours.pid),
                "MiB",
                rss_peak_mib(theirs_pid),
                "kube-scheduler",
            )
        )
        print(json.dumps(results, indent=1), flush=True)
        return figures
    finally:
        if ours is not None:
            ours.terminate()
            ours.wait(10)
        cp.stop()
        os.sync()


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", type=Path, required=True, help="folder of <component>.json")
    ap.add_argument("--nodes", type=int, default=1000, help="KWOK nodes, 8 GPUs each")
    ap.add_argument("--pods", type=int, default=8000, help="single-GPU pods")
    ap.add_argument("--mixed", type=int, default=1000, help="mixed shared/whole pods")
    ap.add_argument("--gangs", type=int, default=20, help="gangs")
    ap.add_argument("--gang-size", type=int, default=32, help="pods per gang")
    ap.add_argument(
        "--clients",
        default="50/100,5000/5000",
        help="client QPS/burst settings, comma-separated; each gets its own control plane "
        "(kube-scheduler's defaults are 50/100)",
    )
    ap.add_argument("--deadline", type=float, default=900, help="seconds per phase at most")
    args = ap.parse_args()
    figures = []
    for setting in args.clients.split(","):
        qps, burst = setting.split("/")
        figures += run(args, float(qps), int(burst))
    path = write(args.out, "scheduler", figures)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
