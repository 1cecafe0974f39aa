"""The DRA case (issue 24): one-GPU pods on the classic path and through DRA, on a control plane
of its own with three pools (see :func:`run_dra`)."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import client

from lj_runtimekit_testkit.bench import Figure, dra
from lj_runtimekit_testkit.bench.kwok import Creator, Step, create_pod, phase
from lj_runtimekit_testkit.cluster.handle import Cluster
from lj_runtimekit_testkit.cluster.launcher import ControlPlane

from .pool import OURS, THEIRS, Shape, classic, install_crd, make_nodes, pod_body, start_ours

CLASSIC_POOL, DRA_POOL, MIG_POOL = "classic", "dra", "mig"
TEMPLATE = "one-gpu"
ANCHOR = "classic/kube-scheduler"


def setup_dra_pools(cluster: Cluster, nodes: int) -> None:
    """The classic pool (``aliyun.com/gpu: 8``, NodeDevices), the DRA pool (no GPU resource, one
    ResourceSlice of 8 shareable GPUs per node, and the NodeDevices the driver also keeps), the
    MIG pool (8 GPUs with partitions on demand per node) and the suite's DeviceClasses."""
    install_crd(cluster)
    make_nodes(cluster, nodes, CLASSIC_POOL)
    names = make_nodes(cluster, nodes, DRA_POOL, advertised=False)
    migs = cluster.create_gpu_nodes(
        nodes, prefix=f"bench-{MIG_POOL}", gpus=0, labels={"bench-pool": MIG_POOL}, deadline_s=900
    )
    with cluster.api_client(pool_size=16) as api:
        for dc in dra.device_classes():
            dra.create(api, dc)
        with ThreadPoolExecutor(16) as ex:
            list(ex.map(lambda node: dra.create(api, dra.gpu_slice(node, shareable=True)), names))
            slices = [s for node in migs for s in dra.mig_slices(node)]
            list(ex.map(lambda body: dra.create(api, body), slices))
    time.sleep(2)  # kube-scheduler's informers see the classes and slices


def dra_pod(name: str, source: dict[str, str]) -> dict[str, Any]:
    return dra.use_claim(pod_body(name, THEIRS, DRA_POOL, ({}, {})), source)


def from_template(api: client.ApiClient, ns: str, i: int) -> float:
    return create_pod(api, ns, dra_pod(f"p-{i}", {"resourceClaimTemplateName": TEMPLATE}))


def with_claim(api: client.ApiClient, ns: str, i: int) -> float:
    dra.create(api, dra.resource_claim(f"c-{i}", dra.claim_spec()), ns)
    return create_pod(api, ns, dra_pod(f"p-{i}", {"resourceClaimName": f"c-{i}"}))


def with_mig_claim(api: client.ApiClient, ns: str, i: int) -> float:
    dra.create(api, dra.resource_claim(f"c-{i}", dra.mig_claim_spec()), ns)
    pod = pod_body(f"p-{i}", THEIRS, MIG_POOL, ({}, {}))
    return create_pod(api, ns, dra.use_claim(pod, {"resourceClaimName": f"c-{i}"}))


def with_share_claim(api: client.ApiClient, ns: str, i: int) -> float:
    dra.create(api, dra.resource_claim(f"c-{i}", dra.share_claim_spec(50, "40Gi")), ns)
    return create_pod(api, ns, dra_pod(f"p-{i}", {"resourceClaimName": f"c-{i}"}))


def create_template(api: client.ApiClient, ns: str) -> None:
    dra.create(api, dra.claim_template(TEMPLATE, dra.claim_spec()), ns)


def free_claims(api: client.ApiClient, ns: str) -> None:
    if not dra.delete_claims(api, ns):
        print(f"bench: claims of {ns} left after the DRA phase", file=sys.stderr, flush=True)


def dra_variants(one_gpu: list[Shape], half: list[Shape]) -> dict[str, tuple[Creator, Step | None]]:
    """label → (pod creator, namespace setup) of the DRA pods: claims under kube-scheduler, and
    the same pods without claims under each scheduler (ours makes their claims itself)."""
    return {
        "DRA template/kube-scheduler": (from_template, create_template),
        "DRA claim/kube-scheduler": (with_claim, None),
        "DRA extended/kube-scheduler": (classic(THEIRS, DRA_POOL, one_gpu), None),
        "DRA extended/lj-runtimekit-scheduler": (classic(OURS, DRA_POOL, one_gpu), None),
        # half a GPU: kube-scheduler from a share claim, ours from gpu-core/gpu-memory unchanged
        "DRA share claim/kube-scheduler": (with_share_claim, None),
        "DRA shares/lj-runtimekit-scheduler": (classic(OURS, DRA_POOL, half), None),
        # a 1g.10gb MIG instance per pod, from partitionable devices (15 per GPU on counters)
        "DRA MIG claim/kube-scheduler": (with_mig_claim, None),
    }


