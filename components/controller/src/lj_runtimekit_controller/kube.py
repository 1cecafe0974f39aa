"""The only module that talks to the apiserver (kubernetes_asyncio), at a bounded request rate.

Objects come back as plain JSON dicts (``_preload_content=False``): the domain reads a few
fields, and the views are built from them once, here.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException

from . import names
from .errors import ControllerError, PermanentError, TemporaryError
from .leader import LeaseConflict, LeaseError
from .ratelimit import TokenBucket
from .reconcile import JobView
from .status import Ended

Obj = dict[str, Any]


class Conflict(TemporaryError):
    """The object exists already or changed under us (409)."""


class Gone(TemporaryError):
    """A watch's resourceVersion is too old (410): list again."""


async def api_client(kubeconfig: str) -> client.ApiClient:
    """An ApiClient from ``kubeconfig``, or the in-cluster ServiceAccount when empty."""
    try:
        if kubeconfig:
            cfg = client.Configuration()
            await config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
            return client.ApiClient(cfg)
        config.load_incluster_config()  # type: ignore[no-untyped-call]
        return client.ApiClient()
    except (OSError, config.ConfigException) as e:
        raise PermanentError(
            f"cannot load Kubernetes credentials ({kubeconfig or 'in-cluster'}): {e}"
        ) from e


def _epoch(ts: str | None) -> float | None:
    if not ts:
        return None
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def job_view(job: Obj) -> JobView | None:
    """The domain's view of an agent Job, or None when it is not one of ours."""
    meta = job.get("metadata", {})
    ann = meta.get("annotations") or {}
    action = (meta.get("labels") or {}).get(names.ACTION_KEY, "")
    if action not in names.ACTIONS or names.NODE_KEY not in ann:
        return None
    status = job.get("status") or {}
    phase, finished, detail = "running", None, ""
    for cond in status.get("conditions") or []:
        if cond.get("status") == "True" and cond.get("type") in ("Complete", "Failed"):
            phase = "succeeded" if cond["type"] == "Complete" else "failed"
            finished = _epoch(cond.get("lastTransitionTime"))
            detail = ": ".join(str(cond[k]) for k in ("reason", "message") if cond.get(k))
    try:
        attempt = int(ann.get(names.ATTEMPT_KEY, "1"))
    except ValueError:
        attempt = 1
    return JobView(
        name=meta["name"],
        uid=meta.get("uid", ""),
        action=action,
        attempt=attempt,
        phase=phase,
        created=_epoch(meta.get("creationTimestamp")) or time.time(),
        finished=finished,
        detail=detail[:300],
        layout=str(ann.get(names.LAYOUT_KEY, ""))[:63],
        digest=str(ann.get(names.DIGEST_KEY, ""))[:63],
    )


class NotFound(TemporaryError):
    """The object does not exist (404)."""


def _error(verb: str, code: int, message: str) -> Exception:
    text = f"{verb} failed ({code}): {message}"
    if code == 404:
        return NotFound(text)
    if code == 409:
        return Conflict(text)
    if code == 410:
        return Gone(text)
    if code in (400, 403, 422):
        return PermanentError(text)
    return TemporaryError(text)


def job_node(job: Obj) -> str:
    return str(((job.get("metadata") or {}).get("annotations") or {}).get(names.NODE_KEY, ""))


