"""The shared-GPU handshake at Allocate (docs/contracts.md), with its I/O.

Race-free without a node lock: candidates are chosen by :func:`assignment.candidates`; a pair
(pod, container) is claimed in this process before any await (asyncio runs one claim at a
time), and the pod mark is written with the pod's resourceVersion, so a second replica or a
stale read loses with 409 and moves on to the next candidate.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable, Sequence

import structlog

from .assignment import Candidate, PodView, allocation_mark, candidates
from .errors import PermanentError
from .kube import Conflict
from .model import GIB, Injection
from .resources import ResourceNames
from .runtime import RuntimeClient, release

log = structlog.get_logger(__name__)

PodLister = Callable[[], Awaitable[list[PodView]]]
PodMarker = Callable[[PodView, dict[str, str]], Awaitable[None]]


class NoDecision(PermanentError):
    """No pod on this node carries an unclaimed decision for this request."""


class SharedHandshake:
    def __init__(
        self,
        client: RuntimeClient,
        names: ResourceNames,
        node: str,
        list_pods: PodLister,
        mark_pod: PodMarker,
    ) -> None:
        self.client = client
        self.names = names
        self.node = node
        self.list_pods = list_pods
        self.mark_pod = mark_pod
        self._claimed: set[tuple[str, str]] = set()

    def _kind(self, resource: str) -> str:
        return "gpu-core" if resource == self.names.gpu_core else "gpu-memory"

    async def allocate(self, resource: str, units: Sequence[str]) -> Injection:
        kind = self._kind(resource)
        for _ in range(5):
            pods = await self.list_pods()
            found = candidates(
                pods, self.node, resource, kind, units=len(units), claimed=self._claimed
            )
            if not found:
                break
            c = found[0]
            key = (c.pod.uid, c.container)
            self._claimed.add(key)  # before any await: no other Allocate here takes it
            try:
                return await self._claim(resource, c)
            except Conflict as e:
                # the pod changed (maybe claimed elsewhere): read again, the mark filters it
                log.info("pod_claim_lost", pod=f"{c.pod.namespace}/{c.pod.name}", error=str(e))
                self._claimed.discard(key)
            except BaseException:
                self._claimed.discard(key)
                raise
        raise NoDecision(
            f"{resource}: no pod on node {self.node} has an unclaimed "
            f"lj-runtimekit-scheduler/gpu-assignment for {len(units)} units; was the pod "
            "scheduled by lj-runtimekit-scheduler?"
        )

    async def _claim(self, resource: str, c: Candidate) -> Injection:
        kind = self._kind(resource)
        pod = (c.pod.namespace, c.pod.name, c.pod.uid)
        allocs = []
        try:
            for share in c.shares:
                allocs.append(
                    await self.client.allocate(
                        pod=pod,
                        container=c.container,
                        resource=resource,
                        device_ids=[share.id],
                        core_percent=share.core if kind == "gpu-core" else 0,
                        memory_bytes=share.memory_gib * GIB if kind == "gpu-memory" else 0,
                    )
                )
            at = dt.datetime.now(dt.UTC).isoformat().replace("+00:00", "Z")
            await self.mark_pod(c.pod, allocation_mark(at, c.container, [a.id for a in allocs]))
        except BaseException:
            for a in allocs:
                await release(self.client, a.id)
            raise
        log.info(
            "shared_allocated",
            pod=f"{c.pod.namespace}/{c.pod.name}",
            container=c.container,
            devices=[s.id for s in c.shares],
            resource=resource,
        )
        envs: dict[str, str] = {}
        annotations: dict[str, str] = {}
        nodes: list[tuple[str, str, str]] = []
        mounts: list[tuple[str, str, bool]] = []
        for a in allocs:
            envs.update(a.injection.envs)
            annotations.update(a.injection.annotations)
            nodes += [n for n in a.injection.device_nodes if n not in nodes]
            mounts += [m for m in a.injection.mounts if m not in mounts]
        return Injection(
            tuple(sorted(envs.items())),
            tuple(sorted(annotations.items())),
            tuple(nodes),
            tuple(mounts),
        )
