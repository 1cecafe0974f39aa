"""The only module that talks to the kubelet's pod-resources API (``v1.PodResourcesLister``).

The kubelet serves it on ``/var/lib/kubelet/pod-resources/kubelet.sock`` (GA since 1.28, works
with the read-only port closed). ``List`` names, for every active pod, each container and the
device IDs it holds per resource: the truth the reconcile and the attribution rest on. Protobuf
becomes :class:`~lj_runtimekit_device_plugin.reconcile.Holding` here, once.
"""

from __future__ import annotations

import os

import grpc

from lj_runtimekit_interface import sockets
from lj_runtimekit_interface.podresources.v1 import api_pb2, api_pb2_grpc

from .errors import TemporaryError
from .reconcile import Holding

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