class Kube:
    """Calls the controller makes, each one waiting for a token of ``rate``."""

    def __init__(
        self,
        api: client.ApiClient,
        rate: TokenBucket,
        count: Callable[[str], None] = lambda v: None,
    ) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.coordination = client.CoordinationV1Api(api)
        self._rate, self._count = rate, count

    async def _call(self, verb: str, fn: Any, *args: Any, **kwargs: Any) -> Obj:
        await self._rate.wait()
        self._count(verb)
        try:
            resp = await fn(*args, _preload_content=False, **kwargs)
            try:
                raw = await resp.read()
            finally:
                resp.release()
        except ApiException as e:
            raise _error(verb, e.status, str(e.reason)) from e
        except (OSError, TimeoutError) as e:
            raise TemporaryError(f"{verb}: apiserver unreachable: {e}") from e
        try:
            data: Obj = json.loads(raw) if raw else {}
        except ValueError as e:
            raise TemporaryError(f"{verb}: the apiserver answered non-JSON ({resp.status})") from e
        if resp.status >= 400:
            raise _error(verb, resp.status, str(data.get("message", resp.reason)))
        return data

    async def list_nodes(self, selector: str = "") -> Obj:
        return await self._call("list_nodes", self.core.list_node, label_selector=selector)

    async def node_exists(self, name: str) -> bool:
        """Whether node ``name`` exists, whatever its labels (a list by name: the controller's
        role lists nodes, it does not get them)."""
        listing = await self._call(
            "list_nodes", self.core.list_node, field_selector=f"metadata.name={name}"
        )
        return bool(listing.get("items"))

    async def list_jobs(self, namespace: str) -> Obj:
        return await self._call(
            "list_jobs",
            self.batch.list_namespaced_job,
            namespace,
            label_selector=names.MANAGED_SELECTOR,
        )

    async def list_configmap(self, namespace: str, name: str) -> Obj:
        """The ConfigMap ``name`` as a list of at most one (a field selector, so that RBAC can
        grant this one object by resourceNames, and a watch can follow it)."""
        return await self._call(
            "list_configmaps",
            self.core.list_namespaced_config_map,
            namespace,
            field_selector=f"metadata.name={name}",
        )

    async def stream(
        self, kind: str, namespace: str, rv: str, node_selector: str = "", name: str = ""
    ) -> AsyncIterator[tuple[str, Obj]]:
        """Watch events of ``kind`` (``nodes``, ``jobs``, or ``configmaps`` — the one named
        ``name``) after ``rv``; raises :class:`Gone`."""
        await self._rate.wait()
        self._count(f"watch_{kind}")
        w = watch.Watch()
        if kind == "configmaps":
            gen = w.stream(
                self.core.list_namespaced_config_map,
                namespace,
                field_selector=f"metadata.name={name}",
                resource_version=rv,
                timeout_seconds=300,
                allow_watch_bookmarks=True,
            )
        elif kind == "nodes":
            gen = w.stream(
                self.core.list_node,
                label_selector=node_selector,
                resource_version=rv,
                timeout_seconds=300,
                allow_watch_bookmarks=True,
            )
        else:
            gen = w.stream(
                self.batch.list_namespaced_job,
                namespace,
                resource_version=rv,
                label_selector=names.MANAGED_SELECTOR,
                timeout_seconds=300,
                allow_watch_bookmarks=True,
            )
        try:
            async with w:
                async for event in gen:
                    raw = event["raw_object"]
                    if event["type"] == "ERROR":
                        if raw.get("code") == 410:
                            raise Gone(f"watch {kind}: {raw.get('message', '')}")
                        raise TemporaryError(f"watch {kind}: {raw.get('message', '')}")
                    yield event["type"], raw
        except ApiException as e:
            if e.status == 410:
                raise Gone(f"watch {kind}: too old") from e
            raise TemporaryError(f"watch {kind} failed ({e.status}): {e.reason}") from e
        except (OSError, TimeoutError) as e:
            raise TemporaryError(f"watch {kind}: apiserver unreachable: {e}") from e

    async def create_job(self, manifest: Obj) -> Obj:
        ns = manifest["metadata"]["namespace"]
        return await self._call("create_job", self.batch.create_namespaced_job, ns, manifest)

    async def delete_job(self, namespace: str, name: str) -> None:
        """Delete with propagation Background, so its pods go too; absent is fine."""
        with contextlib.suppress(NotFound):
            await self._call(
                "delete_job",
                self.batch.delete_namespaced_job,
                name,
                namespace,
                body={"propagationPolicy": "Background"},
            )

    async def annotate_node(self, node: str, annotations: dict[str, str | None]) -> Obj:
        body = {"metadata": {"annotations": annotations}}
        return await self._call("patch_node", self.core.patch_node, node, body)

    async def node_event(self, node: Obj, reason: str, kind: str, message: str) -> None:
        """An Event on the node; events of cluster-scoped objects live in ``default``."""
        ns = "default"
        meta = node["metadata"]
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        body = {
            "metadata": {"generateName": f"{meta['name'][:200]}.", "namespace": ns},
            "involvedObject": {
                "kind": "Node",
                "name": meta["name"],
                "uid": meta.get("uid", ""),
                "apiVersion": "v1",
            },
            "reason": reason,
            "message": message[:1024],
            "type": kind,
            "source": {"component": names.PREFIX},
            "reportingComponent": names.PREFIX,
            "reportingInstance": names.PREFIX,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        await self._call("create_event", self.core.create_namespaced_event, ns, body)

    async def agent_ended(self, namespace: str, job: str, job_uid: str) -> Ended | None:
        """How the agent container of Job ``job``'s newest finished pod ended, if any pod of that
        very Job (by uid: not a namesake's leftover) has one terminated."""
        pods = await self._call(
            "list_pods", self.core.list_namespaced_pod, namespace, label_selector=f"job-name={job}"
        )
        items = [
            p
            for p in pods.get("items") or []
            if any(o.get("uid") == job_uid for o in p["metadata"].get("ownerReferences") or [])
        ]
        items.sort(key=lambda p: p["metadata"].get("creationTimestamp") or "")
        for pod in reversed(items):
            for cs in (pod.get("status") or {}).get("containerStatuses") or []:
                term = (cs.get("state") or {}).get("terminated")
                if cs.get("name") == names.AGENT_CONTAINER and term:
                    code = term.get("exitCode")
                    return Ended(
                        pod=pod["metadata"]["name"],
                        message=str(term.get("message") or ""),
                        reason=str(term.get("reason") or ""),
                        exit_code=code if isinstance(code, int) else None,
                    )
        return None

    async def get_lease(self, namespace: str, name: str) -> Obj | None:
        try:
            return await self._call(
                "get_lease", self.coordination.read_namespaced_lease, name, namespace
            )
        except NotFound:
            return None

    async def create_lease(self, namespace: str, lease: Obj) -> Obj:
        return await self._call(
            "create_lease", self.coordination.create_namespaced_lease, namespace, lease
        )

    async def replace_lease(self, namespace: str, lease: Obj) -> Obj:
        """Replace at the Lease's resourceVersion: :class:`Conflict` when another wrote first."""
        return await self._call(
            "replace_lease",
            self.coordination.replace_namespaced_lease,
            lease["metadata"]["name"],
            namespace,
            lease,
        )


class LeaseObject:
    """The :class:`~.leader.LeaseApi` of the elector: one Lease, our errors as its errors."""

    def __init__(self, kube: Kube, namespace: str, name: str) -> None:
        self.kube, self.namespace, self.name = kube, namespace, name

    async def get(self) -> Obj | None:
        try:
            return await self.kube.get_lease(self.namespace, self.name)
        except ControllerError as e:
            raise LeaseError(str(e)) from e

    async def create(self, lease: Obj) -> Obj:
        try:
            return await self.kube.create_lease(self.namespace, lease)
        except Conflict as e:  # created by another replica first
            raise LeaseConflict(str(e)) from e
        except ControllerError as e:
            raise LeaseError(str(e)) from e

    async def replace(self, lease: Obj) -> Obj:
        try:
            return await self.kube.replace_lease(self.namespace, lease)
        except Conflict as e:  # written by another replica since we read it
            raise LeaseConflict(str(e)) from e
        except ControllerError as e:
            raise LeaseError(str(e)) from e
