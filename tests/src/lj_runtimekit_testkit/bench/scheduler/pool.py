"""The bench's cluster: KWOK GPU nodes with their NodeDevices, lj-runtimekit-scheduler as a
process beside the control plane's kube-scheduler, and the pods asked of either."""

from __future__ import annotations

import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from lj_runtimekit_testkit.bench.kwok import Creator, create_pod
from lj_runtimekit_testkit.cluster.handle import Cluster

ROOT = Path(__file__).resolve().parents[5]
CRD = ROOT / "deploy" / "crds" / "nodedevices.lj-runtimekit.aliyun.com.yaml"
OURS, THEIRS = "lj-runtimekit-scheduler", "default-scheduler"

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
