"""The only module that talks to the apiserver: NodeDevices, node labels, pod marks.

Writes happen on change only: the publisher remembers what it last wrote and sends nothing when
the new body is equal (never a timer). Pod marks are written from a fresh read with its
resourceVersion, so two claims of one request can never both succeed (the apiserver answers 409
to the second, which then sees the first's mark).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import aiohttp
import structlog
from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException

from .errors import TemporaryError
from .model import Device, RuntimeInfo
from .nodedevices import (
    DEFAULT_LABEL_PREFIX,
    GROUP,
    PLURAL,
    PREFIX_LABEL,
    VERSION,
    LabelFacts,
    label_patch,
    labels,
    owned_prefixes,
    status,
)
from .resources import ResourceNames

log = structlog.get_logger(__name__)

MERGE = "application/merge-patch+json"


class ApiserverUnavailable(TemporaryError):
    """The apiserver did not answer or refused for a reason that may pass."""


class Conflict(Exception):
    """The object changed since it was read (resourceVersion precondition failed)."""


async def api_client(kubeconfig: str) -> client.ApiClient:
    if kubeconfig:
        return await config.new_client_from_config(config_file=kubeconfig)
    config.load_incluster_config()  # type: ignore[no-untyped-call]
    return client.ApiClient()


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Publisher:
    """NodeDevices status and node labels of one node, written on change only."""

    def __init__(
        self,
        api: client.ApiClient,
        node: str,
        names: ResourceNames | None = None,
        *,
        label_prefix: str = DEFAULT_LABEL_PREFIX,
    ) -> None:
        self.api = api
        self.node = node
        self.names = names or ResourceNames()
        self.label_prefix = label_prefix
        self._prefixes: tuple[str, ...] = (label_prefix,)
        """Prefixes whose labels are ours to remove; the old one goes once its labels are."""
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self._status: dict[str, Any] | None = None
        self._labels: dict[str, str] | None = None
        self.writes = 0

    async def publish(
        self, devices: list[Device], runtime: RuntimeInfo, facts: LabelFacts | None = None
    ) -> bool:
        """Write what changed; True when anything was written."""
        wrote = False
        try:
            body = status(devices, runtime, self.names)
            if body != self._status:
                await self._ensure_object()
                await self.custom.patch_cluster_custom_object_status(
                    GROUP,
                    VERSION,
                    PLURAL,
                    self.node,
                    {"status": {**body, "observedAt": _now()}},
                    _content_type=MERGE,  # type: ignore[call-arg]
                )
                self._status = body
                wrote = True
            new = labels(devices, runtime, facts, names=self.names, prefix=self.label_prefix)
            new[PREFIX_LABEL] = self.label_prefix  # so that a rename finds these labels
            if self._labels is None:
                node = await self.core.read_node(self.node)
                self._labels = dict(node.metadata.labels or {})
                self._prefixes = owned_prefixes(self.label_prefix, self._labels.get(PREFIX_LABEL))
            patch = label_patch(self._labels, new, self._prefixes)
            if patch:
                await self.core.patch_node(
                    self.node,
                    {"metadata": {"labels": patch}},
                    _content_type=MERGE,  # type: ignore[call-arg]
                )
                if len(self._prefixes) > 1:
                    log.info(
                        "node_label_prefix_changed",
                        node=self.node,
                        old=self._prefixes[1],
                        new=self.label_prefix,
                        removed=sorted(k for k, v in patch.items() if v is None),
                    )
                    self._prefixes = (self.label_prefix,)
                self._labels = {
                    **{k: v for k, v in self._labels.items() if patch.get(k, v) is not None},
                    **{k: v for k, v in patch.items() if v is not None},
                }
                wrote = True
        except ApiException as e:
            raise ApiserverUnavailable(
                f"publishing devices of node {self.node}: {e.status} {e.reason}: check the "
                "plugin's RBAC (nodedevices, nodes/patch) and that the NodeDevices CRD is applied"
            ) from e
        if wrote:
            self.writes += 1
            log.info("inventory_published", node=self.node, devices=len(devices))
        return wrote

    async def _ensure_object(self) -> None:
        if self._status is not None:
            return
        try:
            await self.custom.create_cluster_custom_object(
                GROUP,
                VERSION,
                PLURAL,
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "NodeDevices",
                    "metadata": {"name": self.node},
                    "spec": {"nodeName": self.node},
                },
            )
        except ApiException as e:
            if e.status != 409:
                raise


MarkUpdate = Callable[[Mapping[str, str]], dict[str, str] | None]


async def mark_pod(
    api: client.ApiClient, namespace: str, name: str, uid: str, update: MarkUpdate
) -> None:
    """Annotate a pod from a fresh read, with that read's resourceVersion as a precondition.

    ``update`` gets the pod's current annotations and returns the ones to patch, or None when
    the pod is already claimed. :class:`Conflict` when it is claimed, gone or replaced (another
    uid), or keeps changing under us; the caller then releases what it allocated.
    """
    core = client.CoreV1Api(api)
    for _ in range(3):
        try:
            pod = await core.read_namespaced_pod(name, namespace)
        except ApiException as e:
            if e.status == 404:
                raise Conflict(f"pod {namespace}/{name} is gone") from e
            raise ApiserverUnavailable(
                f"reading pod {namespace}/{name}: {e.status} {e.reason}"
            ) from e
        if pod.metadata.uid != uid:
            raise Conflict(f"pod {namespace}/{name} was replaced (uid {pod.metadata.uid})")
        patch = update(pod.metadata.annotations or {})
        if patch is None:
            raise Conflict(f"pod {namespace}/{name} is already claimed for this request")
        body = {
            "metadata": {"resourceVersion": pod.metadata.resource_version, "annotations": patch}
        }
        try:
            await core.patch_namespaced_pod(
                name,
                namespace,
                body,
                _content_type=MERGE,  # type: ignore[call-arg]
            )
            return
        except ApiException as e:
            if e.status != 409:
                raise ApiserverUnavailable(
                    f"marking pod {namespace}/{name}: {e.status} {e.reason}"
                ) from e
    raise Conflict(f"pod {namespace}/{name} kept changing while being marked")


async def node_pods(api: client.ApiClient, node: str) -> list[dict[str, Any]]:
    """The pods bound to ``node`` as API JSON (for the handshake's apiserver source)."""
    core = client.CoreV1Api(api)
    try:
        pods = await core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}")
    except ApiException as e:
        raise ApiserverUnavailable(f"listing pods of node {node}: {e.status} {e.reason}") from e
    out: list[dict[str, Any]] = [api.sanitize_for_serialization(p) for p in pods.items]
    return out


