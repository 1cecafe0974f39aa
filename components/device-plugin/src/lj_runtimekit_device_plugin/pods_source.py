"""Where the pods of this node come from (``pods_source``; issue 39).

``kubelet`` reads the kubelet's read-only ``/pods`` (port 10255, the guide's way), ``apiserver``
lists the pods whose ``spec.nodeName`` is this node. ``auto``, the default, reads the kubelet
while it answers and the apiserver while it does not: a cluster that keeps 10255 closed (guide
§3.2 step 3) needs no setting, and a kubelet restart does not leave the handshake without pods.
The kubelet is asked again a while after it last failed, so an open port is used again once it
answers. Each change of source, and the first source that answers, is one log line.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import structlog

from .kube import ApiserverUnavailable
from .kubelet import PodsUnavailable
from .podview import PodView

log = structlog.get_logger(__name__)

PodLister = Callable[[], Awaitable[list[PodView]]]

#: Seconds on the apiserver before the kubelet's /pods is tried again. A pass of the reconciler
#: (10 s) or a shared-GPU Allocate lists pods; one failed connect to a closed local port costs well
#: under a millisecond, so a minute keeps the probe out of sight.
KUBELET_RETRY_S = 60.0


class FallbackPods:
    """``pods_source: auto``: the kubelet's /pods, else the apiserver's list of this node's pods.

    Calling it lists the pods. When neither answers it raises :class:`PodsUnavailable`, naming
    both, as the kubelet source does when the kubelet does not answer: the reconciler then goes on
    without the pod list (pod-resources is its truth) and Allocate fails clearly.
    """

    def __init__(
        self,
        kubelet: PodLister,
        apiserver: PodLister,
        *,
        node: str,
        retry_s: float = KUBELET_RETRY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kubelet = kubelet
        self._apiserver = apiserver
        self._node = node
        self._retry_s = retry_s
        self._clock = clock
        self._kubelet_failed_at: float | None = None
        self.source: str | None = None
        """The source that answered last (``kubelet``, ``apiserver``), ``none`` while neither
        answers, None before the first list."""

    async def __call__(self) -> list[PodView]:
        failed_at = self._kubelet_failed_at
        if failed_at is None or self._clock() - failed_at >= self._retry_s:
            try:
                pods = await self._kubelet()
            except PodsUnavailable as e:
                self._kubelet_failed_at = self._clock()
                return await self._from_apiserver(str(e))
            self._kubelet_failed_at = None
            self._chose("kubelet", None)
            return pods
        return await self._from_apiserver(None)

    async def _from_apiserver(self, kubelet_error: str | None) -> list[PodView]:
        try:
            pods = await self._apiserver()
        except ApiserverUnavailable as e:
            kubelet = kubelet_error or f"not asked (it failed less than {self._retry_s:.0f} s ago)"
            if self.source != "none":
                log.warning(
                    "pods_source_unavailable",
                    node=self._node,
                    kubelet_error=kubelet,
                    apiserver_error=str(e),
                    fix="open the kubelet's read-only port, or check that the apiserver answers "
                    "and the plugin's ServiceAccount may list pods",
                )
                self.source = "none"
            raise PodsUnavailable(f"no pod list: kubelet: {kubelet}; apiserver: {e}") from e
        self._chose("apiserver", kubelet_error)
        return pods

    def _chose(self, source: str, why: str | None) -> None:
        if source == self.source:
            return
        fields: dict[str, object] = {"node": self._node, "source": source, "was": self.source}
        if source == "apiserver":
            fields["why"] = why or "the kubelet's /pods did not answer"
            fields["retry_kubelet_s"] = self._retry_s
        log.info("pods_source", **fields)
        self.source = source
