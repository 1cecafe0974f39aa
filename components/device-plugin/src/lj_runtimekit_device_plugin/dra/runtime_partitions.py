"""Partitions made on demand (mode dra, ``dra_partitions: dynamic``): the Runtime's
ConfigService ``CreatePartition`` and ``DeletePartition`` on ``<socket_dir>/config-daemon.sock``.

A DRA claim for a MIG instance or a TDM slice gets one made when the kubelet prepares it, beside
the partitions its GPU already has, and removed when the kubelet unprepares it. The Runtime keeps
the other partitions and their allocations as they are.
"""

from __future__ import annotations

import os

import grpc

from lj_runtimekit_interface import sockets
from lj_runtimekit_interface.runtime.v1 import config_pb2, config_pb2_grpc

from ..runtime import MethodMissing, RuntimeUnavailable
from ..runtime_channel import open_channel

CREATE = "ConfigService.CreatePartition"
DELETE = "ConfigService.DeletePartition"


class PartitionRefused(RuntimeUnavailable):
    """The Runtime refused to make or remove a partition (no room, held, other mode): the state
    may change (an allocation ends), so the kubelet's next prepare may succeed."""

    def __init__(self, message: str, code: grpc.StatusCode) -> None:
        super().__init__(message)
        self.code = code


class PartitionClient:
    """A ConfigService client for partitions, on ``<socket_dir>/config-daemon.sock``."""

    def __init__(self, socket_dir: str, timeout: float = 5.0) -> None:
        self.path = os.path.join(socket_dir, sockets.CONFIG_SOCKET)
        self.timeout = timeout
        self._channel = open_channel(self.path)
        self._stub = config_pb2_grpc.ConfigServiceStub(self._channel)

    async def close(self) -> None:
        await self._channel.close()

    def _error(self, method: str, what: str, e: grpc.aio.AioRpcError) -> Exception:
        if e.code() == grpc.StatusCode.UNIMPLEMENTED:
            return MethodMissing(
                f"this Runtime lacks {method}: partitions on demand need a Runtime with it "
                "(set dra_partitions: static, or upgrade the Runtime)"
            )
        if e.code() in (
            grpc.StatusCode.FAILED_PRECONDITION,
            grpc.StatusCode.INVALID_ARGUMENT,
            grpc.StatusCode.NOT_FOUND,
            grpc.StatusCode.RESOURCE_EXHAUSTED,
        ):
            return PartitionRefused(f"Runtime refused {what}: {e.details()}", e.code())
        where = self.path if os.path.exists(self.path) else f"{self.path} (missing)"
        return RuntimeUnavailable(
            f"Runtime {method} on {where} failed: {e.code().name} {e.details()}: "
            "is the Runtime's config daemon running?"
        )

    async def create(self, device_id: str, *, profile: str = "", percent: int = 0) -> str:
        """Make one MIG instance (``profile``) or TDM slice (``percent``) on ``device_id``; the
        new partition's id."""
        req = (
            config_pb2.CreatePartitionRequest(device_id=device_id, mig_profile=profile)
            if profile
            else config_pb2.CreatePartitionRequest(device_id=device_id, tdm_percent=percent)
        )
        what = f"a {profile or f'tdm {percent}%'} partition on {device_id}"
        try:
            r = await self._stub.CreatePartition(req, timeout=self.timeout, wait_for_ready=True)
        except grpc.aio.AioRpcError as e:
            raise self._error(CREATE, what, e) from e
        if not r.partition_id:
            raise RuntimeUnavailable(f"Runtime {CREATE} answered no partition id for {what}")
        return str(r.partition_id)

    async def delete(self, partition_id: str) -> bool:
        """Remove one partition; False when no device has it (already gone)."""
        req = config_pb2.DeletePartitionRequest(partition_id=partition_id)
        try:
            await self._stub.DeletePartition(req, timeout=self.timeout, wait_for_ready=True)
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.NOT_FOUND:
                return False
            raise self._error(DELETE, f"removing partition {partition_id}", e) from e
        return True
