"""Node capacity/allocatable for device plugin resources in the apiserver, as the kubelet sets
them: capacity = every device the plugin lists, allocatable = the healthy ones; a resource whose
plugin is gone is zeroed."""

from __future__ import annotations

import asyncio
from typing import Any

import structlog
from kubernetes import client
from kubernetes.client.exceptions import ApiException

log = structlog.get_logger(__name__)


class NodeStatusWriter:
    """Patches ``status.capacity`` and ``status.allocatable`` of one node."""

    def __init__(self, api: client.ApiClient, node_name: str) -> None:
        self._core = client.CoreV1Api(api)
        self._node = node_name
        self._lock = asyncio.Lock()

    async def set_resource(self, resource: str, capacity: int, allocatable: int) -> None:
        body = {
            "status": {
                "capacity": {resource: str(capacity)},
                "allocatable": {resource: str(allocatable)},
            }
        }
        async with self._lock:
            try:
                await asyncio.to_thread(self._core.patch_node_status, self._node, body)
            except ApiException as e:
                log.warning("node_status_patch_failed", node=self._node, status=e.status)
                raise
        log.debug(
            "node_resource_set",
            node=self._node,
            resource=resource,
            capacity=capacity,
            allocatable=allocatable,
        )

    async def bound_pods(self) -> list[dict[str, Any]]:
        """The pods bound to this node (JSON dicts as the API returns them)."""
        resp: Any = await asyncio.to_thread(
            self._core.list_pod_for_all_namespaces,
            field_selector=f"spec.nodeName={self._node}",
            _preload_content=False,
        )
        data: dict[str, Any] = await asyncio.to_thread(resp.json)
        items: list[dict[str, Any]] = data.get("items", [])
        return items
