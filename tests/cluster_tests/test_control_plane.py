"""The local control plane through the real apiserver: workloads on KWOK nodes, Jobs, RBAC."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from lj_runtimekit_testkit.cluster.handle import Cluster
from lj_runtimekit_testkit.cluster.stages import EXIT_CODE_ANNOTATION

pytestmark = pytest.mark.cluster


def _eventually(what: str, check: Callable[[], bool], deadline_s: float = 60.0) -> None:
    deadline = time.monotonic() + deadline_s
    interval = 0.1
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {deadline_s:.0f} s")
        time.sleep(interval)
        interval = min(interval * 1.5, 1.0)


def _pod_spec() -> client.V1PodSpec:
    return client.V1PodSpec(
        containers=[client.V1Container(name="main", image="busybox")],
        restart_policy="Never",
    )


def test_gpu_nodes_become_ready_with_their_capacity(cluster: Cluster) -> None:
    names = cluster.create_gpu_nodes(2, prefix="cap", gpus=4, enable=True)
    for name in names:
        # returned only once schedulable: the apiserver's not-ready taint is lifted too
        spec = cluster.core().read_node(name).spec
        assert spec is not None
        assert not [t.key for t in spec.taints or [] if t.key.startswith("node.kubernetes.io/")]
    node = cluster.core().read_node(names[0])
    assert node.status is not None
    assert node.status.allocatable is not None
    assert node.status.allocatable["aliyun.com/gpu"] == "4"
    assert node.status.allocatable["aliyun.com/gpu-core"] == "400"
    assert node.metadata is not None
    assert node.metadata.labels is not None
    assert node.metadata.labels["lj_runtimekit_enable"] == "true"
    assert node.metadata.labels["network.topology/rack"].startswith("rack-")


def test_deployment_pods_run_on_kwok_nodes(cluster: Cluster, namespace: str) -> None:
    nodes = set(cluster.create_gpu_nodes(2, prefix="deploy"))
    labels = {"app": "web"}
    spec = _pod_spec()
    spec.restart_policy = "Always"
    spec.node_selector = {"type": "kwok"}
    deployment = client.V1Deployment(
        metadata=client.V1ObjectMeta(name="web"),
        spec=client.V1DeploymentSpec(
            replicas=3,
            selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels), spec=spec
            ),
        ),
    )
    with cluster.api_client() as api:
        apps = client.AppsV1Api(api)
        apps.create_namespaced_deployment(namespace, deployment)

        def ready() -> bool:
            status = apps.read_namespaced_deployment(name="web", namespace=namespace).status
            return status is not None and status.ready_replicas == 3

        _eventually("3 ready replicas", ready)
        pods = client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector="app=web")
        assert all(p.status and p.status.phase == "Running" for p in pods.items)
        assert {p.spec.node_name for p in pods.items if p.spec} <= nodes | set(
            n.metadata.name for n in client.CoreV1Api(api).list_node().items if n.metadata
        )


def _job(name: str, annotations: dict[str, str] | None = None) -> client.V1Job:
    return client.V1Job(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1JobSpec(
            backoff_limit=0,
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(annotations=annotations), spec=_pod_spec()
            ),
        ),
    )


def _job_condition(batch: client.BatchV1Api, namespace: str, name: str) -> set[str]:
    status = batch.read_namespaced_job(name=name, namespace=namespace).status
    conditions = (status.conditions if status else None) or []
    return {c.type for c in conditions if c.status == "True"}


def test_job_completes_and_another_is_made_to_fail(cluster: Cluster, namespace: str) -> None:
    cluster.create_gpu_nodes(1, prefix="jobs")
    with cluster.api_client() as api:
        batch = client.BatchV1Api(api)
        batch.create_namespaced_job(namespace, _job("ok"))
        batch.create_namespaced_job(namespace, _job("bad", {EXIT_CODE_ANNOTATION: "3"}))
        _eventually("job ok Complete", lambda: "Complete" in _job_condition(batch, namespace, "ok"))
        _eventually("job bad Failed", lambda: "Failed" in _job_condition(batch, namespace, "bad"))


def test_service_account_is_denied_what_its_role_does_not_grant(
    cluster: Cluster, namespace: str
) -> None:
    with cluster.api_client() as api:
        core = client.CoreV1Api(api)
        rbac = client.RbacAuthorizationV1Api(api)
        core.create_namespaced_service_account(
            namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="reader"))
        )
        rbac.create_namespaced_role(
            namespace,
            client.V1Role(
                metadata=client.V1ObjectMeta(name="pod-reader"),
                rules=[client.V1PolicyRule(api_groups=[""], resources=["pods"], verbs=["list"])],
            ),
        )
        rbac.create_namespaced_role_binding(
            namespace,
            client.V1RoleBinding(
                metadata=client.V1ObjectMeta(name="reader"),
                role_ref=client.V1RoleRef(
                    api_group="rbac.authorization.k8s.io", kind="Role", name="pod-reader"
                ),
                subjects=[
                    client.RbacV1Subject(kind="ServiceAccount", name="reader", namespace=namespace)
                ],
            ),
        )
        request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[]))
        issued = core.create_namespaced_service_account_token("reader", namespace, request)
        assert issued.status is not None
        token = issued.status.token
        configuration = client.Configuration()
        configuration.host = api.configuration.host
        configuration.ssl_ca_cert = api.configuration.ssl_ca_cert
        configuration.api_key = {"authorization": f"Bearer {token}"}
        with client.ApiClient(configuration) as as_reader:
            reader = client.CoreV1Api(as_reader)
            reader.list_namespaced_pod(namespace)
            with pytest.raises(ApiException) as denied:
                reader.list_namespaced_secret(namespace)
            assert denied.value.status == 403
            with pytest.raises(ApiException) as denied_nodes:
                reader.list_node()
            assert denied_nodes.value.status == 403


def test_daemonset_is_ready_on_labelled_nodes_only(cluster: Cluster, namespace: str) -> None:
    label = {"lj-testkit/ds": namespace}
    cluster.create_gpu_nodes(2, prefix="ds", labels=label)
    labels = {"app": "agent"}
    spec = _pod_spec()
    spec.restart_policy = "Always"
    spec.node_selector = label
    daemonset = client.V1DaemonSet(
        metadata=client.V1ObjectMeta(name="agent"),
        spec=client.V1DaemonSetSpec(
            selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels), spec=spec
            ),
        ),
    )
    with cluster.api_client() as api:
        apps = client.AppsV1Api(api)
        apps.create_namespaced_daemon_set(namespace, daemonset)

        def ready() -> bool:
            status = apps.read_namespaced_daemon_set(name="agent", namespace=namespace).status
            return (
                status is not None
                and status.desired_number_scheduled == 2
                and status.number_ready == 2
            )

        _eventually("2 ready daemon pods", ready)
