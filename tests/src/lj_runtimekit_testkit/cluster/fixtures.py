"""pytest fixtures of the cluster part of the harness: ``cluster`` (session), ``namespace``, and
the real nodes: ``real_node`` (one for the session, with the gpu-8x-nvlink Runtime simulator and
its device nodes) and ``real_nodes`` (a factory; its nodes stop at the end of the test).

When the session holds a test marked ``realnode``, ``cluster`` is started with the node network
(a host bridge; the apiserver then listens on every address). A machine that cannot run real
nodes at all (not Linux, not root) skips those tests saying why; any other failure to make a node
fails them with what failed.

A failed test that used ``cluster`` gets the tail of every binary's log in its report, and one that
used a real node the tails of its supervisor, containerd and kubelet logs.

The cluster is shared by every test file a worker runs, in an order that changes with the
durations file, so a file must leave no cluster-scoped object behind (a RuntimeClass left by one
file made the next file's ``helm install`` refuse to adopt it): the file's last test errors at
teardown naming what was left, see ``LEFT_BEHIND_KINDS``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from lj_runtimekit_testkit.cluster.binaries import BinariesMissing
from lj_runtimekit_testkit.cluster.handle import Cluster
from lj_runtimekit_testkit.cluster.launcher import ControlPlane
from lj_runtimekit_testkit.node import RealNode, RealNodeError, RealNodes, host_support

REAL_NODE_INVENTORY = "gpu-8x-nvlink"
_node_network_error: list[str] = []

# Cluster-scoped kinds whose names collide between test files (a suite's RBAC, its RuntimeClass,
# CRDs, DeviceClasses, admission policies), by their list path.
LEFT_BEHIND_KINDS = {
    "RuntimeClass": "/apis/node.k8s.io/v1/runtimeclasses",
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    "CustomResourceDefinition": "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
    "DeviceClass": "/apis/resource.k8s.io/v1/deviceclasses",
    "ValidatingAdmissionPolicy": (
        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
    ),
    "ValidatingAdmissionPolicyBinding": (
        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"
    ),
    "ValidatingWebhookConfiguration": (
        "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
    ),
    "MutatingWebhookConfiguration": (
        "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
    ),
    "PriorityClass": "/apis/scheduling.k8s.io/v1/priorityclasses",
}
# The cluster of this process (one per xdist worker) once started, and what it held then.
_started: list[tuple[Cluster, frozenset[str]]] = []


def cluster_scoped_objects(cluster: Cluster) -> frozenset[str]:
    """``Kind/name`` of every live object of ``LEFT_BEHIND_KINDS`` (one being deleted is gone)."""
    names: set[str] = set()
    with cluster.api_client() as api:
        for kind, path in LEFT_BEHIND_KINDS.items():
            resp = api.call_api("GET", api.configuration.host + path)
            resp.read()
            assert resp.status == 200, f"GET {path}: {resp.status} {resp.data!r}"
            for item in json.loads(resp.data)["items"]:
                if not item["metadata"].get("deletionTimestamp"):
                    names.add(f"{kind}/{item['metadata']['name']}")
    return frozenset(names)


def _left_behind(before: frozenset[str], cluster: Cluster, grace_s: float = 30.0) -> list[str]:
    """What a file created and did not delete; a deletion it started gets ``grace_s`` to end."""
    deadline = time.monotonic() + grace_s
    while True:
        left = sorted(cluster_scoped_objects(cluster) - before)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def _delete_nodes(cluster: Cluster, names: set[str]) -> None:
    with cluster.api_client() as api:
        core = client.CoreV1Api(api)
        for name in sorted(names):
            try:
                core.delete_node(name)
            except ApiException as e:
                if e.status != 404:
                    raise
    cluster.forget_nodes(names)


@pytest.fixture(scope="module", autouse=True)
def _file_leaves_the_cluster_as_found() -> Iterator[None]:
    """Deletes the nodes the file made with ``create_gpu_nodes`` (a labelled node left behind is
    one more node for the next file's controller or ``deploy-all.sh undeploy``), then errors the
    file's last test when the file left a cluster-scoped object behind."""
    before = cluster_scoped_objects(_started[0][0]) if _started else None
    nodes_before = set(_started[0][0].made_nodes) if _started else set()
    yield
    if not _started:
        return
    shared, at_start = _started[0]
    _delete_nodes(shared, set(shared.made_nodes) - nodes_before)
    left = _left_behind(at_start if before is None else before, shared)
    assert not left, (
        "this test file left cluster-scoped objects on the worker's shared cluster; the next "
        f"file would meet them: {', '.join(left)}"
    )


_REAL_NODE_FIXTURES = {"real_node", "real_nodes"}


def _session_wants_real_nodes(session: pytest.Session) -> bool:
    return any(
        item.get_closest_marker("realnode")
        or _REAL_NODE_FIXTURES & set(getattr(item, "fixturenames", ()))
        for item in session.items
    )


@pytest.fixture(scope="session")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Cluster]:
    """A local control plane (etcd, apiserver with RBAC, KCM, scheduler, kwok) for the session."""
    node_network = _session_wants_real_nodes(request.session) and host_support() is None
    control_plane = ControlPlane(
        work_dir=tmp_path_factory.mktemp("cluster"), node_network=node_network
    )
    try:
        control_plane.start()
    except BinariesMissing as e:
        pytest.fail(str(e), pytrace=False)
    except RealNodeError as e:
        # The other tests still get their cluster; the real-node ones fail with this.
        _node_network_error.append(f"the control plane's node network: {e}")
        control_plane = ControlPlane(work_dir=tmp_path_factory.mktemp("cluster"))
        control_plane.start()
    shared = Cluster.from_control_plane(control_plane)
    _started.append((shared, cluster_scoped_objects(shared)))
    try:
        yield shared
    finally:
        _started.clear()
        control_plane.stop()


