"""Throughput and latency of lj-runtimekit-scheduler against kube-scheduler, same cluster.

One local control plane (the harness's, with kube-scheduler at its default client QPS 50 /
burst 100) and KWOK GPU nodes in two equal pools, one per scheduler, so neither sees the
other's pods as competition for the same GPUs. Each phase creates the same pods for both
(pinned to their pool by nodeSelector) and times create → bound from a watch.

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
            resp = self.core.list_namespaced_pod(
                self.namespace, watch=True, timeout_seconds=30, _preload_content=False
            )
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
                    break
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


def pod_body(name: str, scheduler: str, pool: str, limits: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
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
    cluster: Cluster, scheduler: str, pool: str, shapes: list[dict[str, str]], deadline_s: float
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
        end = start + deadline_s
        while len(watch.bound) < len(shapes) and time.monotonic() < end:
            time.sleep(0.2)
        watch.stop.set()
        done = sorted(watch.bound.values())
        lat = sorted(watch.bound[n] - created[n] for n in watch.bound)
        # free the pool for the next phase
        core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
        while core.list_namespaced_pod(ns, limit=1).items:
            time.sleep(0.5)
    span = (done[-1] - start) if done else float("inf")
    return {
        "pods_per_s": len(done) / span if done else 0.0,
        "bound": float(len(done)),
        "p50_s": statistics.median(lat) if lat else 0.0,
        "p99_s": lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else 0.0,
    }


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", type=Path, required=True, help="folder of <component>.json")
    ap.add_argument("--nodes", type=int, default=1000, help="KWOK nodes per scheduler pool")
    ap.add_argument("--pods", type=int, default=8000, help="single-GPU pods per scheduler")
    ap.add_argument("--mixed", type=int, default=1000, help="mixed shared/whole pods")
    ap.add_argument("--qps", type=float, default=50, help="our client QPS (kube-scheduler: 50)")
    ap.add_argument("--burst", type=int, default=100, help="our client burst (theirs: 100)")
    ap.add_argument("--deadline", type=float, default=900, help="seconds per phase at most")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lj-sched-bench-"))
    cp = ControlPlane(work_dir=work)
    cp.start()
    ours: subprocess.Popen[bytes] | None = None
    try:
        cluster = Cluster.from_control_plane(cp)
        with cluster.api_client() as api:
            client.ApiextensionsV1Api(api).create_custom_resource_definition(
                yaml.safe_load(CRD.read_text())
            )
        time.sleep(2)
        for pool in ("kube", "ours"):
            make_nodes(cluster, args.nodes, pool)
        ours = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "lj_runtimekit_scheduler",
                "--kubeconfig",
                cluster.kubeconfig,
                "--no-leader-elect",
                "--metrics-port",
                "0",
                "--log-level",
                "warning",
                "--qps",
                str(args.qps),
                "--burst",
                str(args.burst),
            ],
            stderr=open(work / "ours.log", "wb"),  # noqa: SIM115
        )
        time.sleep(5)
        theirs_pid = next(p.pid for p in cp.processes if p.name == "kube-scheduler")
        single = [{"aliyun.com/gpu": "1"}] * args.pods
        mixed = [
            {"aliyun.com/gpu": "2"}
            if i % 2
            else {"aliyun.com/gpu-core": "25", "aliyun.com/gpu-memory": "10"}
            for i in range(args.mixed)
        ]
        results: dict[str, dict[str, float]] = {}
        for label, shapes in (("single-GPU", single), ("mixed", mixed)):
            results[f"{label} theirs"] = phase(cluster, THEIRS, "kube", shapes, args.deadline)
            results[f"{label} ours"] = phase(cluster, OURS, "ours", shapes, args.deadline)
        figures = []
        for label, n in (("single-GPU", args.pods), ("mixed", args.mixed)):
            o, t = results[f"{label} ours"], results[f"{label} theirs"]
            where = f"{n} {label} pods, {args.nodes} nodes"
            figures += [
                Figure(
                    f"pods/s, {where}", o["pods_per_s"], "pods/s", t["pods_per_s"], "kube-scheduler"
                ),
                Figure(f"p50 create→bound, {where}", o["p50_s"], "s", t["p50_s"], "kube-scheduler"),
                Figure(f"p99 create→bound, {where}", o["p99_s"], "s", t["p99_s"], "kube-scheduler"),
                Figure(f"pods bound, {where}", o["bound"], "pods", t["bound"], "kube-scheduler"),
            ]
        figures.append(
            Figure(
                "peak RSS",
                rss_peak_mib(ours.pid),
                "MiB",
                rss_peak_mib(theirs_pid),
                "kube-scheduler",
            )
        )
        path = write(args.out, "scheduler", figures)
        print(json.dumps(results, indent=1))
        print(f"wrote {path}")
        return 0
    finally:
        if ours is not None:
            ours.terminate()
            ours.wait(10)
        cp.stop()
        os.sync()


if __name__ == "__main__":
    sys.exit(main())
