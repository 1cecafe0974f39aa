"""The only module that talks to the apiserver: this node's pods through a ``spec.nodeName`` watch.

For clusters that keep the kubelet's read-only port closed. A list, then a watch from its
resourceVersion, watching again from the last one seen when a watch times out; on expiry (410)
or a dropped connection it lists again with the guide's backoff (1 s, x2, 30 s). Scrapes never
wait on it: :meth:`ApiserverPods.pods` returns the watch cache.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import aiohttp
import structlog
from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException

from .errors import ConfigError
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
        try:
            if self._kubeconfig:
                self._api = await config.new_client_from_config(config_file=self._kubeconfig)
            else:
                config.load_incluster_config()  # type: ignore[no-untyped-call]
                self._api = client.ApiClient()
        except (config.ConfigException, OSError) as e:
            where = self._kubeconfig or "the in-cluster ServiceAccount"
            raise ConfigError(
                f"--pods-source=apiserver: cannot load {where} ({e}); set --kubeconfig, run in a "
                "pod with a ServiceAccount, or use --pods-source=kubelet"
            ) from e
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
        failures = 0
        while True:
            try:
                await self._list_and_watch()
                failures = 0
            except (ApiException, aiohttp.ClientError, OSError, TimeoutError, _Expired) as e:
                failures += 1
                delay = min(2.0 ** (failures - 1), 30.0)
                log.warning(
                    "apiserver_pod_watch_failed",
                    node=self._node,
                    error=repr(e),
                    retry_in_s=delay,
                    effect="pod list served from the watch cache until it lists again",
                )
                await asyncio.sleep(delay)

    async def _list_and_watch(self) -> None:
        """List, then watch from that resourceVersion until the watch times out (no error)."""
        assert self._api is not None
        core = client.CoreV1Api(self._api)
        selector = f"spec.nodeName={self._node}"
        listed = await core.list_pod_for_all_namespaces(field_selector=selector)
        self._pods = {p.metadata.uid: _pod(p) for p in listed.items}
        self._synced = True
        rv = listed.metadata.resource_version
        while True:
            async with watch.Watch().stream(
                core.list_pod_for_all_namespaces,
                field_selector=selector,
                resource_version=rv,
                allow_watch_bookmarks=True,
                timeout_seconds=300,
                _request_timeout=330,
            ) as stream:
                async for event in stream:
                    kind, obj = event["type"], event["object"]
                    if kind == "ERROR":
                        raise _Expired(str(obj))
                    rv = obj.metadata.resource_version or rv
                    if kind == "BOOKMARK":
                        continue
                    if kind == "DELETED":
                        self._pods.pop(obj.metadata.uid, None)
                    else:
                        self._pods[obj.metadata.uid] = _pod(obj)


class _Expired(Exception):
    """The watch's resourceVersion expired (410) or the apiserver sent an error: list again."""
