"""How every LJ RuntimeKit daemon reaches the Runtime: a gRPC channel on its unix socket.

Shape file (docs/shape.md): every component that talks to the Runtime carries this file as
``runtime_channel.py``, byte for byte; ``tests/shape_tests/test_drift.py`` fails when a copy
differs from ``tests/shape_tests/canonical/runtime_channel.py``. Change the reference and copy it.

Conventions of every call to the Runtime (the component's ``runtime.py`` makes them):

- every unary call has a ``timeout`` (the component's ``rpc_timeout``): the Runtime is
  node-local, a call that takes longer means it is stuck, and nothing may wait unbounded;
- reads that a loop retries by itself (a poll, a health check) fail fast (no
  ``wait_for_ready``), so the daemon notices an absent Runtime and degrades at once; calls a
  kubelet or a reconcile waits on (Allocate, Release, ListAllocations) pass
  ``wait_for_ready=True``, so a Runtime restarting within the timeout is waited for;
- reconnects, of the channel and of the daemon's own loops, follow the guide's backoff: 1 s,
  x2, 30 s at most (:func:`backoff_s`);
- an enum number this build does not know (a newer Runtime) reads as ``unknown``
  (:func:`enum_name`), never as an error.
"""

from __future__ import annotations

import os
from typing import Any, Final

import grpc

from lj_runtimekit_interface import sockets

BACKOFF_INITIAL_S: Final = 1.0
BACKOFF_FACTOR: Final = 2.0
BACKOFF_MAX_S: Final = 30.0
UNKNOWN: Final = "unknown"

#: The channel's own reconnects follow the guide's backoff instead of gRPC's default 120 s
#: ceiling, so a restarted Runtime is found again within the daemon's own backoff.
CHANNEL_OPTIONS: Final = (
    ("grpc.initial_reconnect_backoff_ms", int(BACKOFF_INITIAL_S * 1000)),
    ("grpc.min_reconnect_backoff_ms", int(BACKOFF_INITIAL_S * 1000)),
    ("grpc.max_reconnect_backoff_ms", int(BACKOFF_MAX_S * 1000)),
)


def backoff_s(failures: int) -> float:
    """Seconds to wait after ``failures`` failures in a row: 1, 2, 4, ... at most 30 (0: none)."""
    if failures <= 0:
        return 0.0
    # the exponent is capped before the power: a count from outside must not build a huge int
    exponent = min(failures - 1, 16)
    return float(min(BACKOFF_MAX_S, BACKOFF_INITIAL_S * BACKOFF_FACTOR**exponent))


def socket_path(socket_dir: str, name: str) -> str:
    return os.path.join(socket_dir, name)


def open_channel(path: str) -> grpc.aio.Channel:
    """An insecure channel (a unix socket is guarded by the filesystem) to the socket ``path``."""
    return grpc.aio.insecure_channel(sockets.unix_target(path), options=CHANNEL_OPTIONS)


def enum_name(enum: Any, number: int, prefix: str) -> str:
    """The name of enum value ``number`` without ``prefix``, lower case; ``unknown`` for a number
    this build does not know (a newer Runtime's value)."""
    try:
        name: str = enum.Name(number)
    except ValueError:
        return UNKNOWN
    return name.removeprefix(prefix).lower()
