"""Throughput and latency of lj-runtimekit-scheduler against kube-scheduler, same cluster.

For each client setting (QPS/burst, given to both schedulers: kube-scheduler through its
KubeSchedulerConfiguration, ours through --kube-api-qps/--kube-api-burst) one local control
plane with KWOK GPU nodes. Each phase creates the same pods, first for kube-scheduler, then
(once those are deleted) for ours, on the same nodes, and times create → bound from a watch:
single-GPU pods, mixed shared/whole pods, then gangs (pod-group annotations; kube-scheduler,
which has no gangs, places the same pods one by one), then one-GPU pods of which a third carry
required pod anti-affinity (one per node within their group), a third a rack spread constraint,
and of the rest half a claim bound to a rack's PV and half a WaitForFirstConsumer claim with
local PVs to choose from (issue 35; ``lj_runtimekit_testkit.bench.volumes``), then preemption:
the pool full of low-priority pods, the timed pods high-priority whole GPUs, the victims counted
against those needed (``lj_runtimekit_testkit.bench.preemption``). Each phase reports both
schedulers' peak RSS during it. Each node count (``--nodes 2000,5000``) gets its own control
planes. Then the DRA case (issue 24), on one more control plane: the same one-GPU pods on the
classic path and through DRA, see ``lj_runtimekit_testkit.bench.scheduler.dra_case``. Then the
PodGroup case (issue 35), one more control plane per node count: gangs as upstream PodGroups
(``scheduling.k8s.io/v1beta1``, gang policy), placed all or nothing by kube-scheduler's own gang
scheduling and by ours, see ``lj_runtimekit_testkit.bench.scheduler.podgroup_case``.

    .venv/bin/python components/scheduler/bench/run.py --out build/bench [--nodes 2000,5000]
    .venv/bin/python components/scheduler/bench/run.py --out build/bench --cases dra
    .venv/bin/python components/scheduler/bench/run.py --out build/bench --cases podgroups
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kubernetes import client

from lj_runtimekit_testkit.bench import Figure, volumes, write
from lj_runtimekit_testkit.bench.kwok import phase, rss_peak_mib, rss_reset
from lj_runtimekit_testkit.bench.preemption import install_priorities
from lj_runtimekit_testkit.bench.scheduler import podgroup_case
from lj_runtimekit_testkit.bench.scheduler.dra_case import run_dra
from lj_runtimekit_testkit.bench.scheduler.phases import POOL, Plan, phases
from lj_runtimekit_testkit.bench.scheduler.podgroup_case import run_podgroups
from lj_runtimekit_testkit.bench.scheduler.pool import (
    OURS,
    THEIRS,
    install_crd,
    make_nodes,
    start_ours,
)
from lj_runtimekit_testkit.cluster.handle import Cluster
from lj_runtimekit_testkit.cluster.launcher import ControlPlane


def timed(cluster: Cluster, n: int, plan: Plan, pid: int, deadline: float) -> dict[str, float]:
    """One phase under one scheduler (process ``pid``), with that scheduler's peak RSS in it."""
    rss_reset(pid)
    r = phase(
        cluster,
        n,
        plan.create,
        deadline,
        setup=plan.setup,
        cleanup=plan.cleanup,
        report=plan.report,
    )
    return {**r, "rss_peak_mib": rss_peak_mib(pid)}


FIGURES = (
    *podgroup_case.FIGURES,
    ("victims", "victims", "pods"),
    ("victims needed", "victims_needed", "pods"),
    ("victims beyond need", "victims_excess", "pods"),
    ("victim nodes no preemptor took", "victim_nodes_untaken", "nodes"),
)
"""The PodGroup case's figures (the phases' own) and the preemption phase's victims."""


