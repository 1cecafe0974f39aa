"""The only module that talks to the apiserver: this node's pods through a ``spec.nodeName`` watch.

For clusters that keep the kubelet's read-only port closed. A list, then a watch from its
resourceVersion; on expiry (410) or a dropped connection it lists again with the guide's
backoff. Scrapes never wait on it: :meth:`ApiserverPods.pods` returns the watch cache.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import structlog
from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException
from tenacity import AsyncRetrying, retry_if_exception_type, wait_exponential

from .kubelet import PodsUnavailable
from .snapshot import Pod

log = structlog.get_logger(__name__)


def _pod(obj: Any) -> Pod:
    return Pod(
        namespace=obj.metadata.namespace,
        name=obj.metadata.name,
        uid=obj.metadata.uid or "",
        phase=(obj.status.phase if obj.status is not None else None) or "Unknown",
    )


class ApiserverPods:
    """Keeps this node's pods from the apiserver in a watch cache."""

    def __init__(self, node: str, kubeconfig: str | None) -> None:
        self._node = node
        self._kubeconfig = kubeconfig
        self._pods: dict[str, Pod] = {}
        self._synced = False
        self._task: asyncio.Task[None] | None = None
        self._api: client.ApiClient | None = None

    async def start(self) -> None:
        if self._kubeconfig:
            self._api = await config.new_client_from_config(config_file=self._kubeconfig)
        else:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
            self._api = client.ApiClient()
        self._task = asyncio.create_task(self._run(), name="apiserver-pod-watch")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._api is not None:
            await self._api.close()

    async def pods(self) -> tuple[Pod, ...]:
        if not self._synced:
            raise PodsUnavailable(
                f"no pod list from the apiserver yet for node {self._node}: check the "
                "ServiceAccount may list and watch pods"
            )
        return tuple(self._pods.values())

    async def _run(self) -> None:
        async for attempt in AsyncRetrying(
            wait=wait_exponential(multiplier=1, exp_base=2, min=1, max=30),
            retry=retry_if_exception_type((ApiException, OSError, TimeoutError, _Expired)),
            before_sleep=lambda rs: log.warning(
                "apiserver_pod_watch_failed",
                node=self._node,
                error=repr(rs.outcome.exception()) if rs.outcome else None,
            ),
        ):
            with attempt:
                await self._list_and_watch()

    async def _list_and_watch(self) -> None:
        assert self._api is not None
        core = client.CoreV1Api(self._api)
        selector = f"spec.nodeName={self._node}"
        listed = await core.list_pod_for_all_namespaces(field_selector=selector)
        self._pods = {p.metadata.uid: _pod(p) for p in listed.items}
        self._synced = True
        rv = listed.metadata.resource_version
        w = watch.Watch()
        async with w.stream(
            core.list_pod_for_all_namespaces,
            field_selector=selector,
            resource_version=rv,
            timeout_seconds=300,
        ) as stream:
            async for event in stream:
                kind, obj = event["type"], event["object"]
                if kind == "ERROR":
                    raise _Expired(str(obj))
                if kind == "DELETED":
                    self._pods.pop(obj.metadata.uid, None)
                else:
                    self._pods[obj.metadata.uid] = _pod(obj)
        raise _Expired("watch ended; listing again")


class _Expired(Exception):
    """The watch ended or its resourceVersion expired: list again."""
