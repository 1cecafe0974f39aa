"""The shared leader elector: client-go's semantics, safe under clock skew between replicas.

Fake clocks and a fake Lease API with the apiserver's optimistic concurrency (resourceVersion):
no sleeps, no timed assertions.
"""

from __future__ import annotations

import asyncio
import copy
import functools
from typing import Any

import pytest

from tests.shape_tests.canonical.leader import Elector, LeaseConflict, LeaseError

Json = dict[str, Any]


class Apiserver:
    """One Lease with resourceVersion checks, as the apiserver keeps it."""

    def __init__(self) -> None:
        self.lease: Json | None = None
        self.version = 0
        self.down = False

    def _check(self) -> None:
        if self.down:
            raise LeaseError("apiserver unreachable")


class Api:
    """One replica's view of the apiserver (the LeaseApi an adapter provides)."""

    def __init__(self, server: Apiserver) -> None:
        self.server = server

    async def get(self) -> Json | None:
        self.server._check()
        return copy.deepcopy(self.server.lease)

    async def create(self, lease: Json) -> Json:
        self.server._check()
        if self.server.lease is not None:
            raise LeaseConflict("409: exists")
        return self._store(lease)

    async def replace(self, lease: Json) -> Json:
        self.server._check()
        current = self.server.lease
        if current is None or lease["metadata"].get("resourceVersion") != str(self.server.version):
            raise LeaseConflict("409: the object has been modified")
        return self._store(lease)

    def _store(self, lease: Json) -> Json:
        self.server.version += 1
        stored = copy.deepcopy(lease)
        stored["metadata"]["resourceVersion"] = str(self.server.version)
        self.server.lease = stored
        return copy.deepcopy(stored)


class Clock:
    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def replica(
    server: Apiserver, name: str, clock: Clock, wall: str = "2026-01-01T00:00:00Z"
) -> Elector:
    return Elector(
        Api(server),
        name,
        namespace="kube-system",
        name="lj-test",
        lease_duration=15.0,
        renew_deadline=10.0,
        retry_period=2.0,
        clock=clock,
        wall=lambda: wall,
    )


async def test_a_follower_never_takes_a_lease_that_keeps_changing_however_old_its_times() -> None:
    # The leader's wall clock is an hour behind: every renewTime it writes looks expired to a
    # follower that compares it with its own clock (the bug of the v1.13 electors).
    server = Apiserver()
    leader_clock, follower_clock = Clock(), Clock(5000.0)
    leader = replica(server, "a", leader_clock, wall="2026-01-01T00:00:00Z")
    follower = replica(server, "b", follower_clock, wall="2026-01-01T01:00:00Z")
    assert await leader.try_acquire_or_renew()
    for step in range(20):
        follower_clock.now += 5
        leader_clock.now += 5
        # the leader renews: the record changes (a new resourceVersion, a new renewTime)
        leader.wall = functools.partial(str, f"2026-01-01T00:00:{step:02d}Z")
        assert await leader.try_acquire_or_renew()
        assert not await follower.try_acquire_or_renew(), f"taken over at step {step}"


async def test_a_follower_takes_over_only_a_full_lease_duration_after_the_record_stopped() -> None:
    server = Apiserver()
    clock = Clock()
    leader = replica(server, "a", clock)
    follower = replica(server, "b", clock)
    assert await leader.try_acquire_or_renew()
    clock.now = 1000.0  # the follower first sees the record long after it was written
    assert not await follower.try_acquire_or_renew()  # first sight: its own wait starts now
    clock.now = 1014.9
    assert not await follower.try_acquire_or_renew()
    clock.now = 1015.0
    assert await follower.try_acquire_or_renew()
    spec = (server.lease or {})["spec"]
    assert spec["holderIdentity"] == "b"
    assert spec["leaseTransitions"] == 1


async def test_the_leader_keeps_its_acquire_time_and_transitions_when_it_renews() -> None:
    server = Apiserver()
    clock = Clock()
    leader = replica(server, "a", clock, wall="t0")
    assert await leader.try_acquire_or_renew()
    leader.wall = lambda: "t1"
    assert await leader.try_acquire_or_renew()
    spec = (server.lease or {})["spec"]
    assert (spec["acquireTime"], spec["renewTime"], spec["leaseTransitions"]) == ("t0", "t1", 0)


async def test_a_released_lease_is_taken_at_once() -> None:
    server = Apiserver()
    clock = Clock()
    leader, follower = replica(server, "a", clock), replica(server, "b", clock)
    assert await leader.try_acquire_or_renew()
    leader.leading.set()
    assert not await follower.try_acquire_or_renew()
    await leader.release()
    assert (server.lease or {})["spec"]["holderIdentity"] == ""
    assert not leader.leading.is_set()
    assert await follower.try_acquire_or_renew()


async def test_two_replicas_racing_for_a_free_lease_never_both_win() -> None:
    server = Apiserver()
    clock = Clock()
    a, b = replica(server, "a", clock), replica(server, "b", clock)
    results = await asyncio.gather(a.try_acquire_or_renew(), b.try_acquire_or_renew())
    assert sorted(results) == [False, True]


async def test_the_leader_stops_leading_when_it_could_not_renew_for_the_renew_deadline() -> None:
    server = Apiserver()
    clock = Clock()
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.now += seconds
        if len(slept) == 2:
            server.down = True  # the apiserver goes away after the first renewal
        await asyncio.sleep(0)

    leader = replica(server, "a", clock)
    leader.sleep = sleep
    await asyncio.wait_for(leader.run(), 5)
    assert leader.lost.is_set()
    assert not leader.leading.is_set()
    # renewed at t=2, then failed at 4, 6, 8, 10 and gave up at 12: 10 s after the last renewal,
    # before a follower's 15 s wait from its last sight of the record is over
    assert clock.now == 12.0


def test_renew_deadline_must_be_shorter_than_the_lease() -> None:
    with pytest.raises(ValueError, match="retry_period < renew_deadline < lease_duration"):
        Elector(
            Api(Apiserver()), "a", namespace="n", name="l", lease_duration=10, renew_deadline=10
        )
