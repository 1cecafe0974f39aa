"""The shared Runtime channel helpers: the guide's backoff and one decoding of unknown enums."""

from __future__ import annotations

import pytest

from lj_runtimekit_interface.runtime.v1 import device_pb2
from tests.shape_tests.canonical import runtime_channel


@pytest.mark.parametrize(
    ("failures", "delay"),
    [(0, 0.0), (1, 1.0), (2, 2.0), (3, 4.0), (5, 16.0), (6, 30.0), (10**12, 30.0)],
    ids=["none", "1st", "2nd", "3rd", "5th", "capped", "huge-count"],
)
def test_backoff_is_the_guides(failures: int, delay: float) -> None:
    assert runtime_channel.backoff_s(failures) == delay


def test_the_channel_reconnects_by_the_same_backoff() -> None:
    options = dict(runtime_channel.CHANNEL_OPTIONS)
    assert options["grpc.initial_reconnect_backoff_ms"] == 1000
    assert options["grpc.max_reconnect_backoff_ms"] == 30000


@pytest.mark.parametrize(
    ("number", "name"),
    [(device_pb2.PARTITION_MODE_MIG, "mig"), (0, "unspecified"), (999, "unknown")],
    ids=["known", "zero", "newer-runtime"],
)
def test_enum_names_and_an_unknown_number(number: int, name: str) -> None:
    assert runtime_channel.enum_name(device_pb2.PartitionMode, number, "PARTITION_MODE_") == name