def compared(where: str, label: str, r: dict[str, float], a: dict[str, float]) -> list[Figure]:
    rows = [
        ("pods/s", "pods_per_s", "pods/s"),
        ("p50", "p50_s", "s"),
        ("p99", "p99_s", "s"),
        ("bound", "bound", "pods"),
        ("created/s", "created_per_s", "pods/s"),
    ]
    return [Figure(f"{label}: {what}, {where}", r[k], unit, a[k], ANCHOR) for what, k, unit in rows]


def run_dra(args: argparse.Namespace) -> list[Figure]:
    """The DRA case (issue 24) on its own control plane, three pools of ``--dra-nodes`` each.

    Every phase creates ``--dra-pods`` pods wanting one GPU. The anchor: ``aliyun.com/gpu: 1`` on
    the classic pool under kube-scheduler. Compared with it: the same pods under ours; then, on
    the DRA pool (shareable GPUs, as the driver publishes them) and under kube-scheduler (ours
    refuses pods with claims, docs/dra.md), a
    ResourceClaimTemplate of one ``gpu.lj-runtimekit.aliyun.com`` (kube-controller-manager makes
    each claim), a ResourceClaim the benchmark makes just before each pod (the scheduler's DRA
    path alone), ``aliyun.com/gpu: 1`` served through the class's extendedResourceName, and a
    ResourceClaim for one 1g.10gb MIG instance on a third pool publishing partitions on demand
    (``dra_partitions: dynamic``: 15 devices per GPU on one counter set each). Then the DRA
    pool's pods without claims under ours, which makes each pod's claim itself: ``aliyun.com/gpu:
    1`` (against kube-scheduler's mapping of the same pods), and ``gpu-core: 50`` + ``gpu-memory:
    40`` (against kube-scheduler with a share claim of the same size made before each pod).
    KWOK runs no kubelet: what is timed is create → bound.
    """
    qps_text, burst_text = args.dra_client.split("/")
    qps, burst = float(qps_text), int(burst_text)
    work = Path(tempfile.mkdtemp(prefix="lj-sched-bench-dra-"))
    cp = ControlPlane(work_dir=work, scheduler_client=(qps, burst), watch_cache=True)
    cp.start()
    ours: subprocess.Popen[bytes] | None = None
    ok = False
    n = args.dra_pods
    one_gpu: list[Shape] = [({"aliyun.com/gpu": "1"}, {})] * n
    half: list[Shape] = [({"aliyun.com/gpu-core": "50", "aliyun.com/gpu-memory": "40"}, {})] * n
    where = f"{n} pods, 3x{args.dra_nodes} nodes, {qps:g}/{burst}"
    try:
        cluster = Cluster.from_control_plane(cp)
        setup_dra_pools(cluster, args.dra_nodes)
        ours = start_ours(cluster, qps, burst, work / "ours.log")
        results = {ANCHOR: phase(cluster, n, classic(THEIRS, CLASSIC_POOL, one_gpu), args.deadline)}
        results["classic/lj-runtimekit-scheduler"] = phase(
            cluster, n, classic(OURS, CLASSIC_POOL, one_gpu), args.deadline
        )
        for label, (create, setup) in dra_variants(one_gpu, half).items():
            results[label] = phase(
                cluster, n, create, args.deadline, setup=setup, cleanup=free_claims
            )
        print(json.dumps(results, indent=1), flush=True)
        anchor = results[ANCHOR]
        figures = [
            Figure(f"{ANCHOR}: pods/s, {where}", anchor["pods_per_s"], "pods/s"),
            Figure(f"{ANCHOR}: p50, {where}", anchor["p50_s"], "s"),
            Figure(f"{ANCHOR}: p99, {where}", anchor["p99_s"], "s"),
        ]
        for label, r in results.items():
            if label != ANCHOR:
                figures += compared(where, label, r, anchor)
        ok = True
        return figures
    finally:
        if ours is not None:
            ours.terminate()
            ours.wait(10)
        cp.stop()
        if ok:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"bench: the DRA case's logs are in {work / 'logs'}", file=sys.stderr)
