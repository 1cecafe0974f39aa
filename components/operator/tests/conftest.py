"""Fixtures of the operator's cluster tests: the RuntimeKitPolicy CRD installed from deploy/, an
in-process operator on the harness cluster, and a stand-in kubelet for nodes KWOK does not manage.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from lj_runtimekit_operator.app import Operator
from lj_runtimekit_operator.policy import GROUP, PLURAL, VERSION
from lj_runtimekit_operator.settings import Settings
from lj_runtimekit_testkit.cluster.crds import installed_crd

REPO = Path(__file__).resolve().parents[3]
CRD = REPO / "deploy" / "crds" / "runtimekitpolicies.lj-runtimekit.aliyun.com.yaml"


@dataclass
class Running:
    operator: Operator
    task: asyncio.Task[int]

    async def stop(self) -> int:
        self.operator.stop.set()
        return await asyncio.wait_for(self.task, 30)


@pytest.fixture(scope="module")
def policy_crd(cluster: Any) -> Iterator[None]:
    """The CRD as deploy/ ships it (the install step, not the operator's job), Established for
    the test file and deleted after it (the worker's cluster is shared with other files)."""
    with installed_crd(cluster, CRD):
        yield


@dataclass
class Cluster:
    """The test's view of the cluster (sync client; call through ``asyncio.to_thread``)."""

    api: client.ApiClient
    namespace: str
    label: str
    custom: client.CustomObjectsApi = field(init=False)
    core: client.CoreV1Api = field(init=False)
    apps: client.AppsV1Api = field(init=False)
    policies: list[str] = field(default_factory=list)
    cleanup: list[tuple[str, str]] = field(default_factory=list)  # cluster-scoped, made by the test

    def __post_init__(self) -> None:
        self.custom = client.CustomObjectsApi(self.api)
        self.core = client.CoreV1Api(self.api)
        self.apps = client.AppsV1Api(self.api)

    def create_policy(self, spec: dict[str, Any], name: str = "") -> str:
        name = name or f"suite-{uuid.uuid4().hex[:6]}"
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "RuntimeKitPolicy",
            "metadata": {"name": name},
            "spec": spec,
        }
        self.custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, body)
        self.policies.append(name)
        return name

    def patch_policy(self, name: str, spec: dict[str, Any]) -> None:
        self.custom.patch_cluster_custom_object(GROUP, VERSION, PLURAL, name, {"spec": spec})

    def policy(self, name: str) -> dict[str, Any] | None:
        try:
            obj: Any = self.custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return dict(obj)

    def table(self, name: str) -> dict[str, str]:
        """The policy's row as `kubectl get runtimekitpolicy -o wide` shows it (the apiserver's
        Table rendering of the CRD's printer columns, priority 1 included)."""
        method, url, headers, body, _ = self.api.param_serialize(
            "GET",
            f"/apis/{GROUP}/{VERSION}/{PLURAL}/{name}",
            header_params={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
            auth_settings=["BearerToken"],
        )
        resp = self.api.call_api(method, url, headers, body)
        resp.read()  # type: ignore[no-untyped-call]
        data = json.loads(resp.data or b"{}")
        columns = [c["name"] for c in data["columnDefinitions"]]
        return dict(zip(columns, [str(v) for v in data["rows"][0]["cells"]], strict=True))

    def delete_policy(self, name: str) -> None:
        with contextlib.suppress(ApiException):
            self.custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, name)

    def condition(self, name: str, kind: str) -> dict[str, Any]:
        obj = self.policy(name) or {}
        conds = (obj.get("status") or {}).get("conditions") or []
        return next((c for c in conds if c["type"] == kind), {})

    def component(self, name: str, component: str) -> dict[str, Any]:
        obj = self.policy(name) or {}
        items = (obj.get("status") or {}).get("components") or []
        return next((c for c in items if c["name"] == component), {})

    def labelled(self, policy: str) -> list[tuple[str, str, str]]:
        """Every object labelled as made for ``policy``, of every kind the operator writes."""
        selector = f"{GROUP}/policy={policy}"
        rbac = client.RbacAuthorizationV1Api(self.api)
        adm = client.AdmissionregistrationV1Api(self.api)
        node = client.NodeV1Api(self.api)
        listings: dict[str, Any] = {
            "ConfigMap": self.core.list_config_map_for_all_namespaces,
            "ServiceAccount": self.core.list_service_account_for_all_namespaces,
            "Service": self.core.list_service_for_all_namespaces,
            "Deployment": self.apps.list_deployment_for_all_namespaces,
            "DaemonSet": self.apps.list_daemon_set_for_all_namespaces,
            "Role": rbac.list_role_for_all_namespaces,
            "RoleBinding": rbac.list_role_binding_for_all_namespaces,
            "ClusterRole": rbac.list_cluster_role,
            "ClusterRoleBinding": rbac.list_cluster_role_binding,
            "ValidatingAdmissionPolicy": adm.list_validating_admission_policy,
            "ValidatingAdmissionPolicyBinding": adm.list_validating_admission_policy_binding,
            "RuntimeClass": node.list_runtime_class,
        }
        out = []
        for kind, fn in listings.items():
            for item in fn(label_selector=selector).items:
                out.append((kind, item.metadata.namespace or "", item.metadata.name))
        classes: Any = self.custom.list_cluster_custom_object(
            "resource.k8s.io", "v1", "deviceclasses", label_selector=selector
        )
        out += [("DeviceClass", "", i["metadata"]["name"]) for i in classes["items"]]
        return sorted(out)

    def _pods(self) -> list[Any]:
        return list(self.core.list_namespaced_pod(self.namespace).items)

    async def poll(self, check: Callable[[], Any], deadline_s: float = 60.0, what: str = "") -> Any:
        """:func:`poll`; a timeout also shows the status of the test's policies."""
        try:
            return await poll(check, deadline_s, what)
        except AssertionError as e:
            seen = {n: (self.policy(n) or {}).get("status") for n in self.policies}
            pods = [
                (
                    p.metadata.name,
                    p.spec.node_name,
                    p.status.phase,
                    [(c.type, c.status) for c in p.status.conditions or []],
                    [
                        (c.image, c.state.waiting and c.state.waiting.reason)
                        for c in p.status.container_statuses or []
                    ],
                )
                for p in self._pods()
            ]
            raise AssertionError(f"{e}\npolicies' status: {seen}\npods: {pods}") from None

    def workload_image(self, kind: str, name: str) -> str:
        read = (
            self.apps.read_namespaced_deployment
            if kind == "Deployment"
            else self.apps.read_namespaced_daemon_set
        )
        try:
            obj: Any = read(name, self.namespace)
        except ApiException as e:
            if e.status == 404:
                return ""
            raise
        return str(obj.spec.template.spec.containers[0].image)


