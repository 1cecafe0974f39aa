"""NRI's multiplexed ttrpc: the bytes on the wire as the Go definitions lay them out, a stream
cut anywhere, garbage, and a peer written here byte by byte (not with the module under test)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lj_runtimekit_device_plugin.dra import ttrpc
from lj_runtimekit_interface.nri.ttrpc import request_pb2


def test_a_frame_is_conn_id_and_length_big_endian_then_the_payload() -> None:
    assert ttrpc.frame(2, b"abc") == b"\x00\x00\x00\x02\x00\x00\x00\x03abc"


def test_a_frame_larger_than_a_ttrpc_message_is_split() -> None:
    data = ttrpc.frame(1, b"x" * (ttrpc.MAX_FRAME + 5))
    assert data[:8] == struct.pack(">II", 1, ttrpc.MAX_FRAME)
    assert data[8 + ttrpc.MAX_FRAME : 16 + ttrpc.MAX_FRAME] == struct.pack(">II", 1, 5)


def test_a_message_is_length_stream_type_flags_then_the_payload() -> None:
    raw = ttrpc.message(3, ttrpc.REQUEST, ttrpc.FLAG_REMOTE_CLOSED, b"xy")
    assert raw == b"\x00\x00\x00\x02\x00\x00\x00\x03\x01\x01xy"


def test_a_message_above_ttrpcs_limit_is_refused_before_it_is_buffered() -> None:
    stream = ttrpc.MessageStream()
    with pytest.raises(ttrpc.ProtocolError):
        stream.feed(struct.pack(">IIBB", ttrpc.MAX_MESSAGE + 1, 1, 1, 0))


@given(st.lists(st.binary(max_size=40), max_size=5), st.lists(st.integers(0, 200), max_size=8))
def test_messages_cut_anywhere_come_out_whole_and_in_order(
    payloads: list[bytes], cuts: list[int]
) -> None:
    wire = b"".join(ttrpc.message(2 * i + 1, ttrpc.RESPONSE, 0, p) for i, p in enumerate(payloads))
    stream = ttrpc.MessageStream()
    got = []
    start = 0
    for cut in [*sorted({min(c, len(wire)) for c in cuts}), len(wire)]:
        got += stream.feed(wire[start:cut])
        start = cut
    assert [(m.stream_id, m.payload) for m in got] == [
        (2 * i + 1, p) for i, p in enumerate(payloads)
    ]


@given(st.binary(max_size=300))
def test_garbage_is_a_protocol_error_or_waits_for_more(data: bytes) -> None:
    with contextlib.suppress(ttrpc.ProtocolError):
        ttrpc.MessageStream().feed(data)


async def _read_frame(reader: asyncio.StreamReader) -> tuple[int, ttrpc.Message]:
    conn_id, length = struct.unpack(">II", await reader.readexactly(8))
    body = await reader.readexactly(length)
    size, stream_id, kind, flags = struct.unpack(">IIBB", body[:10])
    assert size == len(body) - 10
    return conn_id, ttrpc.Message(stream_id, kind, flags, body[10:])


def _frame(conn_id: int, stream_id: int, kind: int, flags: int, payload: bytes) -> bytes:
    body = struct.pack(">IIBB", len(payload), stream_id, kind, flags) + payload
    return struct.pack(">II", conn_id, len(body)) + body


async def test_a_plugin_end_calls_on_conn_2_and_answers_on_conn_1() -> None:
    ours, theirs = socket.socketpair()
    reader, writer = await asyncio.open_connection(sock=ours)
    peer_r, peer_w = await asyncio.open_connection(sock=theirs)

    async def handler(service: str, method: str, payload: bytes) -> bytes:
        if method == "Fail":
            raise ttrpc.CallFailed(ttrpc.UNIMPLEMENTED, "no")
        return f"{service}/{method}:".encode() + payload

    conn = ttrpc.MuxConnection(reader, writer, handler)
    running = asyncio.create_task(conn.run())
    call = asyncio.create_task(conn.call("svc.Runtime", "Register", b"hi", 5))
    conn_id, msg = await _read_frame(peer_r)
    assert (conn_id, msg.stream_id, msg.type, msg.flags) == (2, 1, 1, 1)
    req = request_pb2.Request.FromString(msg.payload)
    assert (req.service, req.method, req.payload) == ("svc.Runtime", "Register", b"hi")
    assert req.timeout_nano == 5_000_000_000
    # the runtime calls the plugin meanwhile, on conn 1, with its own stream 1
    asked = request_pb2.Request(service="svc.Plugin", method="Configure", payload=b"c")
    peer_w.write(_frame(1, 1, 1, 1, asked.SerializeToString()))
    failing = request_pb2.Request(service="svc.Plugin", method="Fail")
    peer_w.write(_frame(1, 3, 1, 1, failing.SerializeToString()))
    answers: dict[int, request_pb2.Response] = {}
    for _ in range(2):
        conn_id, msg = await _read_frame(peer_r)
        assert (conn_id, msg.type, msg.flags) == (1, 2, 0)
        answers[msg.stream_id] = request_pb2.Response.FromString(msg.payload)
    assert answers[1].payload == b"svc.Plugin/Configure:c"
    assert answers[1].status.code == 0
    assert answers[3].status.code == ttrpc.UNIMPLEMENTED
    # the runtime's answer to our call; a status with code 0 is a success
    reply = request_pb2.Response(payload=b"ok")
    reply.status.code = 0
    peer_w.write(_frame(2, 1, 2, 0, reply.SerializeToString()))
    assert await call == b"ok"
    failed = asyncio.create_task(conn.call("svc.Runtime", "Register", b"", 5))
    _, msg = await _read_frame(peer_r)
    assert msg.stream_id == 3
    refusal = request_pb2.Response()
    refusal.status.code, refusal.status.message = 9, "taken"
    peer_w.write(_frame(2, 3, 2, 0, refusal.SerializeToString()))
    with pytest.raises(ttrpc.CallFailed, match="taken"):
        await failed
    # the peer going away ends run() and fails what is still waiting
    pending = asyncio.create_task(conn.call("svc.Runtime", "Register", b"", 5))
    await _read_frame(peer_r)
    peer_w.close()
    await running
    with pytest.raises(ConnectionError):
        await pending
    await peer_w.wait_closed()


async def test_a_response_that_is_not_one_ends_the_connection() -> None:
    ours, theirs = socket.socketpair()
    reader, writer = await asyncio.open_connection(sock=ours)
    peer_r, peer_w = await asyncio.open_connection(sock=theirs)

    async def handler(service: str, method: str, payload: bytes) -> bytes:
        return b""

    conn = ttrpc.MuxConnection(reader, writer, handler)
    running = asyncio.create_task(conn.run())
    call = asyncio.create_task(conn.call("s", "m", b"", 5))
    await _read_frame(peer_r)
    peer_w.write(_frame(2, 1, 2, 0, b"\xff\xff\xff"))
    with pytest.raises(ttrpc.ProtocolError):
        await running
    with pytest.raises(ConnectionError):
        await call
    peer_w.close()
    await peer_w.wait_closed()
