"""The background poll: one snapshot per round, backoff while the Runtime is away, no crash."""

from __future__ import annotations

import pytest

from lj_runtimekit_exporter.collector import State
from lj_runtimekit_exporter.errors import TemporaryError
from lj_runtimekit_exporter.poller import Poller
from lj_runtimekit_exporter.runtime_channel import backoff_s
from lj_runtimekit_exporter.snapshot import Pod, RuntimeState


class ScriptedRuntime:
    """A RuntimeSource whose answers a test sets: a state, or an error to raise."""

    def __init__(self) -> None:
        self.missing: set[str] = set()
        self.error: Exception | None = None
        self.versions = 0
        self.reconnects = 0

    async def version(self) -> tuple[str, str]:
        if self.error is not None:
            raise self.error
        self.versions += 1
        return "v1.13.0", "v1"

    async def read(self, version: tuple[str, str]) -> RuntimeState:
        if self.error is not None:
            raise self.error
        return RuntimeState(version[0], version[1], (), (), (), ())

    async def reconnect(self) -> None:
        self.reconnects += 1


class ScriptedPods:
    def __init__(self) -> None:
        self.error: Exception | None = None

    async def pods(self) -> tuple[Pod, ...]:
        if self.error is not None:
            raise self.error
        return (Pod("ns", "p", "u"),)


def make() -> tuple[Poller, State, ScriptedRuntime, ScriptedPods]:
    state = State(node="n", pods_source="kubelet")
    rt, pods = ScriptedRuntime(), ScriptedPods()
    return Poller(state, rt, pods, interval=5.0, clock=lambda: 100.0), state, rt, pods


@pytest.mark.parametrize(
    ("attempt", "delay"),
    [(1, 1.0), (2, 2.0), (3, 4.0), (5, 16.0), (6, 30.0), (50, 30.0), (10**9, 30.0)],
    ids=["1st", "2nd", "3rd", "5th", "capped", "long-outage", "huge-count"],
)
def test_reconnect_backoff_is_the_guides(attempt: int, delay: float) -> None:
    assert backoff_s(attempt) == delay


async def test_a_round_publishes_a_snapshot_with_runtime_and_pods() -> None:
    poller, state, _, _ = make()
    snap = await poller.poll_once()
    assert state.snapshot is snap
    assert snap.runtime is not None
    assert snap.pods == (Pod("ns", "p", "u"),)
    assert state.stats.collections == 1
    assert poller.next_delay() == 5.0


@pytest.mark.parametrize(
    "error",
    [TemporaryError("socket gone"), ValueError("garbage"), TypeError("garbage")],
    ids=["unavailable", "value-error", "type-error"],
)
async def test_an_unreachable_runtime_gives_runtime_none_then_backoff_then_recovery(
    error: Exception,
) -> None:
    poller, state, rt, _ = make()
    await poller.poll_once()
    rt.error = error
    for attempt in (1, 2, 3):
        snap = await poller.poll_once()
        assert snap.runtime is None
        assert poller.next_delay() == backoff_s(attempt)
    assert state.stats.errors["runtime"] == 3
    rt.error = None
    snap = await poller.poll_once()
    assert snap.runtime is not None
    assert rt.reconnects == 3, "each retry dials fresh channels"
    assert rt.versions == 2, "the version is asked again of a restarted Runtime"
    assert poller.next_delay() == 5.0


async def test_an_unreadable_pod_list_keeps_the_last_list_read_and_says_so() -> None:
    poller, state, _, pods = make()
    pods.error = TemporaryError("kubelet down")
    snap = await poller.poll_once()
    assert (snap.pods, snap.pods_up) == (None, False), "never read: trust the Runtime"
    assert snap.runtime is not None
    pods.error = None
    await poller.poll_once()
    pods.error = TemporaryError("kubelet down again")
    snap = await poller.poll_once()
    assert (snap.pods, snap.pods_up) == ((Pod("ns", "p", "u"),), False)
    assert state.stats.errors["pods"] == 2
