"""Pods from the apiserver's spec.nodeName watch (a real control plane with KWOK nodes)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import pytest
from kubernetes import client

from lj_runtimekit_interface.runtime.v1 import device_pb2, device_pb2_grpc
from lj_runtimekit_testkit.cluster.handle import Cluster
from lj_runtimekit_testkit.simulator.simulator import Simulator

pytestmark = pytest.mark.cluster
CORE = "lj_runtimekit_container_allocated_core_ratio"
Factory = Callable[..., Awaitable[Any]]


def pods_of(series: dict[str, Any]) -> set[str]:
    return {labels["pod"] for labels, _ in series.get(CORE, [])}


def pod_on(node: str, name: str) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(
            node_name=node,
            containers=[client.V1Container(name="main", image="registry.invalid/train:1")],
            tolerations=[client.V1Toleration(operator="Exists")],
        ),
    )


async def test_apiserver_pods_attribute_live_pods_and_drop_deleted_ones_at_the_next_poll(
    cluster: Cluster, namespace: str, runtime_sim: Simulator, exporter_factory: Factory
) -> None:
    node = cluster.create_gpu_nodes(1, prefix="exporter-node")[0]
    core = cluster.core()
    created = await asyncio.to_thread(core.create_namespaced_pod, namespace, pod_on(node, "train"))
    assert created.metadata is not None
    assert isinstance(created.metadata.uid, str)
    async with grpc.aio.insecure_channel(runtime_sim.target("DeviceService")) as ch:
        stub = device_pb2_grpc.DeviceServiceStub(ch)
        holders = (("train", created.metadata.uid, "gpu-0"), ("ghost", "u-x", "gpu-1"))
        for name, uid, gpu in holders:
            await stub.Allocate(
                device_pb2.AllocateRequest(
                    pod=device_pb2.PodRef(namespace=namespace, name=name, uid=uid),
                    container="main",
                    resource_name="aliyun.com/gpu",
                    device_ids=[gpu],
                )
            )
    exp = await exporter_factory(
        socket_dir=str(runtime_sim.socket_dir),
        pods_source="apiserver",
        kubeconfig=cluster.kubeconfig,
        node_name=node,
    )
    up = "lj_runtimekit_exporter_pods_source_up"
    # No pod-resources socket here: that source reads 0 and the apiserver is the fallback in use.
    await exp.wait_for(
        lambda s: (
            ({"node": node, "source": "apiserver"}, 1.0) in s.get(up, [])
            and ({"node": node, "source": "pod-resources"}, 0.0) in s.get(up, [])
        )
    )
    got = await exp.wait_for(lambda s: "train" in pods_of(s), deadline_s=30.0)
    assert pods_of(got) == {"train"}, "a pod the apiserver does not know has no series"

    await asyncio.to_thread(core.delete_namespaced_pod, "train", namespace, grace_period_seconds=0)
    await exp.wait_for(lambda s: pods_of(s) == set(), deadline_s=30.0)
    core.api_client.close()