async def poll(check: Callable[[], Any], deadline_s: float = 60.0, what: str = "") -> Any:
    """``check()`` in a thread until it returns something truthy; fails at the deadline."""
    end = time.monotonic() + deadline_s
    last: Any = None
    while time.monotonic() < end:
        last = await asyncio.to_thread(check)
        if last:
            return last
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out after {deadline_s}s waiting for {what}: {last!r}")


@pytest.fixture
def kube(cluster: Any, namespace: str, policy_crd: None) -> Iterator[Cluster]:
    """The test's client; every policy it made is deleted afterwards (and waited for, so the
    next test's operator starts with none)."""
    api = cluster.api_client()
    view = Cluster(api, namespace, f"op-{uuid.uuid4().hex[:8]}")
    try:
        yield view
    finally:
        for name in view.policies:
            view.delete_policy(name)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(view.policy(n) for n in view.policies):
            time.sleep(0.2)
        for name in view.policies:  # the operator is gone: let what is left go
            with contextlib.suppress(ApiException):
                view.custom.patch_cluster_custom_object(
                    GROUP, VERSION, PLURAL, name, {"metadata": {"finalizers": None}}
                )
        rbac = client.RbacAuthorizationV1Api(api)
        for kind, name in view.cleanup:
            with contextlib.suppress(ApiException):
                if kind == "ClusterRole":
                    rbac.delete_cluster_role(name)
                else:
                    rbac.delete_cluster_role_binding(name)
        api.close()


@pytest.fixture
async def start_operator(
    cluster: Any, namespace: str, kube: Cluster
) -> AsyncIterator[Callable[..., Awaitable[Running]]]:
    started: list[Running] = []

    async def start(**overrides: Any) -> Running:
        values: dict[str, Any] = {
            "kubeconfig": cluster.kubeconfig,
            "metrics_bind_address": "127.0.0.1:0",
            "leader_elect_resource_namespace": namespace,
            "leader_elect_lease_duration": 4.0,
            "leader_elect_renew_deadline": 3.0,
            "leader_elect_retry_period": 0.5,
            "progress_interval": 0.3,
            "rollout_deadline": 60.0,
            "identity": f"replica-{len(started)}",
            "log_format": "text",
            "kube_api_qps": 500.0,
            "kube_api_burst": 1000,
        }
        values.update(overrides)
        operator = Operator(Settings(**values))
        running = Running(operator, asyncio.create_task(operator.run()))
        started.append(running)
        return running

    try:
        yield start
    finally:
        # Stopped only after the policies are gone (the kube fixture's teardown runs later, so
        # delete them here while the operator still removes what they made).
        for name in kube.policies:
            kube.delete_policy(name)
        with contextlib.suppress(AssertionError):
            await poll(
                lambda: not any(kube.policy(n) for n in kube.policies), 30, "policies removed"
            )
        for r in started:
            if not r.task.done():
                with contextlib.suppress(Exception):
                    await r.stop()