def run(args: argparse.Namespace, n_nodes: int, qps: float, burst: int) -> list[Figure]:
    """One control plane with ``n_nodes`` nodes whose two schedulers both use client
    ``qps``/``burst``."""
    work = Path(tempfile.mkdtemp(prefix="lj-sched-bench-"))
    cp = ControlPlane(work_dir=work, scheduler_client=(qps, burst), watch_cache=True)
    cp.start()
    ours: subprocess.Popen[bytes] | None = None
    client_label = f"client {qps:g}/{burst}"
    try:
        cluster = Cluster.from_control_plane(cp)
        install_crd(cluster)
        began = time.monotonic()
        nodes = make_nodes(cluster, n_nodes, POOL)
        print(f"bench: {n_nodes} nodes in {time.monotonic() - began:.0f} s", flush=True)
        with cluster.api_client() as api:
            volumes.install_classes(api)
            install_priorities(api)
            core: Any = client.CoreV1Api(api)
            listed = core.list_node(label_selector=f"bench-pool={POOL}").items
            racks = sorted({n.metadata.labels[volumes.RACK] for n in listed})
        ours = start_ours(cluster, qps, burst, work / "ours.log")
        theirs_pid = next(p.pid for p in cp.processes if p.name == "kube-scheduler")
        figures = [
            Figure(
                f"peak RSS before the phases, {n_nodes} nodes, {client_label}",
                rss_peak_mib(ours.pid),
                "MiB",
                rss_peak_mib(theirs_pid),
                "kube-scheduler",
            )
        ]
        results: dict[str, dict[str, float]] = {}
        for label, n, plan in phases(args, nodes, racks):
            began = time.monotonic()
            t = timed(cluster, n, plan(THEIRS), theirs_pid, args.deadline)
            o = timed(cluster, n, plan(OURS), ours.pid, args.deadline)
            results[f"{label} theirs"], results[f"{label} ours"] = t, o
            print(f"bench: {label} in {time.monotonic() - began:.0f} s", flush=True)
            where = f"{n} {label} pods, {n_nodes} nodes, {client_label}"
            figures += [
                Figure(f"{what}, {where}", o[key], unit, t[key], "kube-scheduler")
                for what, key, unit in FIGURES
                if key in o
            ]
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
    ap.add_argument(
        "--nodes",
        default="2000,5000",
        help="KWOK nodes (8 GPUs each), comma-separated: each count gets its own control planes",
    )
    ap.add_argument("--pods", type=int, default=8000, help="single-GPU pods")
    ap.add_argument("--mixed", type=int, default=1000, help="mixed shared/whole pods")
    ap.add_argument("--gangs", type=int, default=20, help="gangs")
    ap.add_argument("--gang-size", type=int, default=32, help="pods per gang")
    ap.add_argument(
        "--constrained",
        type=int,
        default=3000,
        help="pods of the constrained phase (a third with required anti-affinity, a third "
        "spread over racks, a sixth with a bound claim, a sixth with a WaitForFirstConsumer "
        "claim; issue 35); 0 skips it",
    )
    ap.add_argument(
        "--preemptors",
        type=int,
        default=400,
        help="high-priority 1-GPU pods of the preemption phase, into the pool full of "
        "low-priority pods; 0 skips it",
    )
    ap.add_argument(
        "--filler-gpus",
        type=int,
        default=4,
        choices=(1, 2, 4, 8),
        help="GPUs of each low-priority pod filling the pool in the preemption phase",
    )
    ap.add_argument(
        "--clients",
        default="50/100,5000/5000",
        help="client QPS/burst settings, comma-separated; each gets its own control plane "
        "(kube-scheduler's defaults are 50/100)",
    )
    ap.add_argument("--deadline", type=float, default=900, help="seconds per phase at most")
    ap.add_argument(
        "--cases",
        default="classic,dra,podgroups",
        help="comma-separated: classic (the phases above, per node count and client setting), "
        "dra (DRA against the classic path), podgroups (gangs as upstream PodGroups under both "
        "schedulers' gang scheduling, per node count); the JSON holds the figures of this run "
        "only",
    )
    ap.add_argument("--dra-nodes", type=int, default=100, help="DRA case: nodes per pool")
    ap.add_argument("--dra-pods", type=int, default=200, help="DRA case: 1-GPU pods per phase")
    ap.add_argument(
        "--dra-client",
        default="5000/5000",
        help="DRA case: client QPS/burst of both schedulers (upstream scheduler_perf's setting)",
    )
    ap.add_argument(
        "--podgroup-client",
        default="5000/5000",
        help="PodGroup case: client QPS/burst of both schedulers",
    )
    args = ap.parse_args()
    cases = set(args.cases.split(","))
    if unknown := cases - {"classic", "dra", "podgroups"}:
        ap.error(f"unknown cases {sorted(unknown)}: use classic, dra, podgroups")
    figures = []
    if "classic" in cases:
        for n_nodes in args.nodes.split(","):
            for setting in args.clients.split(","):
                qps, burst = setting.split("/")
                figures += run(args, int(n_nodes), float(qps), int(burst))
    if "dra" in cases:
        figures += run_dra(args)
    if "podgroups" in cases:
        for n_nodes in args.nodes.split(","):
            figures += run_podgroups(args, int(n_nodes))
    path = write(args.out, "scheduler", figures)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
