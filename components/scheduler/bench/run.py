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
classic path and through DRA, see run_dra.

    .venv/bin/python components/scheduler/bench/run.py --out build/bench [--nodes 2000,5000]
    .venv/bin/python components/scheduler/bench/run.py --out build/bench --cases dra
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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from lj_runtimekit_testkit.bench import Figure, dra, volumes, write
from lj_runtimekit_testkit.bench.kwok import (
    Creator,
    Report,
    Step,
    create_pod,
    phase,
    rss_peak_mib,
    rss_reset,
)
from lj_runtimekit_testkit.bench.preemption import HIGH, LOW, Fill, install_priorities
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
    group), a third spread over racks (maxSkew 1, DoNotSchedule, its group), a sixth with the
    claim ``c-<i>`` bound to a rack's PV, a sixth with the WaitForFirstConsumer claim ``c-<i>``
    (:func:`claims_setup` makes both)."""
    body = pod_body(name, scheduler, pool, ({"aliyun.com/gpu": "1"}, {}))
    if i % 6 in (2, 5):
        volumes.use_claim(body, f"c-{i}")
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


def claims_setup(n: int, nodes: list[str], racks: list[str]) -> Step:
    """The claims of :func:`constrained_body`'s ``n`` pods: pod ``6k+2``'s bound to a PV of rack
    ``k`` (modulo), pod ``6k+5``'s unbound, with a free local PV on node ``k`` (modulo)."""

    def setup(api: client.ApiClient, ns: str) -> None:
        volumes.make_bound(
            api, ns, [(f"c-{i}", racks[(i // 6) % len(racks)]) for i in range(2, n, 6)]
        )
        volumes.make_local(
            api, ns, [(f"c-{i}", nodes[(i // 6) % len(nodes)]) for i in range(5, n, 6)]
        )

    return setup


@dataclass(frozen=True)
class Plan:
    """One phase under one scheduler: how its pods are made, and what it does around them."""

    create: Creator
    setup: Step | None = None
    cleanup: Step | None = None
    report: Report | None = None


Phase = tuple[str, int, Callable[[str], Plan]]
"""(label, timed pods, the plan for a scheduler name)."""


def preemption(scheduler: str, nodes: int, filler_gpus: int) -> Plan:
    """The pool's every GPU held by ``bench-low`` pods of ``filler_gpus`` GPUs (placed by
    ``scheduler``), then ``bench-high`` pods of one GPU each."""

    def filler(name: str) -> dict[str, Any]:
        body = pod_body(name, scheduler, POOL, ({"aliyun.com/gpu": str(filler_gpus)}, {}))
        body["spec"]["priorityClassName"] = LOW
        return body

    def create(api: client.ApiClient, ns: str, i: int) -> float:
        body = pod_body(f"p-{i}", scheduler, POOL, ({"aliyun.com/gpu": "1"}, {}))
        body["spec"]["priorityClassName"] = HIGH
        return create_pod(api, ns, body)

    fill = Fill(nodes * 8 // filler_gpus, filler, filler_gpus)
    return Plan(create, setup=fill.setup, report=fill.report)


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


def classic_plan(pods: list[Shape]) -> Callable[[str], Plan]:
    return lambda scheduler: Plan(classic(scheduler, POOL, pods))


def phases(args: argparse.Namespace, nodes: list[str], racks: list[str]) -> list[Phase]:
    """Every phase of the classic case, in order (preemption, which fills the pool, last)."""
    out: list[Phase] = [
        (label, len(pods), classic_plan(pods)) for label, pods in shapes(args).items()
    ]
    if args.constrained:
        n = args.constrained
        setup = claims_setup(n, nodes, racks)
        label = "constrained (1/3 anti-affinity, 1/3 rack spread, 1/3 claims, 1 GPU each)"
        out.append(
            (
                label,
                n,
                lambda s: Plan(constrained(s, POOL), setup=setup, cleanup=volumes.delete_volumes),
            )
        )
    if args.preemptors:
        label = f"preemption (1 GPU, pool full of {args.filler_gpus}-GPU low-priority pods)"
        out.append((label, args.preemptors, lambda s: preemption(s, len(nodes), args.filler_gpus)))
    return out


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
    ("pods/s", "pods_per_s", "pods/s"),
    ("p50 create→bound", "p50_s", "s"),
    ("p99 create→bound", "p99_s", "s"),
    ("pods bound", "bound", "pods"),
    ("pods created/s", "created_per_s", "pods/s"),
    ("peak RSS", "rss_peak_mib", "MiB"),
    ("victims", "victims", "pods"),
    ("victims needed", "victims_needed", "pods"),
    ("victims beyond need", "victims_excess", "pods"),
    ("victim nodes no preemptor took", "victim_nodes_untaken", "nodes"),
)


def run(args: argparse.Namespace, n_nodes: int, qps: float, burst: int) -> list[Figure]:
    """One control plane with ``n_nodes`` nodes whose two schedulers both use client
    ``qps``/``burst``."""
    work = Path(tempfile.mkdtemp(prefix="lj-sched-bench-"))
    cp = ControlPlane(work_dir=work, scheduler_client=(qps, burst))
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
        default="classic,dra",
        help="comma-separated: classic (the phases above, per client setting), dra (DRA "
        "against the classic path, dra_case.py); the JSON holds the figures of this run only",
    )
    ap.add_argument("--dra-nodes", type=int, default=100, help="DRA case: nodes per pool")
    ap.add_argument("--dra-pods", type=int, default=200, help="DRA case: 1-GPU pods per phase")
    ap.add_argument(
        "--dra-client",
        default="5000/5000",
        help="DRA case: client QPS/burst of both schedulers (upstream scheduler_perf's setting)",
    )
    args = ap.parse_args()
    cases = set(args.cases.split(","))
    if unknown := cases - {"classic", "dra"}:
        ap.error(f"unknown cases {sorted(unknown)}: use classic, dra")
    figures = []
    if "classic" in cases:
        for n_nodes in args.nodes.split(","):
            for setting in args.clients.split(","):
                qps, burst = setting.split("/")
                figures += run(args, int(n_nodes), float(qps), int(burst))
    if "dra" in cases:
        figures += run_dra(args)
    path = write(args.out, "scheduler", figures)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
