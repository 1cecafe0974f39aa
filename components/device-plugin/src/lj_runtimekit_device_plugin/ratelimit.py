"""The client-side rate limit every LJ RuntimeKit daemon that writes to the apiserver shares.

Shape file (docs/shape.md): every component with ``--kube-api-qps``/``--kube-api-burst``
carries this file as ``ratelimit.py``, byte for byte; ``tests/shape_tests/test_drift.py`` fails
when a copy differs from ``tests/shape_tests/canonical/ratelimit.py``.

A token bucket as client-go's QPS/burst, served first come first served: each caller *reserves*
the next token, which may lie in the future (the count goes negative), then sleeps until it is
due, as ``golang.org/x/time/rate``'s ``Reserve``/``Wait`` do. So waiting requests go out in the
order they asked, and none is starved by later ones that happened to wake first.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable


class TokenBucket:
    """``qps`` tokens per second on average, at most ``burst`` at once."""

    def __init__(
        self, qps: float, burst: int, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not qps > 0:
            raise ValueError(f"qps {qps}: expected a positive number")
        self.qps, self.burst, self.clock = qps, max(1, burst), clock
        self.tokens = float(self.burst)
        self.at = clock()
        self._last_due = -math.inf  # the event loop time the latest waiter wakes at
        self._waiting = 0  # waiters whose wake-up has not run yet

    def reserve(self) -> float:
        """Take the next token; seconds until it is due (0: now). The caller must wait that
        long, or hand the token back with :meth:`cancel`."""
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.qps)
        self.at = now
        self.tokens -= 1
        return 0.0 if self.tokens >= 0 else -self.tokens / self.qps

    def cancel(self) -> None:
        """Give back a reserved token that was not used: later reservations come sooner."""
        self.tokens = min(self.burst, self.tokens + 1)

    async def wait(self) -> None:
        """Wait for the next token (cancellation hands it back)."""
        delay = self.reserve()
        if delay <= 0 and not self._waiting:
            return
        # Each waiter wakes strictly after the one that reserved before it, at a time fixed now:
        # `asyncio.sleep(delay)` reads the clock again later, and a waiter preempted in between
        # (a busy machine) would wake after the next one. A token due at once still queues
        # behind earlier waiters whose wake-up has not run yet (their due time may have passed
        # while the loop was busy), or it would go out before them.
        loop = asyncio.get_running_loop()
        due = max(loop.time() + max(delay, 0.0), math.nextafter(self._last_due, math.inf))
        self._last_due = due
        woken = loop.create_future()
        timer = loop.call_at(due, _wake, woken)
        self._waiting += 1
        try:
            await woken
        except asyncio.CancelledError:
            timer.cancel()
            self.cancel()
            raise
        finally:
            self._waiting -= 1


def _wake(woken: asyncio.Future[None]) -> None:
    if not woken.done():
        woken.set_result(None)
