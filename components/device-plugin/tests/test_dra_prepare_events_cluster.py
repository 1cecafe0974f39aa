"""A refused or failed NodePrepareResources shows on the claim's pod in the real apiserver (issue 34
item 2): the DRA plugin as the daemon wires it (node.connect, modes.migration.dra_host), the
runtime simulator on its real sockets, the claim and the pod read from the apiserver, the Event
posted there, and a kubelet retrying the same prepare posts one Event per window."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from kubernetes import client as sync_client

from lj_runtimekit_device_plugin.dra.plugin import DraHost
from lj_runtimekit_device_plugin.dra.refusals import PREPARE_FAILED, PREPARE_REFUSED
from lj_runtimekit_device_plugin.metrics import PluginMetrics
from lj_runtimekit_device_plugin.modes.migration import dra_host
from lj_runtimekit_device_plugin.node import Parts, connect
from lj_runtimekit_device_plugin.settings import load
from lj_runtimekit_interface import sockets
from lj_runtimekit_interface.dra.v1 import api_pb2 as dra_pb2
from lj_runtimekit_interface.dra.v1 import api_pb2_grpc as dra_grpc

pytestmark = pytest.mark.cluster

DRIVER, NODE = "lj-runtimekit.aliyun.com", "prep-node"


@pytest.fixture
async def host(cluster: Any, runtime_sim: Any) -> AsyncIterator[tuple[Parts, DraHost]]:
    short = Path(tempfile.mkdtemp(prefix="ljdp-"))
    s = load(
        [
            "--kubeconfig",
            cluster.kubeconfig,
            "--socket-dir",
            str(runtime_sim.socket_dir),
            "--node-name",
            NODE,
            "--mode",
            "dra",
            "--pods-source",
            "apiserver",
            "--dra-plugin-dir",
            str(short / "plugins"),
            "--dra-registry-dir",
            str(short / "registry"),
            "--cdi-dir",
            str(short / "cdi"),
            "--rpc-timeout",
            "2",
        ],
        {},
    )
    parts = await connect(s, PluginMetrics())
    await parts.inventory.replace(await parts.client.list_devices())
    h = dra_host(parts, prepare=True)
    await h.start()
    try:
        yield parts, h
    finally:
        await h.stop()
        await h.close()
        await parts.client.close()
        await parts.api.close()
        shutil.rmtree(short, ignore_errors=True)


def _claim_and_pod(cluster: Any, namespace: str, name: str, device: str) -> tuple[str, str]:
    """A pod and a claim allocated to ``device`` of this node and reserved for the pod, as
    kube-scheduler leaves them (the status written directly); (claim uid, pod uid)."""
    with cluster.api_client() as a:
        core, custom = sync_client.CoreV1Api(a), sync_client.CustomObjectsApi(a)
        claim: Any = custom.create_namespaced_custom_object(
            "resource.k8s.io",
            "v1",
            namespace,
            "resourceclaims",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": name},
                "spec": {
                    "devices": {
                        "requests": [
                            {"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}}
                        ]
                    }
                },
            },
        )
        body: Any = {
            "metadata": {"name": f"{name}-pod"},
            "spec": {
                "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.k8s.io/pause:3.10",
                        "resources": {"claims": [{"name": "gpu"}]},
                    }
                ],
            },
        }
        pod: Any = core.create_namespaced_pod(namespace, body)
        claim["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}
                    ]
                }
            },
            "reservedFor": [
                {"resource": "pods", "name": pod.metadata.name, "uid": pod.metadata.uid}
            ],
        }
        custom.replace_namespaced_custom_object_status(
            "resource.k8s.io", "v1", namespace, "resourceclaims", name, claim
        )
        return str(claim["metadata"]["uid"]), str(pod.metadata.uid)


def _events(cluster: Any, namespace: str, pod_uid: str) -> list[Any]:
    with cluster.api_client() as a:
        got = sync_client.CoreV1Api(a).list_namespaced_event(namespace)
    # the device plugin's only: kube-scheduler reports on the pending pod too
    return [
        e
        for e in got.items
        if e.involved_object.uid == pod_uid
        and e.reporting_component == "lj-runtimekit-device-plugin"
    ]


def _until_events(cluster: Any, namespace: str, pod_uid: str, n: int) -> list[Any]:
    deadline = time.monotonic() + 15
    while len(found := _events(cluster, namespace, pod_uid)) < n:
        assert time.monotonic() < deadline, f"{len(found)} Events on the pod, expected {n}"
        time.sleep(0.1)
    return found


async def _prepare(h: DraHost, namespace: str, name: str, uid: str) -> str:
    wire = dra_pb2.Claim(namespace=namespace, name=name, uid=uid)
    async with grpc.aio.insecure_channel(sockets.unix_target(str(h.dra_socket))) as ch:
        got = await dra_grpc.DRAPluginStub(ch).NodePrepareResources(
            dra_pb2.NodePrepareResourcesRequest(claims=[wire])
        )
    return str(got.claims[uid].error)


async def test_a_refused_prepare_is_one_warning_event_on_the_pod_however_often_retried(
    cluster: Any, namespace: str, host: tuple[Parts, DraHost]
) -> None:
    parts, h = host
    claim_uid, pod_uid = _claim_and_pod(cluster, namespace, "stale", "gpu-that-went")
    for _ in range(20):  # the kubelet retrying the pod's sync
        assert "not in this node's inventory" in await _prepare(h, namespace, "stale", claim_uid)
    (event,) = _until_events(cluster, namespace, pod_uid, 1)
    assert event.type == "Warning"
    assert event.reason == PREPARE_REFUSED
    assert f"claim {namespace}/stale on node {NODE}" in event.message
    assert "not in this node's inventory" in event.message
    assert event.involved_object.name == "stale-pod"
    assert event.source.host == NODE
    posted = parts.metrics.registry.get_sample_value(
        "lj_device_plugin_pod_events_total", {"reason": PREPARE_REFUSED}
    )
    assert posted == 1


async def test_a_runtime_that_does_not_answer_is_a_failed_prepare_on_the_pod(
    cluster: Any, namespace: str, runtime_sim: Any, host: tuple[Parts, DraHost]
) -> None:
    _, h = host
    claim_uid, pod_uid = _claim_and_pod(cluster, namespace, "away", "gpu-2")
    runtime_sim.fail("Allocate", grpc.StatusCode.UNAVAILABLE)
    try:
        assert "is the Runtime service running?" in await _prepare(h, namespace, "away", claim_uid)
    finally:
        runtime_sim.clear_faults()
    (event,) = _until_events(cluster, namespace, pod_uid, 1)
    assert event.reason == PREPARE_FAILED
    assert "the kubelet retries" in event.message
    assert runtime_sim.allocations() == []
    # the retry, with the Runtime answering, prepares it
    assert await _prepare(h, namespace, "away", claim_uid) == ""
    assert [list(a.device_ids) for a in runtime_sim.allocations()] == [["gpu-2"]]
