"""The apiserver edge: the client-side rate limit (client-go's QPS/burst, served in the order
asked; the shape's ratelimit.py) and the Lease adapter the elector uses."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from lj_runtimekit_scheduler.errors import PermanentError, TemporaryError
from lj_runtimekit_scheduler.kube import Json, Kube, Lease
from lj_runtimekit_scheduler.leader import LeaseConflict, LeaseError
from lj_runtimekit_scheduler.ratelimit import TokenBucket
from lj_runtimekit_scheduler.settings import Settings


class Clock:
    """A clock that only moves when a waiter sleeps."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_is_free_then_tokens_come_at_the_rate() -> None:
    clock = Clock()
    bucket = TokenBucket(10, 3, clock=clock)
    waits = [bucket.reserve() for _ in range(6)]
    assert waits == pytest.approx([0, 0, 0, 0.1, 0.2, 0.3])
    clock.now = 0.3  # the debt is paid: the next token is due in 0.1 s again
    assert bucket.reserve() == pytest.approx(0.1)
    clock.now = 10.0  # idle for long: back to a full burst, never more
    assert [bucket.reserve() for _ in range(4)] == pytest.approx([0, 0, 0, 0.1])


async def test_waiters_are_served_in_the_order_they_asked() -> None:
    bucket = TokenBucket(2000, 1)
    order: list[int] = []

    async def one(i: int) -> None:
        await bucket.wait()
        order.append(i)

    await asyncio.gather(*(one(i) for i in range(60)))
    assert order == list(range(60))


async def test_a_cancelled_waiter_gives_its_token_back() -> None:
    clock = Clock()
    bucket = TokenBucket(1, 1, clock=clock)
    await bucket.wait()  # the burst
    waiter = asyncio.ensure_future(bucket.wait())
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert bucket.reserve() == pytest.approx(1.0)  # not 2.0: the cancelled slot is reused


def test_the_client_limits_are_kube_scheduler_s_by_default() -> None:
    kube = Kube(cast(Any, None), Settings())
    assert (kube.limit.qps, kube.limit.burst) == (50.0, 100)
    assert (kube.event_limit.qps, kube.event_limit.burst) == (50.0, 100)


class FakeKube:
    """get_lease/put_lease answering as Kube does for a given apiserver status."""

    def __init__(self, error: Exception | None) -> None:
        self.error = error

    async def get_lease(self, namespace: str, name: str) -> Json | None:
        if self.error is not None:
            raise self.error
        return None

    async def put_lease(self, namespace: str, lease: Json, create: bool) -> Json:
        if self.error is not None:
            raise self.error
        return lease


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (PermanentError("renew lease x: apiserver answered 409: conflict"), LeaseConflict),
        (PermanentError("renew lease x: apiserver answered 403: forbidden"), LeaseError),
        (TemporaryError("renew lease x: apiserver unreachable"), LeaseError),
    ],
    ids=["409-lost-race", "403", "unreachable"],
)
async def test_lease_writes_fail_as_the_elector_expects(
    error: Exception, expected: type[Exception]
) -> None:
    lease = Lease(cast(Kube, FakeKube(error)), "kube-system", "x")
    with pytest.raises(expected) as caught:
        await lease.replace({"metadata": {"name": "x"}})
    assert type(caught.value) is expected
    with pytest.raises(LeaseError):
        await lease.get()


async def test_an_absent_lease_reads_none() -> None:
    assert await Lease(cast(Kube, FakeKube(None)), "kube-system", "x").get() is None