#: A tag no registry holds: the stand-in kubelet reports its pull failing, as a kubelet does.
MISSING_TAG = "v9.9.9-missing"


@dataclass
class StandInKubelet:
    """Plays the kubelet for nodes KWOK does not manage: a pod bound to one of them runs and is
    Ready, unless its image's tag is :data:`MISSING_TAG`, whose pull fails (the container waits
    in ErrImagePull, then ImagePullBackOff, with the kubelet's message); a pod being deleted is
    removed once "stopped" (grace period 0, as the kubelet does after its containers exit)."""

    api: client.ApiClient
    namespace: str
    missing_tag: str = MISSING_TAG
    nodes: list[str] = field(default_factory=list)
    _beat: float = 0.0
    pulled: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def add_nodes(self, n: int, labels: dict[str, str]) -> list[str]:
        core = client.CoreV1Api(self.api)
        for _ in range(n):
            name = f"op-standin-{uuid.uuid4().hex[:6]}"
            meta = client.V1ObjectMeta(name=name, labels={**labels, "kubernetes.io/hostname": name})
            core.create_node(client.V1Node(metadata=meta))
            self.nodes.append(name)
        self._heartbeat(core)
        return self.nodes[-n:]

    def _heartbeat(self, core: client.CoreV1Api) -> None:
        """Node status Ready with a fresh heartbeat and the node's capacity, as the kubelet posts
        them: without the heartbeat the node lifecycle controller marks the node's pods not
        Ready; without capacity no pod fits."""
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        capacity = {"cpu": "16", "memory": "64Gi", "pods": "110"}
        body = {
            "status": {
                "capacity": capacity,
                "allocatable": capacity,
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "stand-in kubelet",
                        "lastHeartbeatTime": now,
                        "lastTransitionTime": now,
                    }
                ],
            }
        }
        for name in list(self.nodes):
            with contextlib.suppress(ApiException):
                core.patch_node_status(name, body)
        self._beat = time.monotonic()

    def _status(self, pod: Any) -> dict[str, Any]:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        statuses, ready = [], True
        for c in pod.spec.containers:
            cs: dict[str, Any] = {
                "name": c.name,
                "image": c.image,
                "imageID": "",
                "restartCount": 0,
            }
            if c.image.endswith(":" + MISSING_TAG):
                ready = False
                message = f'Back-off pulling image "{c.image}": ErrImagePull: {c.image}: not found'
                cs |= {
                    "ready": False,
                    "started": False,
                    "state": {"waiting": {"reason": "ImagePullBackOff", "message": message}},
                }
            else:
                cs |= {"ready": True, "started": True, "state": {"running": {"startedAt": now}}}
            statuses.append(cs)
        flag = "True" if ready else "False"
        return {
            "status": {
                "phase": "Running" if ready else "Pending",
                "conditions": [
                    {"type": t, "status": flag, "lastTransitionTime": now}
                    for t in ("Ready", "ContainersReady")
                ],
                "containerStatuses": statuses,
                "startTime": now,
            }
        }

    def _handle(self, core: client.CoreV1Api, pod: Any) -> None:
        if pod.spec.node_name not in self.nodes:
            return
        try:
            if pod.metadata.deletion_timestamp:
                core.delete_namespaced_pod(
                    pod.metadata.name, self.namespace, grace_period_seconds=0
                )
            elif not pod.status.container_statuses:
                core.patch_namespaced_pod_status(
                    pod.metadata.name, self.namespace, self._status(pod)
                )
                self.pulled.extend(c.image for c in pod.spec.containers)
        except ApiException as e:
            if e.status != 404:
                raise

    def run(self) -> None:
        core = client.CoreV1Api(self.api)
        while not self._stop.is_set():
            if time.monotonic() - self._beat > 5:
                self._heartbeat(core)
            listing: Any = core.list_namespaced_pod(self.namespace)
            for pod in listing.items:
                self._handle(core, pod)
            rv = listing.metadata.resource_version
            w = watch.Watch()  # type: ignore[no-untyped-call]
            with contextlib.suppress(ApiException):
                for event in w.stream(  # type: ignore[no-untyped-call]
                    core.list_namespaced_pod, self.namespace, resource_version=rv, timeout_seconds=1
                ):
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._handle(core, event["object"])
                    if self._stop.is_set():
                        break


@pytest.fixture
def kubelet(cluster: Any, namespace: str) -> Iterator[StandInKubelet]:
    api = cluster.api_client()
    stand_in = StandInKubelet(api, namespace)
    thread = threading.Thread(target=stand_in.run, daemon=True, name="stand-in-kubelet")
    thread.start()
    try:
        yield stand_in
    finally:
        stand_in._stop.set()
        thread.join(10)
        core = client.CoreV1Api(api)
        for name in stand_in.nodes:
            with contextlib.suppress(ApiException):
                core.delete_node(name)
        api.close()
