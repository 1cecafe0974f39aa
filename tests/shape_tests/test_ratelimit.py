"""The shared token bucket: client-go's QPS/burst, reservations served in the order asked."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.shape_tests.canonical.ratelimit import TokenBucket


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_goes_at_once_then_one_token_per_interval() -> None:
    clock = Clock()
    bucket = TokenBucket(qps=10, burst=3, clock=clock)
    assert [bucket.reserve() for _ in range(3)] == [0.0, 0.0, 0.0]
    # later callers reserve future tokens in order: due at 0.1, 0.2, 0.3 s
    assert [round(bucket.reserve(), 9) for _ in range(3)] == [0.1, 0.2, 0.3]


def test_a_cancelled_reservation_makes_the_next_one_sooner() -> None:
    clock = Clock()
    bucket = TokenBucket(qps=1, burst=1, clock=clock)
    assert bucket.reserve() == 0.0
    assert bucket.reserve() == 1.0
    bucket.cancel()
    assert bucket.reserve() == 1.0


@settings(max_examples=50, deadline=None)
@given(
    qps=st.floats(min_value=0.5, max_value=1000),
    burst=st.integers(min_value=1, max_value=50),
    gaps=st.lists(st.floats(min_value=0, max_value=2), min_size=1, max_size=60),
)
def test_over_any_window_no_more_than_burst_plus_rate_times_time_go_out(
    qps: float, burst: int, gaps: list[float]
) -> None:
    clock = Clock()
    bucket = TokenBucket(qps=qps, burst=burst, clock=clock)
    due: list[float] = []
    for gap in gaps:
        clock.now += gap
        due.append(clock.now + bucket.reserve())
    assert due == sorted(due)  # first come, first served
    for i, start in enumerate(due):
        for j in range(i, len(due)):
            # requests i..j all go out within [start, due[j]]
            assert j - i + 1 <= burst + (due[j] - start) * qps + 1e-6


def test_qps_must_be_positive() -> None:
    with pytest.raises(ValueError, match="qps 0"):
        TokenBucket(qps=0, burst=1)


async def test_wait_cancelled_hands_the_token_back() -> None:
    bucket = TokenBucket(qps=0.001, burst=1)
    await bucket.wait()
    waiter = asyncio.create_task(bucket.wait())
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert bucket.tokens > -1  # the reserved token came back


async def test_a_waiter_preempted_between_reserving_and_sleeping_still_goes_before_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A busy machine (make test's parallel workers) preempts the 10th waiter for 5 ms right
    # after it reserved: it must still wake before the 11th (it woke after it when the wait
    # read the clock a second time).
    jump = [0.0]

    def clock() -> float:
        return time.monotonic() + jump[0]

    monkeypatch.setattr(asyncio.get_running_loop(), "time", clock)
    bucket = TokenBucket(qps=2000, burst=1, clock=clock)
    reserve, calls = bucket.reserve, itertools.count()

    def preempted() -> float:
        delay = reserve()
        if next(calls) == 10:
            jump[0] += 0.005
        return delay

    monkeypatch.setattr(bucket, "reserve", preempted)
    order: list[int] = []

    async def one(i: int) -> None:
        await bucket.wait()
        order.append(i)

    await asyncio.gather(*(one(i) for i in range(30)))
    assert order == list(range(30))


async def test_a_token_due_at_once_still_waits_behind_earlier_waiters(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The machine stalls for 10 ms right after the 2nd caller reserved (due in 1 ms): by the
    # time the 3rd asks, the bucket has refilled and its token is due at once. It must still go
    # after the 2nd, whose wake-up the busy loop has not run yet (it went first in the full run
    # of make test: [0, 11, 1, 2, ...]).
    jump = [0.0]

    def clock() -> float:
        return time.monotonic() + jump[0]

    monkeypatch.setattr(asyncio.get_running_loop(), "time", clock)
    bucket = TokenBucket(qps=1000, burst=1, clock=clock)
    reserve, calls = bucket.reserve, itertools.count()

    def stalled() -> float:
        delay = reserve()
        if next(calls) == 1:
            jump[0] += 0.010
        return delay

    monkeypatch.setattr(bucket, "reserve", stalled)
    order: list[int] = []

    async def one(i: int) -> None:
        await bucket.wait()
        order.append(i)

    await asyncio.gather(*(one(i) for i in range(3)))
    assert order == [0, 1, 2]
