"""The only module that talks to the apiserver (kubernetes_asyncio), at a bounded request rate.

Objects are plain JSON dicts over the generic REST paths of :mod:`.objects`, so one ``apply``
serves every kind: server-side apply with the field manager ``lj-runtimekit-operator`` and
``force`` (the operator owns the fields it sets, whoever set them before — a hand edit of an
image is undone at the next apply, as the policy is the source of truth).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException

from .errors import OperatorError, PermanentError, TemporaryError
from .leader import LeaseConflict, LeaseError
from .objects import BY_KIND, Obj, resource
from .policy import FIELD_MANAGER, GROUP, PLURAL, VERSION
from .ratelimit import TokenBucket
from .rollout import FAILING, PodTrouble, Workload

_POLICIES = f"/apis/{GROUP}/{VERSION}/{PLURAL}"
_APPLY = "application/apply-patch+yaml"
_MERGE = "application/merge-patch+json"


class Conflict(TemporaryError):
    """The object changed under us (409)."""


class NotFound(TemporaryError):
    """The object does not exist (404)."""


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


def _error(verb: str, code: int, message: str) -> OperatorError:
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


def workload_view(obj: Obj) -> Workload:
    """The readiness-relevant state of a Deployment or DaemonSet."""
    meta, spec, st = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    name = meta.get("name", "")
    containers = ((spec.get("template") or {}).get("spec") or {}).get("containers") or []
    image = next((c.get("image", "") for c in containers if c.get("name") == name), "")
    if obj.get("kind") == "DaemonSet":
        desired = int(st.get("desiredNumberScheduled") or 0)
        updated = int(st.get("updatedNumberScheduled") or 0)
        available = int(st.get("numberAvailable") or 0)
        total = int(st.get("currentNumberScheduled") or 0)
    else:
        desired = int(spec.get("replicas", 1))
        updated = int(st.get("updatedReplicas") or 0)
        available = int(st.get("availableReplicas") or 0)
        total = int(st.get("replicas") or 0)
    return Workload(
        image=str(image),
        generation=int(meta.get("generation") or 0),
        observed_generation=int(st.get("observedGeneration") or 0),
        desired=desired,
        updated=updated,
        available=available,
        total=total,
    )


def pod_troubles(pods: list[Obj]) -> list[PodTrouble]:
    """Containers of ``pods`` waiting for a reason that does not heal by waiting, as the kubelet
    reports them (``status.containerStatuses[].state.waiting``)."""
    out = []
    for pod in pods:
        st = pod.get("status") or {}
        for cs in (st.get("initContainerStatuses") or []) + (st.get("containerStatuses") or []):
            waiting = (cs.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in FAILING:
                out.append(
                    PodTrouble(
                        pod=str((pod.get("metadata") or {}).get("name", "")),
                        image=str(cs.get("image", "")),
                        reason=str(waiting["reason"]),
                        message=str(waiting.get("message") or ""),
                    )
                )
    return out


class Kube:
    """Calls the operator makes, each one waiting for a token of ``rate``."""

    def __init__(
        self,
        api: client.ApiClient,
        rate: TokenBucket,
        count: Callable[[str], None] = lambda v: None,
    ) -> None:
        self.api = api
        self.custom = client.CustomObjectsApi(api)
        self._rate, self._count = rate, count

    async def _call(
        self,
        verb: str,
        method: str,
        path: str,
        *,
        query: dict[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> Obj:
        await self._rate.wait()
        self._count(verb)
        try:
            resp = await self.api.call_api(
                path,
                method,
                query_params=list((query or {}).items()),
                header_params={"Accept": "application/json", "Content-Type": content_type},
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
            )
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
            if resp.status >= 400:  # a kind it does not serve answers 404 in plain text
                raise _error(verb, resp.status, raw[:200].decode(errors="replace")) from e
            raise TemporaryError(f"{verb}: the apiserver answered non-JSON ({resp.status})") from e
        if resp.status >= 400:
            raise _error(verb, resp.status, str(data.get("message", resp.reason)))
        return data

    async def apply(self, obj: Obj) -> Obj:
        """Server-side apply of ``obj`` (created when absent)."""
        meta = obj["metadata"]
        path = resource(obj).path(meta.get("namespace", ""), meta["name"])
        return await self._call(
            f"apply_{obj['kind'].lower()}",
            "PATCH",
            path,
            query={"fieldManager": FIELD_MANAGER, "force": "true"},
            body=obj,
            content_type=_APPLY,
        )

    async def get(self, kind: str, namespace: str, name: str) -> Obj | None:
        try:
            return await self._call(
                f"get_{kind.lower()}", "GET", BY_KIND[kind].path(namespace, name)
            )
        except NotFound:
            return None

    async def list_objects(self, kind: str, selector: str, namespace: str = "") -> list[Obj]:
        """Objects of ``kind`` matching ``selector``: in every namespace unless one is given.
        Empty where the apiserver does not serve the kind (DeviceClasses before Kubernetes 1.34),
        so that pruning and deleting a policy still work there."""
        try:
            data = await self._call(
                f"list_{kind.lower()}",
                "GET",
                BY_KIND[kind].path(namespace),
                query={"labelSelector": selector},
            )
        except NotFound:
            return []
        items: list[Obj] = data.get("items") or []
        for item in items:  # a list's items carry no kind
            item.setdefault("kind", kind)
        return items

    async def delete(self, kind: str, namespace: str, name: str) -> None:
        """Delete in the background (a workload's pods go too); absent is fine."""
        with contextlib.suppress(NotFound):
            await self._call(
                f"delete_{kind.lower()}",
                "DELETE",
                BY_KIND[kind].path(namespace, name),
                body={"propagationPolicy": "Background"},
            )

    async def list_pods(self, namespace: str, selector: str) -> list[Obj]:
        data = await self._call(
            "list_pods",
            "GET",
            f"/api/v1/namespaces/{namespace}/pods",
            query={"labelSelector": selector},
        )
        items: list[Obj] = data.get("items") or []
        return items

    async def list_nodes(self) -> list[Obj]:
        items: list[Obj] = (await self._call("list_nodes", "GET", "/api/v1/nodes")).get(
            "items"
        ) or []
        return items

    async def patch_node(self, name: str, patch: Obj) -> None:
        """A merge patch of the node's metadata (a deleted policy takes the suite's labels and
        annotations off; the admission policy lj-runtimekit-operator-writes admits nothing
        else)."""
        with contextlib.suppress(NotFound):
            await self._call(
                "patch_node", "PATCH", f"/api/v1/nodes/{name}", body=patch, content_type=_MERGE
            )

    async def post_event(
        self, policy: str, uid: str, *, kind: str, reason: str, message: str, now: str
    ) -> None:
        """An Event about the policy: ``kubectl describe runtimekitpolicy`` shows it, and it
        outlives the policy. The apiserver keeps an Event about a cluster-scoped object in
        ``default``."""
        body = {
            "metadata": {"generateName": f"{policy}.", "namespace": "default"},
            "involvedObject": {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "RuntimeKitPolicy",
                "name": policy,
                "uid": uid,
            },
            "type": kind,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": FIELD_MANAGER},
            "reportingComponent": FIELD_MANAGER,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        await self._call("create_event", "POST", "/api/v1/namespaces/default/events", body=body)

    async def list_policies(self) -> Obj:
        return await self._call("list_policies", "GET", _POLICIES)

    async def patch_status(self, name: str, status: Obj) -> Obj:
        """Replace the policy's status (a merge patch of the status subresource: lists are
        replaced whole, which is what the operator means)."""
        return await self._call(
            "patch_policy_status",
            "PATCH",
            f"{_POLICIES}/{name}/status",
            body={"status": status},
            content_type=_MERGE,
        )

    async def set_finalizers(self, name: str, finalizers: list[str], rv: str) -> Obj:
        """Write the policy's finalizers at ``rv``: :class:`Conflict` when it changed since."""
        body = {"metadata": {"finalizers": finalizers, "resourceVersion": rv}}
        return await self._call(
            "patch_policy_finalizers",
            "PATCH",
            f"{_POLICIES}/{name}",
            body=body,
            content_type=_MERGE,
        )

    async def watch_policies(self, rv: str) -> AsyncIterator[tuple[str, Obj]]:
        """Events of the policies after ``rv``; raises :class:`Gone`."""
        await self._rate.wait()
        self._count("watch_policies")
        w = watch.Watch()
        gen = w.stream(
            self.custom.list_cluster_custom_object,
            GROUP,
            VERSION,
            PLURAL,
            resource_version=rv,
            timeout_seconds=300,
            allow_watch_bookmarks=True,
        )
        try:
            async with w:
                async for event in gen:
                    raw = event["raw_object"]
                    if event["type"] == "ERROR":
                        if raw.get("code") == 410:
                            raise Gone(f"watch policies: {raw.get('message', '')}")
                        raise TemporaryError(f"watch policies: {raw.get('message', '')}")
                    yield event["type"], raw
        except ApiException as e:
            if e.status == 410:
                raise Gone("watch policies: too old") from e
            raise TemporaryError(f"watch policies failed ({e.status}): {e.reason}") from e
        except (OSError, TimeoutError) as e:
            raise TemporaryError(f"watch policies: apiserver unreachable: {e}") from e

    def _lease_path(self, namespace: str, name: str = "") -> str:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        return f"{path}/{name}" if name else path

    async def get_lease(self, namespace: str, name: str) -> Obj | None:
        try:
            return await self._call("get_lease", "GET", self._lease_path(namespace, name))
        except NotFound:
            return None

    async def create_lease(self, namespace: str, lease: Obj) -> Obj:
        return await self._call("create_lease", "POST", self._lease_path(namespace), body=lease)

    async def replace_lease(self, namespace: str, lease: Obj) -> Obj:
        path = self._lease_path(namespace, lease["metadata"]["name"])
        return await self._call("replace_lease", "PUT", path, body=lease)


class LeaseObject:
    """The :class:`~.leader.LeaseApi` of the elector: one Lease, our errors as its errors."""

    def __init__(self, kube: Kube, namespace: str, name: str) -> None:
        self.kube, self.namespace, self.name = kube, namespace, name

    async def get(self) -> Obj | None:
        try:
            return await self.kube.get_lease(self.namespace, self.name)
        except OperatorError as e:
            raise LeaseError(str(e)) from e

    async def create(self, lease: Obj) -> Obj:
        try:
            return await self.kube.create_lease(self.namespace, lease)
        except Conflict as e:
            raise LeaseConflict(str(e)) from e
        except OperatorError as e:
            raise LeaseError(str(e)) from e

    async def replace(self, lease: Obj) -> Obj:
        try:
            return await self.kube.replace_lease(self.namespace, lease)
        except Conflict as e:
            raise LeaseConflict(str(e)) from e
        except OperatorError as e:
            raise LeaseError(str(e)) from e
