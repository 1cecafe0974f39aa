"""A misbehaving Runtime: the real service and method names, answers chosen by the test.

The runtime simulator is a faithful Runtime; this is its opposite, for attacking the clients. It
serves ``DeviceService`` and ``MonitorService`` on the usual sockets through grpc.aio *generic*
handlers whose response serializer is the identity on bytes, so a test can answer any method with
anything: a real message, bytes that are not protobuf at all, a proto3 string holding non-UTF-8, a
call that hangs, a stream that ends or fails half-way.

Each method answers by its :class:`Behaviour`; unset methods answer an empty (valid) message.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from google.protobuf.message import Message

from lj_runtimekit_interface import sockets
from lj_runtimekit_interface.runtime.v1 import device_pb2, monitor_pb2

DEVICE_SERVICE = "lj.runtime.v1.DeviceService"
MONITOR_SERVICE = "lj.runtime.v1.MonitorService"

#: method → (service, whether it streams its answers)
METHODS: dict[str, tuple[str, bool]] = {
    "GetVersion": (DEVICE_SERVICE, False),
    "ListDevices": (DEVICE_SERVICE, False),
    "WatchDevices": (DEVICE_SERVICE, True),
    "Allocate": (DEVICE_SERVICE, False),
    "Release": (DEVICE_SERVICE, False),
    "ListAllocations": (DEVICE_SERVICE, False),
    "UpdateAllocationOwner": (DEVICE_SERVICE, False),
    "GetDeviceMetrics": (MONITOR_SERVICE, False),
    "GetAllocationUsage": (MONITOR_SERVICE, False),
}

#: Bytes no protobuf parser takes: field 1 as a length-delimited value longer than the buffer.
NOT_PROTOBUF = b"\x0a\xff\xff\xff\x0fnot protobuf"


def non_utf8_string_field(*path: int) -> bytes:
    """A string field holding invalid UTF-8 (proto3 strings must be UTF-8), at ``path``: the
    field numbers from the outer message down, e.g. ``(1, 1)`` for ``devices[0].id`` of a
    ListDevicesResponse. Field numbers below 16 only (one-byte tags)."""
    payload = b"\xff\xfe\xc3\x28"
    for number in reversed(path or (1,)):
        if not 0 < number < 16 or len(payload) > 127:
            raise ValueError("small field numbers and payloads only")
        payload = bytes([(number << 3) | 2, len(payload)]) + payload
    return payload


def encode(message: Message) -> bytes:
    return message.SerializeToString()


@dataclass
class Behaviour:
    """How one method answers.

    ``replies``: the bytes of each answer (a unary method uses the first; a stream sends them in
    order). ``delay_s``: wait before each answer. ``hang``: never answer. ``abort``: end with this
    status after the replies (a stream failing half-way; a unary call failing outright).
    """

    replies: Sequence[bytes] = (b"",)
    delay_s: float = 0.0
    hang: bool = False
    abort: grpc.StatusCode | None = None
    calls: int = 0


def _identity(b: bytes) -> bytes:
    return b


@dataclass
class HostileRuntime:
    """Both Runtime sockets in ``socket_dir``, each method answering by ``behaviours``."""

    socket_dir: Path
    behaviours: dict[str, Behaviour] = field(default_factory=dict)
    _servers: list[grpc.aio.Server] = field(default_factory=list)

    def answer(self, method: str, *replies: bytes | Message, **kw: object) -> Behaviour:
        """Set how ``method`` answers; messages are serialized, bytes are sent as they are."""
        if method not in METHODS:
            raise KeyError(f"unknown Runtime method {method!r}; known: {sorted(METHODS)}")
        raw = [r if isinstance(r, bytes) else encode(r) for r in replies] or [b""]
        b = Behaviour(replies=raw, **kw)  # type: ignore[arg-type]
        self.behaviours[method] = b
        return b

    def calls(self, method: str) -> int:
        b = self.behaviours.get(method)
        return b.calls if b is not None else 0

    def _behaviour(self, method: str) -> Behaviour:
        return self.behaviours.setdefault(method, Behaviour())

    def _unary(self, method: str) -> grpc.RpcMethodHandler[bytes, bytes]:
        async def handle(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
            b = self._behaviour(method)
            b.calls += 1
            if b.hang:
                await asyncio.Event().wait()
            if b.delay_s:
                await asyncio.sleep(b.delay_s)
            if b.abort is not None:
                await context.abort(b.abort, f"hostile runtime: {method} aborted")
            return b.replies[0]

        return grpc.unary_unary_rpc_method_handler(
            handle, request_deserializer=_identity, response_serializer=_identity
        )

    def _stream(self, method: str) -> grpc.RpcMethodHandler[bytes, bytes]:
        async def handle(
            request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]
        ) -> AsyncIterator[bytes]:
            b = self._behaviour(method)
            b.calls += 1
            for r in b.replies:
                if b.delay_s:
                    await asyncio.sleep(b.delay_s)
                yield r
            if b.hang:
                await asyncio.Event().wait()
            if b.abort is not None:
                await context.abort(b.abort, f"hostile runtime: {method} failed mid-stream")

        return grpc.unary_stream_rpc_method_handler(
            handle, request_deserializer=_identity, response_serializer=_identity
        )

    async def start(self) -> None:
        for service, socket in (
            (DEVICE_SERVICE, sockets.DEVICE_SOCKET),
            (MONITOR_SERVICE, sockets.MONITOR_SOCKET),
        ):
            handlers = {
                m: (self._stream(m) if streams else self._unary(m))
                for m, (svc, streams) in METHODS.items()
                if svc == service
            }
            server = grpc.aio.server()
            server.add_generic_rpc_handlers(
                (grpc.method_handlers_generic_handler(service, handlers),)
            )
            server.add_insecure_port(sockets.unix_target(str(self.socket_dir / socket)))
            await server.start()
            self._servers.append(server)

    async def stop(self) -> None:
        for s in self._servers:
            await s.stop(None)
        self._servers.clear()
        for name in (sockets.DEVICE_SOCKET, sockets.MONITOR_SOCKET):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.socket_dir / name)


async def serve_bytes(socket_path: str, service: str, method: str, reply: bytes) -> grpc.aio.Server:
    """A started server on ``socket_path`` whose unary ``service/method`` answers ``reply`` as
    it is (e.g. a kubelet pod-resources socket, ``v1.PodResourcesLister``/``List``, answering
    garbage); stop it with ``await server.stop(None)``."""

    async def handle(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        return reply

    server = grpc.aio.server()
    handler = grpc.unary_unary_rpc_method_handler(
        handle, request_deserializer=_identity, response_serializer=_identity
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service, {method: handler}),)
    )
    server.add_insecure_port(sockets.unix_target(socket_path))
    await server.start()
    return server


@contextlib.contextmanager
def socket_dir() -> Iterator[Path]:
    """A short private directory for the sockets (unix socket paths are limited to 108 bytes)."""
    with tempfile.TemporaryDirectory(prefix="ljhost-", dir="/tmp") as d:
        yield Path(d)


def version_reply(*capabilities: str) -> device_pb2.GetVersionResponse:
    return device_pb2.GetVersionResponse(
        version="hostile", api_version="v1", capabilities=capabilities
    )


def metrics_reply(*devices: monitor_pb2.DeviceMetrics) -> monitor_pb2.GetDeviceMetricsResponse:
    return monitor_pb2.GetDeviceMetricsResponse(devices=devices)
