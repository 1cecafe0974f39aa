"""A deleted policy, undone one pass at a time (docs/operator.md, "Delete").

As ``deploy-all.sh undeploy`` does it: the feature label off every node, then wait (at most
``teardown_deadline``) for the controller's disable Jobs to take the ``lj-runtime`` handler out of
each node's containerd; then every object the policy made is deleted, and once the suite's pods
are gone, the agent Jobs the controller kept, the NodeDevices, and the suite's labels and
annotations on the nodes; last the finalizer. Every pass starts from what the cluster and the
policy's status say (:mod:`.teardown`), so a new leader goes on where the last one stopped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from . import bundled, render, status, teardown
from .errors import PermanentError, PolicyError
from .kube import Kube, workload_view
from .metrics import Metrics
from .objects import RESOURCES, Obj
from .policy import COMPONENT_LABEL, COMPONENTS, DEFAULT_NAMESPACE, FINALIZER, parse
from .settings import Settings

log = structlog.get_logger("lj_runtimekit_operator")
CONTROLLER = "lj-runtimekit-controller"
_SUITE_PODS = f"app in ({','.join(w for c in COMPONENTS for w in c.workloads)})"


@dataclass(frozen=True)
class Target:
    """What the teardown needs of the policy, defaults where its spec cannot be read."""

    name: str
    uid: str
    namespace: str
    label: str  # the controller's feature label
    prefix: str  # the device plugin's renamed label prefix ("": the default)


def target(obj: Obj) -> Target:
    meta, old = obj.get("metadata") or {}, obj.get("status") or {}
    name, uid = str(meta.get("name", "")), str(meta.get("uid", ""))
    bundle = bundled.load()
    try:
        p = parse(obj, bundle.registry, bundle.version)
    except PolicyError:  # a spec it never followed: what it last applied, and the defaults
        return Target(
            name, uid, str(old.get("namespace") or DEFAULT_NAMESPACE), teardown.FEATURE_LABEL, ""
        )
    controller = p.component("controller")
    config = controller.config
    if config is None:
        cm = next(o for o in bundle.objects["controller"] if o["kind"] == "ConfigMap")
        config = str((cm.get("data") or {}).get(render.CONFIG_KEY, ""))
    prefix = p.component("device-plugin").label_prefix
    return Target(name, uid, p.namespace, teardown.feature_label(config), prefix)


def _nodes(items: list[Obj]) -> list[teardown.Node]:
    out = []
    for item in items:
        meta = item.get("metadata") or {}
        out.append(
            teardown.Node(
                str(meta.get("name", "")),
                dict(meta.get("labels") or {}),
                dict(meta.get("annotations") or {}),
            )
        )
    return out


class Deletion:
    def __init__(
        self, settings: Settings, kube: Kube, metrics: Metrics, clock: Callable[[], float]
    ) -> None:
        self.settings, self.kube, self.metrics, self.clock = settings, kube, metrics, clock

    async def step(self, obj: Obj) -> bool:
        """One pass over the deleted policy ``obj``; True while it is still being undone, False
        once its finalizer is gone."""
        t = target(obj)
        now = self.clock()
        st = teardown.state(obj.get("status"))
        if not st.started:
            st = teardown.State(status.timestamp(now))
            log.info("policy_teardown_started", policy=t.name, feature_label=t.label)
        if not st.nodes:
            st, waiting = await self._disable_nodes(t, st, now)
            if waiting:
                await self._status(obj, st, waiting)
                return True
            await self._status(obj, st, "the nodes are disabled; removing the suite")
        left = await self._delete_objects(t.name)
        if not left and await self.kube.list_pods(t.namespace, _SUITE_PODS):
            left = -1
        if left:
            what = f"removing {left} object(s)" if left > 0 else "waiting for the suite's pods"
            await self._status(obj, st, f"the nodes are done; {what}")
            return True
        await self._leftovers(t)
        meta = obj.get("metadata") or {}
        finalizers = [f for f in meta.get("finalizers") or [] if f != FINALIZER]
        await self.kube.set_finalizers(t.name, finalizers, str(meta.get("resourceVersion", "")))
        log.info("policy_removed", policy=t.name, nodes=st.nodes, not_disabled=st.not_disabled)
        return False

    async def _disable_nodes(
        self, t: Target, st: teardown.State, now: float
    ) -> tuple[teardown.State, str]:
        """The feature label off every node; the state once every node is disabled or the
        deadline passed, with "" — else the state and what it waits for."""
        nodes = _nodes(await self.kube.list_nodes())
        for node in nodes:
            patch = teardown.feature_off(node, t.label)
            if patch is not None:
                await self.kube.patch_node(node.name, patch)
                log.info("node_feature_off", policy=t.name, node=node.name, label=t.label)
        running = [
            (str(j["metadata"]["name"]), str(annotations.get(teardown.JOB_NODE, "")))
            for j in await self.kube.list_objects("Job", teardown.AGENT_JOBS, t.namespace)
            if (j.get("status") or {}).get("active")
            for annotations in [j["metadata"].get("annotations") or {}]
        ]
        left = teardown.pending(nodes, running)
        if not left:
            return dataclasses.replace(st, nodes=teardown.DISABLED), ""
        elapsed = now - (status.epoch(st.started) or now)
        deadline = self.settings.teardown_deadline
        if elapsed < deadline:
            found = await self.kube.get("Deployment", t.namespace, CONTROLLER)
            ready = found is not None and workload_view(found).available > 0
            return st, teardown.waiting_message(left, ready, deadline - elapsed)
        message = teardown.gave_up_message(left, deadline)
        log.error("nodes_not_disabled", policy=t.name, nodes=sorted(left), deadline_s=deadline)
        await self.kube.post_event(
            t.name,
            t.uid,
            kind="Warning",
            reason=teardown.NODES_NOT_DISABLED,
            message=message,
            now=status.timestamp(now),
        )
        return dataclasses.replace(
            st, nodes=teardown.NOT_DISABLED, not_disabled=tuple(sorted(left))
        ), ""

    async def _status(self, obj: Obj, st: teardown.State, message: str) -> None:
        old: Mapping[str, Any] = obj.get("status") or {}
        gave_up = ""
        if st.nodes == teardown.NOT_DISABLED:
            gave_up = f"not disabled when the deadline passed: {', '.join(st.not_disabled)}"
        new = {
            **old,
            "teardown": st.to_json(),
            "conditions": status.deleting(
                message, gave_up, old.get("conditions") or [], status.timestamp(self.clock())
            ),
        }
        if new != old:
            obj["status"] = await self._patch(obj, new)

    async def _patch(self, obj: Obj, new: Obj) -> Obj:
        name = str((obj.get("metadata") or {}).get("name"))
        done = await self.kube.patch_status(name, new)
        if isinstance(done.get("metadata"), Mapping):  # the next patch of this pass sees it
            obj["metadata"] = done["metadata"]
        return dict(done.get("status") or new)

    async def _delete_objects(self, policy: str) -> int:
        """Delete what the policy made (workloads in the background); how many remain."""
        left = 0
        for res in reversed(RESOURCES):
            for item in await self.kube.list_objects(res.kind, render.selector(policy)):
                meta = item.get("metadata") or {}
                if not meta.get("deletionTimestamp"):
                    await self.kube.delete(res.kind, str(meta.get("namespace") or ""), meta["name"])
                    self.metrics.deletes.labels(
                        str((meta.get("labels") or {}).get(COMPONENT_LABEL, ""))
                    ).inc()
                left += 1
        if left:
            log.info("policy_tear_down", policy=policy, objects=left)
        return left

    async def _leftovers(self, t: Target) -> None:
        """What the suite left once its pods are gone: the agent Jobs the controller kept,
        the NodeDevices, the suite's labels and annotations on the nodes."""
        for job in await self.kube.list_objects("Job", teardown.AGENT_JOBS, t.namespace):
            await self.kube.delete("Job", t.namespace, str(job["metadata"]["name"]))
        for inventory in await self.kube.list_objects("NodeDevices", ""):
            await self.kube.delete("NodeDevices", "", str(inventory["metadata"]["name"]))
        refused = []
        for node in _nodes(await self.kube.list_nodes()):
            patch = teardown.leftovers(node, t.label, t.prefix)
            if patch is None:
                continue
            try:
                await self.kube.patch_node(node.name, patch)
            except PermanentError as e:  # refused (a renamed key the admission policy lacks)
                refused.append(f"{node.name}: {e}")
                continue
            log.info("node_cleaned", policy=t.name, node=node.name, removed=patch["metadata"])
        if refused:
            message = "could not take the suite's labels and annotations off: " + "; ".join(refused)
            log.error("nodes_not_cleaned", policy=t.name, nodes=refused)
            await self.kube.post_event(
                t.name,
                t.uid,
                kind="Warning",
                reason="NodesNotCleaned",
                message=message,
                now=status.timestamp(self.clock()),
            )
