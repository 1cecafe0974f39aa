"""The only module that talks to the kubelet: its pod-resources API (``v1.PodResourcesLister``
on a unix socket: which pod and container holds which device ids) and, as the fallback, its
read-only ``/pods`` (default port 10255)."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import grpc

from lj_runtimekit_interface.podresources.v1 import api_pb2, api_pb2_grpc

from .errors import TemporaryError
from .snapshot import DRA_RESOURCE_PREFIX, Held, Pod

#: A node's pod list is a few MiB at most (110 pods of a few KiB); reading more would let one
#: bad answer take the exporter's memory.
MAX_PODS_BYTES = 64 << 20


class PodsUnavailable(TemporaryError):
    """The pod list could not be read this poll."""


def pods_from_podlist(doc: Any) -> tuple[Pod, ...]:
    """Pods from a v1 PodList document; malformed items are skipped, never fatal."""
    if not isinstance(doc, dict):
        raise PodsUnavailable("pod list is not a JSON object")
    items = doc.get("items")
    if not isinstance(items, list):
        raise PodsUnavailable("pod list has no items array")
    pods: list[Pod] = []
    for item in items:
        if not isinstance(item, dict):
            continue
        meta = item.get("metadata")
        status = item.get("status")
        if not isinstance(meta, dict):
            continue
        ns, name, uid = meta.get("namespace"), meta.get("name"), meta.get("uid")
        if not isinstance(ns, str) or not isinstance(name, str):
            continue
        phase = status.get("phase") if isinstance(status, dict) else None
        pods.append(
            Pod(
                namespace=ns,
                name=name,
                uid=uid if isinstance(uid, str) else "",
                phase=phase if isinstance(phase, str) else "Unknown",
            )
        )
    return tuple(pods)


class KubeletPods:
    """Reads the node's pods from the kubelet; one HTTP session reused across polls."""

    def __init__(self, url: str, timeout: float) -> None:
        self._url = url
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=self._timeout)

    async def stop(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def pods(self) -> tuple[Pod, ...]:
        if self._session is None:
            raise RuntimeError("KubeletPods.start() was not awaited")
        try:
            async with self._session.get(self._url) as resp:
                if resp.status != 200:
                    raise PodsUnavailable(
                        f"kubelet {self._url} answered HTTP {resp.status}: is the read-only port "
                        "enabled (readOnlyPort: 10255)? Otherwise use --pods-source=apiserver"
                    )
                body = await _read_capped(resp, MAX_PODS_BYTES)
                if body is None:
                    raise PodsUnavailable(
                        f"kubelet {self._url} answered more than {MAX_PODS_BYTES} bytes: not a "
                        "node's pod list"
                    )
                doc = json.loads(body)
        except (aiohttp.ClientError, TimeoutError, ValueError, RecursionError) as e:
            raise PodsUnavailable(
                f"kubelet {self._url} unreachable ({e!r}): is the read-only port enabled "
                "(readOnlyPort: 10255)? Otherwise use --pods-source=apiserver"
            ) from e
        return pods_from_podlist(doc)


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


class PodResourcesUnavailable(TemporaryError):
    """The kubelet's pod-resources socket did not answer this poll."""


def held_from_proto(resp: api_pb2.ListPodResourcesResponse) -> tuple[Held, ...]:
    """One :class:`Held` per container and device resource of the kubelet's answer, and one per
    container and DRA driver of its prepared claims (resource ``dra:<driver>``)."""
    plugin = tuple(
        Held(p.namespace, p.name, c.name, d.resource_name, tuple(d.device_ids))
        for p in resp.pod_resources
        for c in p.containers
        for d in c.devices
        if d.device_ids
    )
    dra = tuple(
        Held(p.namespace, p.name, c.name, DRA_RESOURCE_PREFIX + r.driver_name, (r.device_name,))
        for p in resp.pod_resources
        for c in p.containers
        for claim in c.dynamic_resources
        for r in claim.claim_resources
        if r.driver_name and r.device_name
    )
    return plugin + dra


class PodResources:
    """Lists the kubelet's pod resources over ``socket``; one channel reused across polls."""

    def __init__(self, socket: str, timeout: float) -> None:
        self.socket = socket
        self._timeout = timeout
        self._channel: grpc.aio.Channel | None = None

    async def start(self) -> None:
        self._channel = grpc.aio.insecure_channel(f"unix://{self.socket}")

    async def stop(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def held(self) -> tuple[Held, ...]:
        if self._channel is None:
            raise RuntimeError("PodResources.start() was not awaited")
        stub = api_pb2_grpc.PodResourcesListerStub(self._channel)
        try:
            resp = await stub.List(api_pb2.ListPodResourcesRequest(), timeout=self._timeout)
        except grpc.aio.AioRpcError as e:
            # a fresh channel next poll: a restarted kubelet's new socket is found at once,
            # not after the old channel's reconnect backoff
            await self.stop()
            await self.start()
            raise PodResourcesUnavailable(
                f"kubelet pod-resources {self.socket}: {e.code().name} {e.details()}; is the "
                "socket mounted into the exporter (hostPath /var/lib/kubelet/pod-resources)?"
            ) from e
        if resp is None:  # grpc-aio's answer for a reply that did not parse
            raise PodResourcesUnavailable(
                f"kubelet pod-resources {self.socket}: List answered bytes that are not a "
                "ListPodResourcesResponse (v1): is it the kubelet's socket?"
            )
        return held_from_proto(resp)
