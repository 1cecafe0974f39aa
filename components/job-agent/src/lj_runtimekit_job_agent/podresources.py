"""The only module that talks to the kubelet: its pod-resources API (``v1.PodResourcesLister``
``List``) on the node-local socket, asked which pods hold GPUs bound to vfio-pci.

The Runtime makes no allocation for a GPU the device plugin hands to a VM pod (the VM's own driver
drives it), so ListAllocations cannot say whether one is in use; the kubelet's device manager
can: each container's device ids per extended resource. Protobuf becomes
:class:`~lj_runtimekit_job_agent.gpus.Holding` here, once.
"""

from __future__ import annotations

import asyncio
import os
from typing import Final

import grpc
from grpc import aio

from lj_runtimekit_interface import sockets
from lj_runtimekit_interface.podresources.v1 import api_pb2, api_pb2_grpc

from .errors import TemporaryError
from .gpus import Holding

#: A full node's reply stays far below this; the kubelet's own limit is 16 MiB.
MAX_MESSAGE: Final = 16 * 1024 * 1024


class PodResourcesUnavailable(TemporaryError):
    """The kubelet's pod-resources socket is absent or did not answer List."""


async def holdings(socket_path: str, resource: str, rpc_timeout: float) -> list[Holding]:
    """Each container of an active pod that holds units of ``resource``, with their ids;
    :class:`PodResourcesUnavailable` saying why when the kubelet cannot be asked."""
    if not await asyncio.to_thread(os.path.exists, socket_path):
        raise PodResourcesUnavailable(
            "socket not found: is the kubelet's pod-resources directory mounted into the Job?"
        )
    channel = aio.insecure_channel(
        sockets.unix_target(socket_path),
        options=(("grpc.max_receive_message_length", MAX_MESSAGE),),
    )
    try:
        stub = api_pb2_grpc.PodResourcesListerStub(channel)
        # wait_for_ready: a kubelet restarting within the timeout is waited for, not reported
        reply = await stub.List(
            api_pb2.ListPodResourcesRequest(), timeout=rpc_timeout, wait_for_ready=True
        )
    except grpc.aio.AioRpcError as e:
        raise PodResourcesUnavailable(f"List failed: {e.code().name} {e.details()}") from e
    finally:
        await channel.close()
    if reply is None:  # grpc-aio's answer for a reply that did not parse
        raise PodResourcesUnavailable(
            "List answered bytes that are not a ListPodResourcesResponse (v1): is it the "
            "kubelet's socket?"
        )
    out = []
    for pod in reply.pod_resources:
        for c in pod.containers:
            ids = sorted(i for d in c.devices if d.resource_name == resource for i in d.device_ids)
            if ids:
                out.append(Holding("", pod.namespace, pod.name, c.name, tuple(ids), resource))
    return out
