"""The node's ResourceSlices on the apiserver (mode dra): written on change only, never on a timer.

:func:`.slices.resource_slices` decides what the slices say; this adapter only writes them.

- The pool generation rises with every change of content. A new publisher (a restarted plugin)
  starts above the highest generation among the node's existing slices of its driver, so the
  scheduler never sees the pool go back to an older generation.
- Each slice is created or replaced by its stable name; then the node's other slices of this
  driver go (a shrinking pool). Slices of other nodes or other drivers are never touched: every
  list selects ``spec.nodeName`` and ``spec.driver`` on the apiserver.
- The slices are owned by the Node, so they go when the Node goes. The Node is read at each
  publish: its uid, and the topology labels (``topology_labels``) every device carries.
- A taint keeps the ``timeAdded`` the apiserver gave it when it first appeared; a rewrite of the
  pool for another reason does not make it look new.
- A slice it wrote that someone else deletes is written again (:meth:`SlicePublisher.watch`
  sets ``lost``, the publish loop writes the pool): the kubelet deletes every slice of its node
  when it starts, and a driver's slices when its plugin stayed away longer than its wiping delay
  (``dra_plugin_manager.go``), while this publisher writes on change only.
- ``taints`` adds taints besides health (a GPU a device-plugin pod still holds after the node
  moved to DRA, :mod:`..handover`); a change of them is a change of content.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import aiohttp
import structlog
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from ..handover import Handover, next_change
from ..informer import Informer
from ..inventory import Inventory, View
from ..kube import ApiserverUnavailable
from ..model import Device, RuntimeInfo
from ..runtime import DriverFacts
from .offers import STATIC
from .slices import API_VERSION, DEFAULT_DRIVER, NodeFacts, resource_slices

log = structlog.get_logger(__name__)

GROUP, VERSION = API_VERSION.split("/")
PLURAL = "resourceslices"
_RETRIES = 3
_TRANSPORT = (aiohttp.ClientError, OSError, TimeoutError)


class SlicePublisher:
    """The ResourceSlices of one node and driver."""

    def __init__(
        self,
        api: client.ApiClient,
        node: str,
        *,
        driver: str = DEFAULT_DRIVER,
        partitions: str = STATIC,
        taints: Callable[[], Mapping[str, tuple[Mapping[str, str], ...]]] | None = None,
        topology_labels: Sequence[str] = (),
    ) -> None:
        self.node = node
        self.topology_labels = tuple(topology_labels)
        """Node labels published as device attributes (read from the Node at each publish)."""
        self.driver = driver
        self.taints = taints or dict
        """Runtime device id → taints besides health, asked at every publish."""
        self.partitions = partitions
        """``static`` or ``dynamic``: see :func:`.offers.offers`."""
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.generation: int | None = None
        """The pool generation of the last write; None until this publisher first wrote."""
        self._written: list[dict[str, Any]] | None = None
        """The slices of the last complete write, built with generation 0 (the content)."""
        self.writes = 0
        self.lost = asyncio.Event()
        """Set when a slice of the last write was deleted by someone else: write again."""
        self._deleting: set[str] = set()
        """Names this publisher is deleting itself (a shrinking pool, a withdrawal)."""
        self.informer: Informer[dict[str, Any]] = Informer(
            PLURAL,
            self._list_slices,
            self._watch_slices,
            self._slice_event,
            on_relist=self._relisted,
            gone=(_Expired,),
            retry=(ApiException, *_TRANSPORT),
            log=log.bind(node=node, driver=driver),
        )
        """The watch of the node's slices of this driver (:meth:`watch`)."""

    async def publish(
        self, devices: Sequence[Device], runtime: RuntimeInfo, facts: DriverFacts | None
    ) -> bool:
        """Bring the node's slices to ``devices``; True when anything was written."""
        try:
            node_uid, labels = await self._node()
            base = NodeFacts(
                node=self.node,
                generation=0,
                node_uid=node_uid,
                topology={k: labels[k] for k in self.topology_labels if labels.get(k)},
                driver=self.driver,
                driver_version=facts.driver_version if facts else "",
                runtime_version=runtime.version,
                compute_capability=facts.compute_capability if facts else {},
                partitions=self.partitions,
                device_taints=self.taints(),
            )
            content = resource_slices(devices, base)
            if content == self._written:
                return False
            existing = await self._existing()
            highest = max((_generation(s) for s in existing.values()), default=0)
            generation = max(highest, self.generation or 0) + 1
            slices = resource_slices(devices, replace(base, generation=generation))
            self.generation = generation
            _keep_taint_times(slices, existing.values())
            for body in slices:
                await self._put(body, existing.get(body["metadata"]["name"]))
            wanted = {s["metadata"]["name"] for s in slices}
            for name in sorted(set(existing) - wanted):
                self._deleting.add(name)
                await self._delete(name)
        except ApiException as e:
            raise ApiserverUnavailable(
                f"publishing the ResourceSlices of node {self.node} (driver {self.driver}): "
                f"{e.status} {e.reason}: check the plugin's RBAC (resource.k8s.io resourceslices) "
                "and that the apiserver serves resource.k8s.io/v1 (Kubernetes 1.34 or later)"
            ) from e
        except _TRANSPORT as e:
            raise ApiserverUnavailable(
                f"publishing the ResourceSlices of node {self.node}: {e}"
            ) from e
        self._written = content
        self.writes += 1
        log.info(
            "resource_slices_published",
            node=self.node,
            driver=self.driver,
            generation=generation,
            slices=len(slices),
            devices=sum(len(s["spec"].get("devices", ())) for s in slices),
            deleted=len(set(existing) - wanted),
        )
        return True

    async def withdraw(self) -> int:
        """Delete every slice of this node and driver (the node leaves DRA); how many went."""
        self._written = None
        try:
            existing = await self._existing()
            for name in sorted(existing):
                self._deleting.add(name)
                await self._delete(name)
        except ApiException as e:
            raise ApiserverUnavailable(
                f"deleting the ResourceSlices of node {self.node} (driver {self.driver}): "
                f"{e.status} {e.reason}: check the plugin's RBAC (resourceslices delete)"
            ) from e
        except _TRANSPORT as e:
            raise ApiserverUnavailable(
                f"deleting the ResourceSlices of node {self.node}: {e}"
            ) from e
        if existing:
            self.generation = max(
                (_generation(s) for s in existing.values()), default=self.generation or 0
            )
        self._written = None
        log.info("resource_slices_withdrawn", node=self.node, driver=self.driver, n=len(existing))
        return len(existing)

    async def next_change(
        self, inventory: Inventory, view: View, handover: Handover | None, seen: int
    ) -> tuple[View, int]:
        """The next change to publish: of the inventory or handover, or the loss of a slice
        someone else deleted (:meth:`watch`)."""
        change = asyncio.ensure_future(next_change(inventory, view, handover, seen))
        lost = asyncio.ensure_future(self.lost.wait())
        try:
            await asyncio.wait({change, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            change.cancel()
            lost.cancel()
        self.lost.clear()
        if change.done() and not change.cancelled():
            return change.result()
        return inventory.view(), handover.generation if handover is not None else seen

    async def watch(self) -> None:
        """Until cancelled: watch the node's slices of this driver and set :attr:`lost` when one
        of the last write is gone (deleted while the watch was away counts too: each list
        compares). Errors are retried with the suite's backoff (:mod:`..informer`); they never
        stop publishing."""
        await self.informer.run()

    def _selector(self) -> str:
        return f"spec.nodeName={self.node},spec.driver={self.driver}"

    async def _list_slices(self) -> tuple[list[dict[str, Any]], str]:
        try:
            got = await self.custom.list_cluster_custom_object(
                GROUP, VERSION, PLURAL, field_selector=self._selector()
            )
        except ApiException as e:
            if e.status == 410:  # an expired resourceVersion only lists again
                raise _Expired(str(e)[:300]) from e
            raise
        return list(got.get("items", [])), got["metadata"]["resourceVersion"]

    async def _watch_slices(self, rv: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        w = watch.Watch()
        try:
            async for ev in w.stream(
                self.custom.list_cluster_custom_object,
                GROUP,
                VERSION,
                PLURAL,
                field_selector=self._selector(),
                resource_version=rv,
                timeout_seconds=300,
            ):
                yield ev["type"], ev["object"]
        except ApiException as e:
            if e.status == 410:  # an expired resourceVersion only lists again
                raise _Expired(str(e)[:300]) from e
            raise
        finally:
            # not Watch.close(): it would close the ApiClient every other caller shares
            w.stop()
            resp: Any = getattr(w, "resp", None)  # typed None by the library, set by stream
            if resp is not None:
                resp.release()

    def _relisted(self, items: Sequence[dict[str, Any]]) -> None:
        names = {s["metadata"]["name"] for s in items}
        for name in self._written_names() - names:
            self._gone(name)

    def _slice_event(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            self._gone(obj["metadata"]["name"])

    def _written_names(self) -> set[str]:
        return {s["metadata"]["name"] for s in self._written or ()}

    def _gone(self, name: str) -> None:
        if name in self._deleting:
            self._deleting.discard(name)
            return
        if name not in self._written_names():
            return
        log.info("resource_slice_deleted_by_others", node=self.node, slice=name, next="publish")
        self._written = None
        self.lost.set()

    async def _node(self) -> tuple[str, Mapping[str, str]]:
        """The Node's uid and labels, read at every publish (publishes follow changes only)."""
        try:
            node = await self.core.read_node(self.node)
        except ApiException as e:
            if e.status != 404:
                raise
            raise ApiserverUnavailable(
                f"node {self.node} does not exist: its ResourceSlices need the Node object "
                "(check --node-name)"
            ) from e
        return str(node.metadata.uid), dict(node.metadata.labels or {})

    async def _existing(self) -> dict[str, dict[str, Any]]:
        """The node's slices of this driver on the apiserver, by name."""
        got = await self.custom.list_cluster_custom_object(
            GROUP,
            VERSION,
            PLURAL,
            field_selector=f"spec.nodeName={self.node},spec.driver={self.driver}",
        )
        return {s["metadata"]["name"]: s for s in got.get("items", [])}

    async def _put(self, body: dict[str, Any], current: dict[str, Any] | None) -> None:
        """Create or replace one slice; a conflict (someone else wrote it) reads it again."""
        name = body["metadata"]["name"]
        version = current["metadata"]["resourceVersion"] if current else None
        for _ in range(_RETRIES):
            try:
                if version is None:
                    await self.custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, body)
                else:
                    meta = {**body["metadata"], "resourceVersion": version}
                    await self.custom.replace_cluster_custom_object(
                        GROUP, VERSION, PLURAL, name, {**body, "metadata": meta}
                    )
                return
            except ApiException as e:
                if e.status == 409:  # it exists (create) or changed (replace): read it again
                    version = await self._version(name)
                elif e.status == 404 and version is not None:  # gone meanwhile: create it
                    version = None
                else:
                    raise
        raise ApiserverUnavailable(
            f"ResourceSlice {name} kept changing while node {self.node} wrote it: is another "
            f"process publishing for driver {self.driver} on this node?"
        )

    async def _version(self, name: str) -> str | None:
        try:
            got = await self.custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return str(got["metadata"]["resourceVersion"])

    async def _delete(self, name: str) -> None:
        try:
            await self.custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, name)
        except ApiException as e:
            if e.status != 404:
                raise


def _keep_taint_times(slices: list[dict[str, Any]], existing: Iterable[dict[str, Any]]) -> None:
    """Give each taint the ``timeAdded`` it already has on the apiserver.

    The apiserver stamps a taint without one with the time of the write, so without this every
    republish would make an old taint look new."""
    times = {
        (d["name"], t["key"], t.get("value", ""), t["effect"]): t["timeAdded"]
        for s in existing
        for d in s.get("spec", {}).get("devices", [])
        for t in d.get("taints", [])
        if "timeAdded" in t
    }
    for s in slices:
        for d in s["spec"].get("devices", ()):
            for t in d.get("taints", []):
                when = times.get((d["name"], t["key"], t.get("value", ""), t["effect"]))
                if when:
                    t["timeAdded"] = when


def _generation(obj: dict[str, Any]) -> int:
    return int(obj.get("spec", {}).get("pool", {}).get("generation", 0))


class _Expired(Exception):
    """The slices' resourceVersion expired (410): list again at once."""