@pytest.fixture(scope="session")
def _real_node_pool(cluster: Cluster) -> Iterator[RealNodes]:
    reason = host_support()
    if reason:
        pytest.skip(reason)
    if _node_network_error:
        pytest.fail(_node_network_error[0], pytrace=False)
    assert cluster.control_plane is not None
    pool = RealNodes(cluster.control_plane)
    try:
        yield pool
    finally:
        pool.stop()


@pytest.fixture(scope="session")
def real_node(_real_node_pool: RealNodes) -> RealNode:
    """One real node for the session (kubelet + containerd + runc, Ready), with the runtime
    simulator (gpu-8x-nvlink) on /run/amp/eKitC/xdm/sockets/ and its device nodes in the node's
    private /dev. Tests that change it (containerd config, restarts) leave it Ready."""
    try:
        return _real_node_pool.add(inventory=REAL_NODE_INVENTORY, private_dev=True)
    except RealNodeError as e:
        pytest.fail(str(e), pytrace=False)


@dataclass
class RealNodeFactory:
    """``real_nodes.add(...)``: more real nodes for one test, stopped when it ends."""

    pool: RealNodes
    made: list[RealNode] = field(default_factory=list)

    def add(self, **kwargs: Any) -> RealNode:
        try:
            node = self.pool.add(**kwargs)
        except RealNodeError as e:
            pytest.fail(str(e), pytrace=False)
        self.made.append(node)
        return node


@pytest.fixture
def real_nodes(_real_node_pool: RealNodes) -> Iterator[RealNodeFactory]:
    """A factory of real nodes (``add(inventory=..., private_dev=..., labels=...)``) whose nodes
    stop at the end of the test."""
    factory = RealNodeFactory(_real_node_pool)
    try:
        yield factory
    finally:
        for node in reversed(factory.made):
            node.stop()


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    """A fresh namespace whose ``default`` service account exists (pods can be created)."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    with cluster.api_client() as api:
        core = client.CoreV1Api(api)
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
        _wait_default_service_account(core, name)
        try:
            yield name
        finally:
            try:
                core.delete_namespace(name)
            except ApiException as e:
                if e.status != 404:
                    raise


def _wait_default_service_account(
    core: client.CoreV1Api, name: str, deadline_s: float = 30.0
) -> None:
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            core.read_namespaced_service_account("default", name)
            return
        except ApiException as e:
            if e.status != 404:
                raise
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"service account default/{name} not created within {deadline_s:.0f} s: "
                "check the kube-controller-manager log"
            )
        time.sleep(0.05)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if not report.failed:
        return
    funcargs = getattr(item, "funcargs", {})
    handle = funcargs.get("cluster")
    if isinstance(handle, Cluster):
        report.sections.append(("control plane logs", handle.log_tails()))
    nodes = [v for v in funcargs.values() if isinstance(v, RealNode)]
    factory = funcargs.get("real_nodes")
    if isinstance(factory, RealNodeFactory):
        nodes += factory.made
    for node in nodes:
        report.sections.append((f"real node {node.name} logs", node.log_tails()))
