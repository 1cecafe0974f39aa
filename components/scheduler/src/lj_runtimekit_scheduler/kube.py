"""The only module that talks to the apiserver (kubernetes_asyncio, raw JSON on hot paths).

The official models' deserialisation costs more than scheduling a pod, so lists, watches and
writes go through ``ApiClient.call_api`` with ``_preload_content=False`` and orjson.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import aiohttp
import orjson
import structlog
from kubernetes_asyncio import client, config

from .errors import PermanentError, TemporaryError
from .leader import LeaseConflict, LeaseError
from .model import Pod, PodGroup
from .objects import POD_GROUP_SCHEDULED, PREEMPTED_REASON
from .ratelimit import TokenBucket
from .settings import Settings

log = structlog.get_logger("lj_runtimekit_scheduler.kube")
Json = dict[str, Any]

PATHS = {
    "pods": "/api/v1/pods",
    "nodes": "/api/v1/nodes",
    "nodedevices": "/apis/lj-runtimekit.aliyun.com/v1/nodedevices",
    "resourceslices": "/apis/resource.k8s.io/v1/resourceslices",
    "resourceclaims": "/apis/resource.k8s.io/v1/resourceclaims",
    "namespaces": "/api/v1/namespaces",
    "services": "/api/v1/services",
    "replicationcontrollers": "/api/v1/replicationcontrollers",
    "replicasets": "/apis/apps/v1/replicasets",
    "statefulsets": "/apis/apps/v1/statefulsets",
    "persistentvolumeclaims": "/api/v1/persistentvolumeclaims",
    "persistentvolumes": "/api/v1/persistentvolumes",
    "storageclasses": "/apis/storage.k8s.io/v1/storageclasses",
    "csinodes": "/apis/storage.k8s.io/v1/csinodes",
    "csidrivers": "/apis/storage.k8s.io/v1/csidrivers",
    "csistoragecapacities": "/apis/storage.k8s.io/v1/csistoragecapacities",
    "poddisruptionbudgets": "/apis/policy/v1/poddisruptionbudgets",
    "podgroups": "/apis/scheduling.k8s.io/v1beta1/podgroups",
}
_CLAIMS = "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"
_MERGE = "application/merge-patch+json"
_STRATEGIC = "application/strategic-merge-patch+json"


class Gone(TemporaryError):
    """The watch's resourceVersion is too old: list again."""


def _json(data: bytes, what: str) -> Json:
    """An apiserver answer as a JSON object; anything else is a transient fault of the peer."""
    try:
        out = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise TemporaryError(f"{what}: the apiserver's answer is not JSON: {data[:100]!r}") from e
    if not isinstance(out, dict):
        raise TemporaryError(f"{what}: the apiserver's answer is not a JSON object")
    return out


