"""containerd's ttrpc, multiplexed the way NRI multiplexes it, on one asyncio unix socket.

No Python library speaks ttrpc or NRI's multiplexer (PyPI has neither), so this is our own small
implementation of the two wire formats, written from their definitions:

- NRI's multiplexer (``nri/pkg/net/multiplex``): the socket carries frames of an 8-byte header
  (connection id, payload length, both big-endian uint32) and the payload; connection 1 carries
  the plugin's service (the runtime calls the plugin), connection 2 the runtime's service (the
  plugin calls the runtime). A connection's frames form a byte stream.
- ttrpc (``containerd/ttrpc``, channel.go) on each connection: messages of a 10-byte header
  (length, stream id: big-endian uint32; type; flags) and a protobuf payload, a ``ttrpc.Request``
  or ``ttrpc.Response``. A client numbers its streams 1, 3, 5, ...; a unary call is one request
  (flag "remote closed") and one response on the same stream.

Only unary calls are supported: NRI uses nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog
from google.protobuf.message import DecodeError

from lj_runtimekit_interface.nri.ttrpc import request_pb2

log = structlog.get_logger(__name__)

MUX_HEADER = struct.Struct(">II")
MESSAGE_HEADER = struct.Struct(">IIBB")
#: NRI's connection ids: where the plugin serves, and where the runtime serves.
PLUGIN_CONN = 1
RUNTIME_CONN = 2
REQUEST = 1
RESPONSE = 2
FLAG_REMOTE_CLOSED = 0x1
#: ttrpc refuses messages above 4 MiB; so do we, before buffering one.
MAX_MESSAGE = 4 << 20
#: The multiplexer's largest frame: one whole ttrpc message.
MAX_FRAME = MESSAGE_HEADER.size + MAX_MESSAGE
#: gRPC status codes a ttrpc response carries.
UNIMPLEMENTED = 12
INTERNAL = 13

#: (service, method, request payload) → response payload; raise :class:`CallFailed` to answer
#: with an error status.
Handler = Callable[[str, str, bytes], Awaitable[bytes]]


class ProtocolError(Exception):
    """The peer sent bytes that are not the multiplexed ttrpc this module speaks."""


class CallFailed(Exception):
    """A call answered with an error status (or one to answer with)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"ttrpc status {code}: {message}")
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Message:
    stream_id: int
    type: int
    flags: int
    payload: bytes


def frame(conn_id: int, payload: bytes) -> bytes:
    """``payload`` as multiplexer frames on ``conn_id`` (several when it exceeds a frame)."""
    chunks = [payload[i : i + MAX_FRAME] for i in range(0, len(payload), MAX_FRAME)] or [b""]
    return b"".join(MUX_HEADER.pack(conn_id, len(c)) + c for c in chunks)


def message(stream_id: int, kind: int, flags: int, payload: bytes) -> bytes:
    """One ttrpc message; :class:`ProtocolError` above ttrpc's size limit."""
    if len(payload) > MAX_MESSAGE:
        raise ProtocolError(f"a ttrpc message of {len(payload)} bytes exceeds {MAX_MESSAGE}")
    return MESSAGE_HEADER.pack(len(payload), stream_id, kind, flags) + payload


