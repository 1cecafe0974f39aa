"""Warning Events on pods, bounded: what a user sees with ``kubectl describe pod`` when the
plugin refuses it (Allocate, and Prepare in mode dra).

A refusal the kubelet retries (a retry storm, a crash-looping pod, many pods refused at once)
must not flood the apiserver: at most one Event per (pod, reason) per window, and at most a
token bucket's worth (:mod:`.ratelimit`, the suite's shape) overall; what is left out is logged
and counted, never queued.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence

import structlog

from .errors import DevicePluginError
from .podview import PodView
from .ratelimit import TokenBucket

log = structlog.get_logger(__name__)

EventPoster = Callable[[PodView, str, str], Awaitable[None]]
"""(pod, reason, message): a Warning Event on the pod."""

WINDOW_S = 60.0
"""One Event per pod and reason in this long."""
QPS, BURST = 1.0, 20
"""All Events of this plugin: 20 at once, 1 a second on average after that."""


class PodEvents:
    """Warning Events on pods, at most one per (pod uid, reason) per ``window_s`` and a
    ``qps``/``burst`` token bucket overall; without a poster only the log line."""

    def __init__(
        self,
        post: EventPoster | None,
        *,
        window_s: float = WINDOW_S,
        qps: float = QPS,
        burst: int = BURST,
        clock: Callable[[], float] = time.monotonic,
        dropped: Callable[[str], None] | None = None,
    ) -> None:
        self.post = post
        self.window_s = window_s
        self.clock = clock
        self.bucket = TokenBucket(qps, burst, clock=clock)
        self.dropped = dropped or (lambda _: None)
        """Told the reason of each Event left out by the overall bucket (for a metric)."""
        self._last: dict[tuple[str, str], float] = {}

    def _due(self, pod: PodView, reason: str, now: float) -> bool:
        key = (pod.uid, reason)
        last = self._last.get(key)
        if last is not None and now - last < self.window_s:
            return False
        if len(self._last) > 4096:  # forget the expired: the map stays bounded
            self._last = {k: t for k, t in self._last.items() if now - t < self.window_s}
        self._last[key] = now
        return True

    async def warn(self, pods: Sequence[PodView], reason: str, message: str) -> None:
        """A Warning Event on each pod, unless one with this reason went out within the
        window; posting failures are logged, never raised (the refusal itself is the error)."""
        log.warning(
            "pod_warning",
            reason=reason,
            pods=[f"{p.namespace}/{p.name}" for p in pods],
            message=message,
        )
        if self.post is None:
            return
        for p in pods:
            if not self._due(p, reason, self.clock()):
                continue
            if self.bucket.reserve() > 0:
                self.bucket.cancel()
                self.dropped(reason)
                log.info("event_rate_limited", pod=f"{p.namespace}/{p.name}", reason=reason)
                continue
            try:
                await self.post(p, reason, message)
            except DevicePluginError as e:
                log.warning("event_not_posted", pod=f"{p.namespace}/{p.name}", error=str(e))
