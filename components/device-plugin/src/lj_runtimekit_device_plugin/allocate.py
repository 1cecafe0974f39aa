"""Allocate: the Runtime's injection for whole devices and partitions.

Shared ``gpu-core``/``gpu-memory`` need the scheduler's decision on the pod (the handshake of
docs/contracts.md, see :mod:`assignment`); without a pod source this refuses them clearly.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence

import structlog

from .assignment import WholeIntent
from .errors import DevicePluginError, PermanentError, TemporaryError
from .model import Injection
from .resources import ResourceNames
from .runtime import RuntimeClient

log = structlog.get_logger(__name__)

UNATTRIBUTED_NAMESPACE = "lj-runtimekit-unattributed"


class AllocateTimeout(TemporaryError):
    """Allocate ran past its own bound (the kubelet gives none)."""


NO_INTENT = WholeIntent(None, frozenset())


class SharedAllocator:
    """Hook for the scheduler handshake; without a pod source shared requests are refused and
    whole devices are chosen by topology alone."""

    async def intent(
        self, resource: str, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> WholeIntent:
        return NO_INTENT

    async def allocate(self, resource: str, units: Sequence[str]) -> Injection:
        raise PermanentError(
            f"{resource}: shared allocation needs the scheduler's decision on the pod "
            "(lj-runtimekit-scheduler/gpu-assignment); no pod source is configured"
        )


class Allocator:
    """(resource, unit ids per container) → one Injection per container, bounded in time."""

    def __init__(
        self,
        client: RuntimeClient,
        names: ResourceNames,
        timeout_s: float,
        shared: SharedAllocator | None = None,
    ) -> None:
        self.client = client
        self.names = names
        self.timeout_s = timeout_s
        self.shared = shared or SharedAllocator()

    async def intent(
        self, resource: str, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> WholeIntent:
        """What the scheduler decided for this whole-device request; no decision when the pod
        source fails or is slow (the kubelet waits on GetPreferredAllocation)."""
        try:
            async with asyncio.timeout(min(self.timeout_s, 2.0)):
                return await self.shared.intent(resource, available, must_include, size)
        except (TimeoutError, DevicePluginError) as e:
            log.warning("preferred_without_decision", resource=resource, error=str(e) or "timeout")
            return NO_INTENT

    async def __call__(self, resource: str, containers: Sequence[Sequence[str]]) -> list[Injection]:
        try:
            async with asyncio.timeout(self.timeout_s):
                return [await self._one(resource, ids) for ids in containers]
        except TimeoutError as e:
            raise AllocateTimeout(
                f"Allocate of {resource} took more than {self.timeout_s}s: is the Runtime slow "
                "or upgrading? Running containers are not affected."
            ) from e

    async def _one(self, resource: str, ids: Sequence[str]) -> Injection:
        if not ids:
            return Injection()
        if resource in (self.names.gpu_core, self.names.gpu_memory):
            return await self.shared.allocate(resource, ids)
        devices = sorted(set(ids))
        # The kubelet does not say which pod a whole-device Allocate is for; the allocation is
        # recorded under a placeholder pod the exporter attributes by device id instead.
        alloc = await self.client.allocate(
            pod=(UNATTRIBUTED_NAMESPACE, "whole-" + "-".join(devices), uuid.uuid4().hex),
            container="unknown",
            resource=resource,
            device_ids=devices,
        )
        log.info("allocated", resource=resource, devices=devices, allocation=alloc.id)
        return alloc.injection