class MessageStream:
    """The ttrpc messages in one connection's bytes, fed in pieces as frames arrive."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Message]:
        self._buf += data
        out = []
        while len(self._buf) >= MESSAGE_HEADER.size:
            length, stream_id, kind, flags = MESSAGE_HEADER.unpack_from(self._buf)
            if length > MAX_MESSAGE:
                raise ProtocolError(f"a ttrpc message of {length} bytes exceeds {MAX_MESSAGE}")
            end = MESSAGE_HEADER.size + length
            if len(self._buf) < end:
                break
            out.append(Message(stream_id, kind, flags, bytes(self._buf[MESSAGE_HEADER.size : end])))
            del self._buf[:end]
        return out


class MuxConnection:
    """Both ends of NRI's socket: serves ``handler`` on ``serve_on`` and calls on ``call_on``.

    A plugin serves on :data:`PLUGIN_CONN` and calls on :data:`RUNTIME_CONN` (the defaults); a
    runtime the other way round. :meth:`run` reads until the peer closes the socket.
    """

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        handler: Handler,
        *,
        serve_on: int = PLUGIN_CONN,
        call_on: int = RUNTIME_CONN,
    ) -> None:
        self._reader, self._writer, self._handler = reader, writer, handler
        self._serve_on, self._call_on = serve_on, call_on
        self._streams = {serve_on: MessageStream(), call_on: MessageStream()}
        self._ids = itertools.count(1, 2)
        self._pending: dict[int, asyncio.Future[bytes]] = {}
        self._handling: set[asyncio.Task[None]] = set()
        self._lock = asyncio.Lock()
        self.closed = asyncio.Event()

    async def call(self, service: str, method: str, payload: bytes, timeout_s: float) -> bytes:
        """The response payload; :class:`CallFailed` on an error status, ``TimeoutError``,
        ``ConnectionError`` when the socket closes first."""
        stream_id = next(self._ids)
        request = request_pb2.Request(
            service=service, method=method, payload=payload, timeout_nano=int(timeout_s * 1e9)
        )
        answer = asyncio.get_running_loop().create_future()
        self._pending[stream_id] = answer
        try:
            raw = request.SerializeToString()
            await self._send(self._call_on, message(stream_id, REQUEST, FLAG_REMOTE_CLOSED, raw))
            async with asyncio.timeout(timeout_s):
                result: bytes = await answer
                return result
        finally:
            self._pending.pop(stream_id, None)

    async def run(self) -> None:
        """Read frames until EOF; :class:`ProtocolError` on garbage. Always closes the socket."""
        try:
            while True:
                try:
                    head = await self._reader.readexactly(MUX_HEADER.size)
                    conn_id, length = MUX_HEADER.unpack(head)
                    if length > MAX_FRAME:
                        raise ProtocolError(f"a frame of {length} bytes exceeds {MAX_FRAME}")
                    data = await self._reader.readexactly(length)
                except asyncio.IncompleteReadError:
                    return
                stream = self._streams.get(conn_id)
                if stream is None:
                    continue  # a connection we do not use: the multiplexer drops those too
                for msg in stream.feed(data):
                    self._dispatch(conn_id, msg)
        finally:
            await self.close()

    async def close(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        for answer in self._pending.values():
            if not answer.done():
                answer.set_exception(ConnectionError("the NRI socket closed"))
        for task in list(self._handling):
            task.cancel()
        self._writer.close()
        with contextlib.suppress(OSError):
            await self._writer.wait_closed()

    def _dispatch(self, conn_id: int, msg: Message) -> None:
        if conn_id == self._call_on and msg.type == RESPONSE:
            answer = self._pending.get(msg.stream_id)
            if answer is not None and not answer.done():
                try:
                    response = request_pb2.Response.FromString(msg.payload)
                except DecodeError as e:
                    raise ProtocolError(f"a ttrpc response that is not one: {e}") from e
                if response.HasField("status") and response.status.code != 0:
                    answer.set_exception(CallFailed(response.status.code, response.status.message))
                else:
                    answer.set_result(response.payload)
        elif conn_id == self._serve_on and msg.type == REQUEST:
            task = asyncio.create_task(self._answer(msg))
            self._handling.add(task)
            task.add_done_callback(self._handling.discard)

    async def _answer(self, msg: Message) -> None:
        response = request_pb2.Response()
        try:
            request = request_pb2.Request.FromString(msg.payload)
            response.payload = await self._handler(request.service, request.method, request.payload)
        except CallFailed as e:
            response.status.code, response.status.message = e.code, e.message
        except DecodeError as e:
            response.status.code, response.status.message = INTERNAL, f"bad request: {e}"
        except Exception as e:  # noqa: BLE001 - a bug must answer, or the peer waits its timeout
            log.error("ttrpc_handler_failed", error=repr(e), stream=msg.stream_id)
            response.status.code, response.status.message = INTERNAL, repr(e)
        with contextlib.suppress(ConnectionError):
            await self._send(
                self._serve_on, message(msg.stream_id, RESPONSE, 0, response.SerializeToString())
            )

    async def _send(self, conn_id: int, data: bytes) -> None:
        if self.closed.is_set():
            raise ConnectionError("the NRI socket closed")
        async with self._lock:
            self._writer.write(frame(conn_id, data))
            await self._writer.drain()


async def connect(
    path: str, handler: Handler, *, serve_on: int = PLUGIN_CONN, call_on: int = RUNTIME_CONN
) -> MuxConnection:
    """A connection to the unix socket ``path`` (``OSError`` when it cannot be reached)."""
    reader, writer = await asyncio.open_unix_connection(path, limit=MAX_FRAME * 2)
    return MuxConnection(reader, writer, handler, serve_on=serve_on, call_on=call_on)