async def post_event(
    api: client.ApiClient,
    pod: tuple[str, str, str],
    reason: str,
    message: str,
    *,
    node: str,
    warning: bool = True,
) -> None:
    """A core/v1 Event on the pod (namespace, name, uid), reported by this node's plugin."""
    now = dt.datetime.now(dt.UTC)
    ns, name, uid = pod
    body = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{name}.", "namespace": ns},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": ns,
            "name": name,
            "uid": uid,
        },
        "reason": reason,
        "message": message[:1024],
        "type": "Warning" if warning else "Normal",
        "source": {"component": "lj-runtimekit-device-plugin", "host": node},
        "reportingComponent": "lj-runtimekit-device-plugin",
        "reportingInstance": node,
        "firstTimestamp": now.isoformat().replace("+00:00", "Z"),
        "lastTimestamp": now.isoformat().replace("+00:00", "Z"),
        "count": 1,
    }
    try:
        await client.CoreV1Api(api).create_namespaced_event(ns, body)  # type: ignore[arg-type]
    except ApiException as e:
        raise ApiserverUnavailable(
            f"posting event {reason} on pod {ns}/{name}: {e.status} {e.reason}: check the "
            "plugin's RBAC (events/create)"
        ) from e


class NotFound(ApiserverUnavailable):
    """The object does not exist (any more)."""


async def _read(api: client.ApiClient, what: str, read: Any) -> dict[str, Any]:
    """``await read()`` as API JSON; :class:`NotFound` or :class:`ApiserverUnavailable`."""
    try:
        obj = await read()
    except ApiException as e:
        error = NotFound if e.status == 404 else ApiserverUnavailable
        raise error(f"reading {what}: {e.status} {e.reason}") from e
    except (aiohttp.ClientError, OSError, TimeoutError) as e:
        raise ApiserverUnavailable(f"reading {what}: {e}") from e
    out: dict[str, Any] = api.sanitize_for_serialization(obj)
    return out


async def read_claim(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    """One ResourceClaim (resource.k8s.io/v1) as API JSON, for preparing it (mode dra)."""
    resource = client.ResourceV1Api(api)
    return await _read(
        api,
        f"ResourceClaim {namespace}/{name}",
        lambda: resource.read_namespaced_resource_claim(name, namespace),
    )


async def read_pod(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    """One pod as API JSON."""
    core = client.CoreV1Api(api)
    return await _read(
        api, f"pod {namespace}/{name}", lambda: core.read_namespaced_pod(name, namespace)
    )


class WatchExpired(Exception):
    """The watch's resourceVersion is too old (410): list again."""


async def list_node(api: client.ApiClient, node: str) -> tuple[list[dict[str, Any]], str]:
    """This node as API JSON (a list of one, field selector ``metadata.name``) and the list's
    resourceVersion, for the watch of its fence annotation (:mod:`.fence`)."""
    core = client.CoreV1Api(api)
    try:
        got = await core.list_node(field_selector=f"metadata.name={node}")
    except ApiException as e:
        raise ApiserverUnavailable(
            f"listing node {node}: {e.status} {e.reason}: check the plugin's RBAC (nodes list, "
            "watch)"
        ) from e
    except (aiohttp.ClientError, OSError, TimeoutError) as e:
        raise ApiserverUnavailable(f"listing node {node}: {e}") from e
    items: list[dict[str, Any]] = [api.sanitize_for_serialization(n) for n in got.items]
    return items, str(got.metadata.resource_version or "")


async def watch_node(
    api: client.ApiClient, node: str, rv: str
) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """This node's changes from ``rv``, as (type, API JSON)."""
    core = client.CoreV1Api(api)
    w = watch.Watch()
    try:
        async for ev in w.stream(
            core.list_node,
            field_selector=f"metadata.name={node}",
            resource_version=rv,
            timeout_seconds=300,
        ):
            obj = ev["object"]
            body = obj if isinstance(obj, dict) else api.sanitize_for_serialization(obj)
            yield ev["type"], body
    except ApiException as e:
        if e.status == 410:
            raise WatchExpired(str(e)[:300]) from e
        raise ApiserverUnavailable(f"watching node {node}: {e.status} {e.reason}") from e
    except (aiohttp.ClientError, OSError, TimeoutError) as e:
        raise ApiserverUnavailable(f"watching node {node}: {e}") from e
    finally:
        # not Watch.close(): it would close the ApiClient every other caller shares
        w.stop()
        resp: Any = getattr(w, "resp", None)
        if resp is not None:
            resp.release()
