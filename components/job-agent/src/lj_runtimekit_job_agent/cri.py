"""The only module that asks the running containerd which runtime handlers it has loaded.

The file on disk says what containerd *will* load at its next start; only the running daemon says
what it *has* loaded. The CRI ``RuntimeService/Status`` call answers that: containerd 2.x lists its
handlers in ``runtime_handlers`` (field 3), and every containerd since 1.5 puts its effective CRI
config, runtimes included, as JSON under ``info["config"]`` when asked verbosely.

The three messages needed are declared here from the CRI's field numbers (k8s.io/cri-api
``api.proto``) rather than vendored whole: protobuf ignores the fields we do not declare.
"""

from __future__ import annotations

import json
from typing import Any, Final

from google.protobuf import descriptor_pb2, descriptor_pool, message, message_factory
from grpc import aio

from .errors import TemporaryError

STATUS_METHOD: Final = "/runtime.v1.RuntimeService/Status"


class ContainerdUnreachable(TemporaryError):
    """containerd's CRI socket is absent or does not answer Status."""


def _messages() -> tuple[type[message.Message], type[message.Message]]:
    fd = descriptor_pb2.FileDescriptorProto(
        name="lj_runtimekit_job_agent/cri_status.proto", package="runtime.v1", syntax="proto3"
    )
    opt, rep = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL, 3
    string, boolean, msg = 9, 8, 11
    req = fd.message_type.add(name="StatusRequest")
    req.field.add(name="verbose", number=1, type=boolean, label=opt)
    handler = fd.message_type.add(name="RuntimeHandler")
    handler.field.add(name="name", number=1, type=string, label=opt)
    resp = fd.message_type.add(name="StatusResponse")
    entry = resp.nested_type.add(name="InfoEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=string, label=opt)
    entry.field.add(name="value", number=2, type=string, label=opt)
    resp.field.add(
        name="info", number=2, type=msg, label=rep, type_name=".runtime.v1.StatusResponse.InfoEntry"
    )
    resp.field.add(
        name="runtime_handlers",
        number=3,
        type=msg,
        label=rep,
        type_name=".runtime.v1.RuntimeHandler",
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return (
        message_factory.GetMessageClass(pool.FindMessageTypeByName("runtime.v1.StatusRequest")),
        message_factory.GetMessageClass(pool.FindMessageTypeByName("runtime.v1.StatusResponse")),
    )


StatusRequest, StatusResponse = _messages()


def handlers_of(reply: Any) -> frozenset[str]:
    """The handler names a Status reply shows loaded (either field; empty names dropped)."""
    names = {h.name for h in reply.runtime_handlers if h.name}
    raw = reply.info.get("config")
    if raw:
        try:
            config = json.loads(raw)
            runtimes = config.get("containerd", {}).get("runtimes", {})
        except (ValueError, AttributeError):
            runtimes = {}
        if isinstance(runtimes, dict):
            names.update(str(k) for k in runtimes)
    return frozenset(names)


async def loaded_handlers(socket: str, limit_s: float) -> frozenset[str]:
    """The runtime handlers the containerd serving ``socket`` has loaded now."""
    async with aio.insecure_channel(f"unix://{socket}") as channel:
        call: aio.UnaryUnaryMultiCallable[Any, Any] = channel.unary_unary(
            STATUS_METHOD,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=StatusResponse.FromString,
        )
        try:
            reply = await call(StatusRequest(verbose=True), timeout=limit_s)
        except aio.AioRpcError as e:
            raise ContainerdUnreachable(
                f"containerd CRI at {socket}: Status failed: {e.code().name}: {e.details()}"
            ) from e
    if reply is None:
        # grpc-aio hands back None when the reply bytes are not the message (it only logs why).
        raise ContainerdUnreachable(
            f"containerd CRI at {socket}: Status reply is not a CRI StatusResponse"
        )
    return handlers_of(reply)
