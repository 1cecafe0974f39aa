"""Throughput and latency of lj-runtimekit-scheduler against kube-scheduler, same cluster.

For each client setting (QPS/burst, given to both schedulers: kube-scheduler through its
KubeSchedulerConfiguration, ours through --kube-api-qps/--kube-api-burst) one local control
plane with KWOK GPU nodes. Each phase creates the same pods, first for kube-scheduler, then
(once those are deleted) for ours, on the same nodes, and times create → bound from a watch:
single-GPU pods, mixed shared/whole pods, then gangs (pod-group annotations; kube-scheduler,
which has no gangs, places the same pods one by one), then one-GPU pods of which a third carry
required pod anti-affinity (one per node within their group) and a third a rack spread
constraint (issue 35). Then the DRA case (issue 24), on one more
control plane: the same one-GPU pods on the classic path and through DRA, see run_dra. Then
the PodGroup case (issue 35), on one more: gangs as upstream PodGroups (``scheduling.k8s.io/
v1beta1``, gang policy), placed all or nothing by kube-scheduler's own gang scheduling and by
ours, see run_podgroups.

    .venv/bin/python components/scheduler/bench/run.py --out build/bench [--nodes 1000]
    .venv/bin/python components/scheduler/bench/run.py --out build/bench --cases dra
    .venv/bin/python components/scheduler/bench/run.py --out build/bench --cases podgroups
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from lj_runtimekit_testkit.bench import Figure, dra, write
from lj_runtimekit_testkit.bench.kwok import Creator, Step, create_pod, phase, rss_peak_mib
from lj_runtimekit_testkit.cluster.handle import Cluster
from lj_runtimekit_testkit.cluster.launcher import ControlPlane

ROOT = Path(__file__).resolve().parents[3]
CRD = ROOT / "deploy" / "crds" / "nodedevices.lj-runtimekit.aliyun.com.yaml"
OURS, THEIRS = "lj-runtimekit-scheduler", "default-scheduler"
POOL = "bench"
CLASSIC_POOL, DRA_POOL, MIG_POOL = "classic", "dra", "mig"
GROUP = "lj-runtimekit-scheduler/pod-group"
GROUP_SIZE = "lj-runtimekit-scheduler/pod-group-size"
TEMPLATE = "one-gpu"
ANCHOR = "classic/kube-scheduler"

Shape = tuple[dict[str, str], dict[str, str]]
"""(resource limits, annotations) of one pod."""


def install_crd(cluster: Cluster) -> None:
    with cluster.api_client() as api:
        client.ApiextensionsV1Api(api).create_custom_resource_definition(
            yaml.safe_load(CRD.read_text())
        )
    time.sleep(2)


def make_nodes(cluster: Cluster, n: int, pool: str, *, advertised: bool = True) -> list[str]:
    """``n`` KWOK nodes of 8 GPUs labelled ``bench-pool=<pool>``, with their NodeDevices;
    ``advertised``: as ``aliyun.com/gpu: 8`` too (a node in DRA mode advertises none)."""
    names = cluster.create_gpu_nodes(
        n,
        prefix=f"bench-{pool}",
        gpus=8 if advertised else 0,
        enable=True,
        labels={"bench-pool": pool},
        deadline_s=900,
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


def start_ours(cluster: Cluster, qps: float, burst: int, log: Path) -> subprocess.Popen[bytes]:
    """lj-runtimekit-scheduler as a process with client ``qps``/``burst``."""
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
        stderr=open(log, "wb"),  # noqa: SIM115
    )
    time.sleep(5)
    return ours


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


def classic(scheduler: str, pool: str, shapes: list[Shape]) -> Creator:
    """The ``i``-th pod asks ``shapes[i]`` of ``scheduler``."""

    def create(api: client.ApiClient, ns: str, i: int) -> float:
        return create_pod(api, ns, pod_body(f"p-{i}", scheduler, pool, shapes[i]))

    return create


RACK = "network.topology/rack"
HOSTNAME = "kubernetes.io/hostname"
GROUPS = 10
"""Replica sets of the constrained phase: pods of one group keep apart (or spread) together."""


def constrained_body(name: str, scheduler: str, pool: str, i: int) -> dict[str, Any]:
    """One GPU; the ``i``-th pod: a third with required anti-affinity (one per node among its
    group), a third spread over racks (maxSkew 1, DoNotSchedule, its group), a third plain."""
    body = pod_body(name, scheduler, pool, ({"aliyun.com/gpu": "1"}, {}))
    group = f"g{i % GROUPS}"
    if i % 3 == 0:
        body["metadata"]["labels"] = {"anti": group}
        term = {"labelSelector": {"matchLabels": {"anti": group}}, "topologyKey": HOSTNAME}
        body["spec"]["affinity"] = {
            "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}
        }
    elif i % 3 == 1:
        body["metadata"]["labels"] = {"spread": group}
        body["spec"]["topologySpreadConstraints"] = [
            {
                "maxSkew": 1,
                "topologyKey": RACK,
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"spread": group}},
            }
        ]
    return body


def constrained(scheduler: str, pool: str) -> Creator:
    def create(api: client.ApiClient, ns: str, i: int) -> float:
        return create_pod(api, ns, constrained_body(f"p-{i}", scheduler, pool, i))

    return create


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
        install_crd(cluster)
        make_nodes(cluster, args.nodes, POOL)
        ours = start_ours(cluster, qps, burst, work / "ours.log")
        theirs_pid = next(p.pid for p in cp.processes if p.name == "kube-scheduler")
        figures = []
        results: dict[str, dict[str, float]] = {}
        phases: list[tuple[str, int, Creator, Creator]] = [
            (label, len(pods), classic(THEIRS, POOL, pods), classic(OURS, POOL, pods))
            for label, pods in shapes(args).items()
        ]
        if args.constrained:
            label = "constrained (1/3 anti-affinity, 1/3 rack spread, 1 GPU each)"
            phases.append(
                (label, args.constrained, constrained(THEIRS, POOL), constrained(OURS, POOL))
            )
        for label, n, theirs, mine in phases:
            t = phase(cluster, n, theirs, args.deadline)
            o = phase(cluster, n, mine, args.deadline)
            results[f"{label} theirs"], results[f"{label} ours"] = t, o
            where = f"{n} {label} pods, {args.nodes} nodes, {client_label}"
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
    cp = ControlPlane(work_dir=work, scheduler_client=(qps, burst))
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


def run_podgroups(args: argparse.Namespace) -> list[Figure]:
    """Gangs as PodGroups, the same pods and PodGroups first under kube-scheduler's own gang
    scheduling (GenericWorkload, beta in 1.37: the test control plane turns it on), then under
    ours, on one control plane of ``--nodes`` nodes at client ``--podgroup-client``; one phase
    of whole-node members (8 GPUs), one of 2-GPU members (four per node)."""
    qps_s, burst_s = args.podgroup_client.split("/")
    qps, burst = float(qps_s), int(burst_s)
    work = Path(tempfile.mkdtemp(prefix="lj-sched-bench-pg-"))
    cp = ControlPlane(work_dir=work, scheduler_client=(qps, burst))
    cp.start()
    ours: subprocess.Popen[bytes] | None = None
    label = f"client {qps:g}/{burst}"
    try:
        cluster = Cluster.from_control_plane(cp)
        install_crd(cluster)
        make_nodes(cluster, args.nodes, POOL)
        ours = start_ours(cluster, qps, burst, work / "ours.log")
        theirs_pid = next(p.pid for p in cp.processes if p.name == "kube-scheduler")
        figures: list[Figure] = []
        results: dict[str, dict[str, float]] = {}
        n, size = args.gangs * args.gang_size, args.gang_size
        for gpus in ("8", "2"):
            what = f"PodGroup gang ({args.gangs}x{size}, {gpus} GPUs each)"
            ran = {
                who: phase(
                    cluster,
                    n,
                    in_pod_groups(who, {"aliyun.com/gpu": gpus}, size),
                    args.deadline,
                    setup=pod_groups(args.gangs, size),
                )
                for who in (THEIRS, OURS)
            }
            results[f"{what} theirs"], results[f"{what} ours"] = ran[THEIRS], ran[OURS]
            where = f"{n} pods, {args.nodes} nodes, {label}"
            o, t = ran[OURS], ran[THEIRS]
            figures += [
                Figure(f"{what}: {name}, {where}", o[key], unit, t[key], "kube-scheduler")
                for name, key, unit in (
                    ("pods/s", "pods_per_s", "pods/s"),
                    ("p50 create→bound", "p50_s", "s"),
                    ("p99 create→bound", "p99_s", "s"),
                    ("pods bound", "bound", "pods"),
                    ("pods created/s", "created_per_s", "pods/s"),
                )
            ]
        figures.append(
            Figure(
                f"peak RSS, PodGroup case, {label}",
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
        "--constrained",
        type=int,
        default=3000,
        help="pods of the constrained phase (a third with required anti-affinity, a third "
        "spread over racks, issue 35); 0 skips it",
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
        help="comma-separated: classic (the phases above, per client setting), dra (DRA "
        "against the classic path, dra_case.py), podgroups (gangs as upstream PodGroups under "
        "both schedulers' gang scheduling); the JSON holds the figures of this run only",
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
        for setting in args.clients.split(","):
            qps, burst = setting.split("/")
            figures += run(args, float(qps), int(burst))
    if "dra" in cases:
        figures += run_dra(args)
    if "podgroups" in cases:
        figures += run_podgroups(args)
    path = write(args.out, "scheduler", figures)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
