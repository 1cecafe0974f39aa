"""The only module that talks to the apiserver: this node's pods through a ``spec.nodeName`` watch.

For clusters that keep the kubelet's read-only port closed. A list, then a watch from its
resourceVersion, watching again from the last one seen when a watch times out; on expiry (410)
or a dropped connection it lists again with the guide's backoff (1 s, x2, 30 s): the informer of
``informer.py``. Scrapes never wait on it: :meth:`ApiserverPods.pods` returns the watch cache.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import structlog
from kubernetes_asyncio import client, config, watch

from .errors import ConfigError
from .informer import Informer
from .kubelet import PodsUnavailable
from .snapshot import Pod

log = structlog.get_logger(__name__)


def _pod(obj: Any) -> Pod | None:
    """The pod, or None for an object that is not shaped like one (left out, never fatal)."""
    meta = getattr(obj, "metadata", None)
    ns, name = getattr(meta, "namespace", None), getattr(meta, "name", None)
    if not isinstance(ns, str) or not isinstance(name, str):
        return None
    uid = getattr(meta, "uid", None)
    phase = getattr(getattr(obj, "status", None), "phase", None)
    return Pod(
        namespace=ns,
        name=name,
        uid=uid if isinstance(uid, str) else "",
        phase=phase if isinstance(phase, str) and phase else "Unknown",
    )


class _Malformed(Exception):
    """The apiserver answered something that is not a pod list or watch event."""


class ApiserverPods:
    """Keeps this node's pods from the apiserver in a watch cache."""

    def __init__(self, node: str, kubeconfig: str | None) -> None:
        self._node = node
        self._kubeconfig = kubeconfig
        self._pods: dict[str, Pod] = {}
        self._informer: Informer[Any] = Informer(
            "pods",
            self._list,
            self._watch,
            self._event,
            on_relist=lambda items: self._pods.clear(),
            # Besides ApiException, connection errors and _Expired, the client raises ValueError
            # for what its models refuse and a bare Exception for a malformed watch line: all are
            # a bad answer this time, retried with backoff, never ending the task (a dead watch
            # would leave pods() without an answer for good).
            retry=(Exception,),
            log=log.bind(node=node),
        )
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
        self._task = asyncio.create_task(self._informer.run(), name="apiserver-pod-watch")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._api is not None:
            await self._api.close()

    async def pods(self) -> tuple[Pod, ...]:
        task = self._task
        if task is not None and task.done():
            # never: _run retries every failure; if it ended anyway, a stale cache is no answer
            raise PodsUnavailable(f"the apiserver pod watch for node {self._node} ended")
        if not self._informer.synced.is_set():
            raise PodsUnavailable(
                f"no pod list from the apiserver yet for node {self._node}: check the "
                "ServiceAccount may list and watch pods"
            )
        return tuple(self._pods.values())

    async def _list(self) -> tuple[Sequence[Any], str]:
        assert self._api is not None
        core = client.CoreV1Api(self._api)
        listed = await core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self._node}"
        )
        items = getattr(listed, "items", None)
        if not isinstance(items, list):
            raise _Malformed(f"the pod list for node {self._node} has no items")
        return items, getattr(listed.metadata, "resource_version", None) or ""

    async def _watch(self, rv: str) -> AsyncIterator[tuple[str, Any]]:
        assert self._api is not None
        core = client.CoreV1Api(self._api)
        async with watch.Watch().stream(
            core.list_pod_for_all_namespaces,
            field_selector=f"spec.nodeName={self._node}",
            resource_version=rv,
            allow_watch_bookmarks=True,
            timeout_seconds=300,
            _request_timeout=330,
        ) as stream:
            async for event in stream:
                if not isinstance(event, dict):
                    raise _Malformed(f"watch event {event!r:.200}")
                kind, obj = event.get("type"), event.get("object")
                if kind == "ERROR":
                    raise _Expired(str(obj))
                yield str(kind), obj

    def _event(self, kind: str, obj: Any) -> None:
        pod = _pod(obj)
        if pod is None:
            log.warning("apiserver_pod_event_skipped", event_type=kind, node=self._node)
        elif kind == "DELETED":
            self._pods.pop(pod.uid, None)
        else:
            self._pods[pod.uid] = pod


class _Expired(Exception):
    """The watch's resourceVersion expired (410) or the apiserver sent an error: list again."""
