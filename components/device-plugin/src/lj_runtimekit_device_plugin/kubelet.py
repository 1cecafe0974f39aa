"""The only module that talks to the kubelet: its read-only ``/pods`` (HTTP) and its
pod-resources API (``v1.PodResourcesLister``, gRPC).

The kubelet serves pod-resources on ``/var/lib/kubelet/pod-resources/kubelet.sock`` (GA since
1.28, works with the read-only port closed). ``List`` names, for every active pod, each container
and the device IDs it holds per resource: the truth the reconcile and the attribution rest on.
Protobuf becomes :class:`~lj_runtimekit_device_plugin.reconcile.Holding` here, once.
"""

from __future__ import annotations

import json
import os
from typing import Any

import aiohttp
import grpc

from lj_runtimekit_interface import sockets
from lj_runtimekit_interface.podresources.v1 import api_pb2, api_pb2_grpc

from .errors import TemporaryError
from .reconcile import Holding


class PodsUnavailable(TemporaryError):
    """The kubelet's /pods did not answer or answered something else than a PodList."""


#: A node's pod list is a few MiB at most (110 pods of a few KiB): more is not a PodList, and
#: reading it whole would let one bad answer take the plugin's memory.
MAX_PODS_BYTES = 64 << 20


async def kubelet_pods(url: str, timeout_s: float = 2.0) -> list[dict[str, Any]]:
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as http,
            http.get(url) as r,
        ):
            if r.status != 200:
                raise PodsUnavailable(f"kubelet {url} answered {r.status}")
            body = await _read_capped(r, MAX_PODS_BYTES)
            if body is None:
                raise PodsUnavailable(f"kubelet {url} answered more than {MAX_PODS_BYTES} bytes")
            doc = json.loads(body)
    except (aiohttp.ClientError, TimeoutError, ValueError, RecursionError) as e:
        raise PodsUnavailable(
            f"kubelet {url}: {e!r}; is the read-only port open? Otherwise set "
            "--pods-source=auto or apiserver"
        ) from e
    items = doc.get("items") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        raise PodsUnavailable(f"kubelet {url} answered no PodList")
    return [i for i in items if isinstance(i, dict)]


async def _read_capped(response: aiohttp.ClientResponse, cap: int) -> bytes | None:
    """The whole body, or None once it passes ``cap`` bytes. (``content.read(n)`` is not this: it
    returns what has arrived so far, so a pod list longer than one network chunk was cut short.)"""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > cap:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
#: Messages of a full node stay well under this; the kubelet's own limit is 16 MiB.
MAX_MESSAGE = 16 * 1024 * 1024


class PodResourcesUnavailable(TemporaryError):
    """The kubelet's pod-resources API did not answer (kubelet restarting, socket missing)."""


class PodResourcesClient:
    """A channel to the kubelet's pod-resources socket, reconnecting on its own."""

    def __init__(self, socket_path: str, timeout: float = 5.0) -> None:
        self.path = socket_path
        self.timeout = timeout
        self._channel = grpc.aio.insecure_channel(
            sockets.unix_target(socket_path),
            # a local socket: after a kubelet restart, reconnect within a tenth of a second
            options=(
                ("grpc.max_receive_message_length", MAX_MESSAGE),
                ("grpc.initial_reconnect_backoff_ms", 100),
                ("grpc.min_reconnect_backoff_ms", 100),
                ("grpc.max_reconnect_backoff_ms", 1000),
            ),
        )
        self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)

    def _where(self) -> str:
        return self.path if os.path.exists(self.path) else f"{self.path} (missing)"

    async def close(self) -> None:
        await self._channel.close()

    async def list(self, resources: frozenset[str] | None = None) -> list[Holding]:
        """Every (pod, container, resource) with its device IDs; ``resources`` filters.

        A container holding none of the resources still appears once with resource ``""`` and
        no devices, so callers know the pod and container exist.
        """
        try:
            r = await self._stub.List(
                api_pb2.ListPodResourcesRequest(), timeout=self.timeout, wait_for_ready=True
            )
        except grpc.aio.AioRpcError as e:
            where = self._where()
            raise PodResourcesUnavailable(
                f"kubelet pod-resources List on {where} failed: {e.code().name} {e.details()}: "
                "is the kubelet running and /var/lib/kubelet/pod-resources mounted into the pod?"
            ) from e
        if r is None:  # grpc-aio's answer for a reply that did not parse
            raise PodResourcesUnavailable(
                f"kubelet pod-resources List on {self._where()} answered bytes that are not a "
                "ListPodResourcesResponse (v1): is it the kubelet's socket?"
            )
        out: list[Holding] = []
        for pod in r.pod_resources:
            for c in pod.containers:
                ids: dict[str, list[str]] = {}
                for d in c.devices:
                    if resources is None or d.resource_name in resources:
                        ids.setdefault(d.resource_name, []).extend(d.device_ids)
                if not ids:
                    out.append(Holding(pod.namespace, pod.name, c.name, "", ()))
                for resource, devs in sorted(ids.items()):
                    out.append(
                        Holding(pod.namespace, pod.name, c.name, resource, tuple(sorted(devs)))
                    )
        return out
