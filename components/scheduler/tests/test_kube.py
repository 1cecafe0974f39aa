"""The client-side rate limit: client-go's QPS/burst, served in the order asked."""

from __future__ import annotations

import asyncio

import pytest

from lj_runtimekit_scheduler.kube import TokenBucket


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
        await bucket.take()
        order.append(i)

    await asyncio.gather(*(one(i) for i in range(60)))
    assert order == list(range(60))


async def test_a_cancelled_waiter_gives_its_token_back() -> None:
    clock = Clock()
    bucket = TokenBucket(1, 1, clock=clock)
    await bucket.take()  # the burst
    waiter = asyncio.ensure_future(bucket.take())
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert bucket.reserve() == pytest.approx(1.0)  # not 2.0: the cancelled slot is reused
