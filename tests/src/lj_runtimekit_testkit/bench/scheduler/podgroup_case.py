"""The PodGroup case (issue 35): gangs as upstream PodGroups (``scheduling.k8s.io/v1beta1``,
gang policy) placed all or nothing by kube-scheduler's own gang scheduling and by ours, on a
control plane of its own (see :func:`run_podgroups`): gangs compared with gangs, not with pods
placed one by one."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from kubernetes import client

from lj_runtimekit_testkit.bench import Figure
from lj_runtimekit_testkit.bench.kwok import (
    Creator,
    Step,
    create_pod,
    phase,
    rss_peak_mib,
    rss_reset,
)
from lj_runtimekit_testkit.cluster.handle import Cluster
from lj_runtimekit_testkit.cluster.launcher import ControlPlane

from .phases import POOL
from .pool import OURS, THEIRS, install_crd, make_nodes, pod_body, start_ours

FIGURES = (
    ("pods/s", "pods_per_s", "pods/s"),
    ("p50 create→bound", "p50_s", "s"),
    ("p99 create→bound", "p99_s", "s"),
    ("pods bound", "bound", "pods"),
    ("pods created/s", "created_per_s", "pods/s"),
    ("peak RSS", "rss_peak_mib", "MiB"),
)


def pod_groups(count: int, size: int) -> Step:
    """Create gangs ``pg-0`` … as PodGroups of ``size`` (gang policy) in the phase's namespace."""

    def setup(api: client.ApiClient, ns: str) -> None:
        custom: Any = client.CustomObjectsApi(api)
        for g in range(count):
            body = {
                "apiVersion": "scheduling.k8s.io/v1beta1",
                "kind": "PodGroup",
                "metadata": {"name": f"pg-{g}"},
                "spec": {"schedulingPolicy": {"gang": {"minCount": size}}},
            }
            custom.create_namespaced_custom_object(
                "scheduling.k8s.io", "v1beta1", ns, "podgroups", body
            )

    return setup


def in_pod_groups(scheduler: str, limits: dict[str, str], size: int) -> Creator:
    """Pod ``i`` asks ``limits`` of ``scheduler`` and belongs to PodGroup ``pg-<i // size>``."""

    def create(api: client.ApiClient, ns: str, i: int) -> float:
        body = pod_body(f"p-{i}", scheduler, POOL, (limits, {}))
        body["spec"]["schedulingGroup"] = {"podGroupName": f"pg-{i // size}"}
        return create_pod(api, ns, body)

    return create


def run_podgroups(args: argparse.Namespace, n_nodes: int) -> list[Figure]:
    """Gangs as PodGroups, the same pods and PodGroups first under kube-scheduler's own gang
    scheduling (GenericWorkload, beta in 1.37: the test control plane turns it on), then under
    ours, on one control plane of ``n_nodes`` nodes at client ``--podgroup-client``; one phase
    of whole-node members (8 GPUs), one of 2-GPU members (four per node). Each phase reports
    both schedulers' peak RSS during it."""
    qps_s, burst_s = args.podgroup_client.split("/")
    qps, burst = float(qps_s), int(burst_s)
    work = Path(tempfile.mkdtemp(prefix="lj-sched-bench-pg-"))
    cp = ControlPlane(work_dir=work, scheduler_client=(qps, burst), watch_cache=True)
    cp.start()
    ours: subprocess.Popen[bytes] | None = None
    label = f"client {qps:g}/{burst}"
    try:
        cluster = Cluster.from_control_plane(cp)
        install_crd(cluster)
        make_nodes(cluster, n_nodes, POOL)
        ours = start_ours(cluster, qps, burst, work / "ours.log")
        pids = {
            THEIRS: next(p.pid for p in cp.processes if p.name == "kube-scheduler"),
            OURS: ours.pid,
        }
        figures: list[Figure] = []
        results: dict[str, dict[str, float]] = {}
        n, size = args.gangs * args.gang_size, args.gang_size
        for gpus in ("8", "2"):
            what = f"PodGroup gang ({args.gangs}x{size}, {gpus} GPUs each)"
            ran: dict[str, dict[str, float]] = {}
            for who in (THEIRS, OURS):
                rss_reset(pids[who])
                r = phase(
                    cluster,
                    n,
                    in_pod_groups(who, {"aliyun.com/gpu": gpus}, size),
                    args.deadline,
                    setup=pod_groups(args.gangs, size),
                )
                ran[who] = {**r, "rss_peak_mib": rss_peak_mib(pids[who])}
            results[f"{what} theirs"], results[f"{what} ours"] = ran[THEIRS], ran[OURS]
            where = f"{n} pods, {n_nodes} nodes, {label}"
            o, t = ran[OURS], ran[THEIRS]
            figures += [
                Figure(f"{what}: {name}, {where}", o[key], unit, t[key], "kube-scheduler")
                for name, key, unit in FIGURES
            ]
        print(json.dumps(results, indent=1), flush=True)
        return figures
    finally:
        if ours is not None:
            ours.terminate()
            ours.wait(10)
        cp.stop()
        os.sync()