def _micro_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _refusal(body: bytes) -> str:
    """What the apiserver says: its Status's reason and message (what ``kubectl`` prints, and
    what a refused Binding's FailedScheduling Event should show), else the body's start."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        doc = None
    if isinstance(doc, dict) and isinstance(message := doc.get("message"), str) and message:
        reason = doc.get("reason")
        return f"{reason}: {message[:500]}" if isinstance(reason, str) and reason else message[:500]
    return body[:300].decode(errors="replace")


def _error(status: int, body: bytes, what: str) -> Exception:
    text = _refusal(body)
    if status in (409, 422, 400, 403, 404):
        return PermanentError(f"{what}: apiserver answered {status}: {text}")
    return TemporaryError(f"{what}: apiserver answered {status}: {text}")


class Kube:
    """Raw-JSON access to the few endpoints the scheduler needs."""

    def __init__(self, api: client.ApiClient, settings: Settings) -> None:
        self.api = api
        self.limit = TokenBucket(settings.kube_api_qps, settings.kube_api_burst)
        # events have their own budget, as kube-scheduler's separate event client does
        self.event_limit = TokenBucket(settings.kube_api_qps, settings.kube_api_burst)
        self.identity = ""

    @classmethod
    async def connect(cls, settings: Settings) -> Kube:
        cfg = client.Configuration()
        try:
            if settings.kubeconfig:
                await config.load_kube_config(
                    config_file=settings.kubeconfig, client_configuration=cfg
                )
            else:
                config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        except (config.ConfigException, OSError) as e:
            raise PermanentError(
                f"cannot load the apiserver config ({settings.kubeconfig or 'in-cluster'}): {e};"
                " pass --kubeconfig or run in a pod with a service account"
            ) from e
        cfg.connection_pool_maxsize = 256
        return cls(client.ApiClient(cfg), settings)

    async def close(self) -> None:
        await self.api.close()

    async def _call(
        self,
        method: str,
        path: str,
        what: str,
        body: Any = None,
        *,
        query: list[tuple[str, Any]] | None = None,
        content_type: str = "application/json",
        request_timeout: float = 30,
        limited: bool = True,
        bucket: TokenBucket | None = None,
    ) -> Json:
        if limited:
            await (bucket or self.limit).wait()
        try:
            resp = await self.api.call_api(
                path,
                method,
                query_params=query or [],
                body=body,
                header_params={"Accept": "application/json", "Content-Type": content_type},
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=request_timeout,
            )
            data = await resp.read()
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise TemporaryError(f"{what}: apiserver unreachable: {e}") from e
        if not 200 <= resp.status < 300:
            raise _error(resp.status, data, what)
        return _json(data, what)

    async def list(self, kind: str) -> tuple[list[Json], str]:
        doc = await self._call(
            "GET",
            PATHS[kind],
            f"list {kind}",
            limited=False,
            query=[("limit", 0)],
            request_timeout=120,
        )
        items, meta = doc.get("items") or [], doc.get("metadata")
        if not isinstance(items, list) or not isinstance(meta, dict):
            raise TemporaryError(f"list {kind}: the apiserver's answer is not a list")
        return items, str(meta.get("resourceVersion", ""))

    async def watch(self, kind: str, rv: str, timeout_s: int = 300) -> AsyncIterator[Json]:
        """Watch events (type, object) from ``rv``; ends when the server closes the stream."""
        query = [
            ("watch", "true"),
            ("resourceVersion", rv),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", timeout_s),
        ]
        try:
            resp = await self.api.call_api(
                PATHS[kind],
                "GET",
                query_params=query,
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=timeout_s + 30,
            )
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise TemporaryError(f"watch {kind}: apiserver unreachable: {e}") from e
        try:
            if resp.status == 410:
                raise Gone(f"watch {kind}: resourceVersion {rv} expired")
            if resp.status != 200:
                raise _error(resp.status, await resp.read(), f"watch {kind}")
            async for line in resp.content:
                if not line.strip():
                    continue
                ev = _json(line, f"watch {kind}")
                if ev.get("type") == "ERROR":
                    if (ev.get("object") or {}).get("code") == 410:
                        raise Gone(f"watch {kind}: resourceVersion expired")
                    raise TemporaryError(f"watch {kind}: {ev.get('object')}")
                yield ev
        except (aiohttp.ClientError, TimeoutError) as e:
            raise TemporaryError(f"watch {kind}: stream broke: {e}") from e
        finally:
            resp.release()

    # -- writes of the cycle (framework.Binder)
    async def bind(self, pod: Pod, node: str, annotations: dict[str, str]) -> None:
        """POST the Binding; the apiserver sets its annotations on the pod in the same write."""
        path = f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/binding"
        meta: dict[str, Any] = {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid}
        if annotations:
            meta["annotations"] = annotations
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        await self._call("POST", path, f"bind pod {pod.key} to {node}", body)

    # -- a pod's claim on a node in DRA mode (plugins/dra_claims.py)
    async def create_claim(self, claim: Json) -> Json:
        ns = claim["metadata"]["namespace"]
        return await self._call(
            "POST", _CLAIMS.format(ns=ns), f"create a ResourceClaim in {ns}", claim
        )

    async def claim_status(self, namespace: str, name: str, patch: Json) -> None:
        path = f"{_CLAIMS.format(ns=namespace)}/{name}/status"
        what = f"allocate ResourceClaim {namespace}/{name}"
        await self._call("PATCH", path, what, patch, content_type=_MERGE)

    async def pod_status(self, pod: Pod, patch: Json) -> None:
        path = f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/status"
        await self._call("PATCH", path, f"patch pod {pod.key}'s status", patch, content_type=_MERGE)

    async def pod_group_condition(
        self, group: PodGroup, scheduled: bool, reason: str, message: str
    ) -> None:
        """Set the PodGroup's ``PodGroupInitiallyScheduled`` condition (a strategic merge keyed
        by condition type: the others stay), as kube-scheduler does (scheduler.GroupStatus)."""
        path = (
            f"/apis/scheduling.k8s.io/v1beta1/namespaces/{group.namespace}/podgroups/"
            f"{group.name}/status"
        )
        condition = {
            "type": POD_GROUP_SCHEDULED,
            "status": "True" if scheduled else "False",
            "reason": reason,
            "message": message[:32768],
            "lastTransitionTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        body = {"status": {"conditions": [condition]}}
        what = f"write PodGroup {group.key}'s {POD_GROUP_SCHEDULED}"
        await self._call("PATCH", path, what, body, content_type=_STRATEGIC)

    # -- preemption (scheduler.Evictor)
    async def nominate(self, pod: Pod, node: str | None) -> None:
        """Set (None: clear) ``status.nominatedNodeName``, as kube-scheduler's nominator does."""
        path = f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/status"
        body = {"status": {"nominatedNodeName": node}}
        await self._call("PATCH", path, f"nominate pod {pod.key}", body, content_type=_MERGE)

    async def preempt(self, victim: Pod, by: Pod) -> None:
        """kube-scheduler's ``PreemptPod``: the DisruptionTarget condition (a strategic merge
        keyed by condition type: the others stay), then a graceful delete of exactly this pod
        (its uid as precondition). A victim already gone is fine."""
        base = f"/api/v1/namespaces/{victim.namespace}/pods/{victim.name}"
        condition = {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": PREEMPTED_REASON,
            "message": f"{by.scheduler_name}: preempting to accommodate a higher priority pod",
            "lastTransitionTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        delete = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": victim.uid}}
        try:
            await self._call(
                "PATCH",
                f"{base}/status",
                f"mark pod {victim.key} preempted",
                {"status": {"conditions": [condition]}},
                content_type=_STRATEGIC,
            )
            await self._call("DELETE", base, f"delete preempted pod {victim.key}", delete)
        except PermanentError as e:
            if "answered 404" not in str(e) and "answered 409" not in str(e):
                raise
            # gone already, or a new pod of that name (the uid precondition failed)

    async def delete_claim(self, namespace: str, name: str) -> None:
        """Delete a claim this cycle made; one already gone is fine, a failure only logged (the
        pod owns it: the garbage collector removes it with the pod)."""
        path = f"{_CLAIMS.format(ns=namespace)}/{name}"
        try:
            await self._call("DELETE", path, f"delete ResourceClaim {namespace}/{name}")
        except (PermanentError, TemporaryError) as e:
            log.warning("claim_delete_failed", claim=f"{namespace}/{name}", error=str(e)[:300])

    # -- a pod's volumes (plugins/volume_binding.py): PUT, so a PV or claim changed since the
    # cache saw it is refused (409) rather than overwritten, as kube-scheduler's binder does
    async def update_volume(self, raw: Json) -> Json:
        name = raw["metadata"]["name"]
        path = f"/api/v1/persistentvolumes/{name}"
        return await self._call("PUT", path, f"bind PersistentVolume {name} to its claim", raw)

    async def update_claim(self, raw: Json) -> Json:
        meta = raw["metadata"]
        ns, name = meta["namespace"], meta["name"]
        path = f"/api/v1/namespaces/{ns}/persistentvolumeclaims/{name}"
        what = f"select the node of PersistentVolumeClaim {ns}/{name}"
        return await self._call("PUT", path, what, raw)

    async def event(self, pod: Pod, kind: str, reason: str, message: str, count: int = 1) -> str:
        """Create an ``events.k8s.io/v1`` Event about ``pod``; returns its name."""
        now = _micro_now()
        name = f"{pod.name}.{time.time_ns():x}"
        body: Json = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            # named as client-go names them: <object>.<unix nanoseconds in hex>
            "metadata": {"name": name, "namespace": pod.namespace},
            "eventTime": now,
            "type": kind,
            "reason": reason,
            "note": message[:1024],
            # kube-scheduler's action of a Preempted Event regarding the victim
            "action": "Preempting" if reason == "Preempted" else "Scheduling",
            "reportingController": "lj-runtimekit-scheduler",
            "reportingInstance": self.identity or "lj-runtimekit-scheduler",
            "regarding": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pod.name,
                "namespace": pod.namespace,
                "uid": pod.uid,
            },
        }
        if count > 1:  # the API wants a series only from the second occurrence on
            body["series"] = {"count": count, "lastObservedTime": now}
        path = f"/apis/events.k8s.io/v1/namespaces/{pod.namespace}/events"
        await self._call("POST", path, f"event on {pod.key}", body, bucket=self.event_limit)
        return name

    async def event_series(self, pod: Pod, name: str, count: int) -> None:
        """Raise an Event's ``series.count``: the one field of an Event that may change."""
        body = {"series": {"count": count, "lastObservedTime": _micro_now()}}
        path = f"/apis/events.k8s.io/v1/namespaces/{pod.namespace}/events/{name}"
        await self._call(
            "PATCH",
            path,
            f"event series on {pod.key}",
            body,
            content_type="application/merge-patch+json",
            bucket=self.event_limit,
        )

    # -- the leader Lease
    async def get_lease(self, namespace: str, name: str) -> Json | None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
        try:
            return await self._call("GET", path, f"get lease {name}", limited=False)
        except PermanentError as e:
            if "answered 404" in str(e):
                return None
            raise

    async def put_lease(self, namespace: str, lease: Json, create: bool) -> Json:
        base = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        name = lease["metadata"]["name"]
        if create:
            return await self._call("POST", base, f"create lease {name}", lease, limited=False)
        return await self._call(
            "PUT", f"{base}/{name}", f"renew lease {name}", lease, limited=False
        )


class Lease:
    """One Lease object as :class:`~.leader.LeaseApi`: the apiserver's errors become
    ``LeaseError`` (a 409 ``LeaseConflict``: another replica wrote first). Lease writes are not
    rate limited: a leader that cannot renew in time stops scheduling."""

    def __init__(self, kube: Kube, namespace: str, name: str) -> None:
        self.kube, self.namespace, self.name = kube, namespace, name

    async def get(self) -> Json | None:
        try:
            return await self.kube.get_lease(self.namespace, self.name)
        except (TemporaryError, PermanentError) as e:
            raise LeaseError(str(e)) from e

    async def create(self, lease: Json) -> Json:
        return await self._put(lease, create=True)

    async def replace(self, lease: Json) -> Json:
        return await self._put(lease, create=False)

    async def _put(self, lease: Json, *, create: bool) -> Json:
        try:
            return await self.kube.put_lease(self.namespace, lease, create)
        except PermanentError as e:
            if "answered 409" in str(e):
                raise LeaseConflict(str(e)) from e
            raise LeaseError(str(e)) from e
        except TemporaryError as e:
            raise LeaseError(str(e)) from e
