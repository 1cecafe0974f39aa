"""The static manifests keep the promises of the guide and the hardening the issue asks for."""

from __future__ import annotations

import re

import pytest

from lj_runtimekit_testkit.manifests import (
    FOLDERS,
    IMAGES,
    Obj,
    component_version,
    containers,
    key,
    pod_spec,
    static_objects,
)

REGISTRY = "lj-runtimekit-registry.cn-hangzhou.cr.aliyuncs.com/lj-runtimekit"
WORKLOADS = {
    "device-plugin": "DaemonSet",
    "exporter": "DaemonSet",
    "scheduler": "Deployment",
    "controller": "Deployment",
}


def workload(component: str) -> Obj:
    (obj,) = [
        o
        for o in static_objects([component])
        if o["kind"] == WORKLOADS[component]
        and o["metadata"]["name"] == f"lj-runtimekit-{component}"
    ]
    return obj


def test_every_object_has_a_unique_identity_and_belongs_to_the_suite() -> None:
    objs = static_objects()
    keys = [key(o) for o in objs]
    assert len(keys) == len(set(keys)), "an object is defined twice"
    for o in objs:
        if o["kind"] == "CustomResourceDefinition":
            continue
        assert o["metadata"]["labels"]["app.kubernetes.io/part-of"] == "lj-runtimekit", key(o)
        if o["kind"] not in {"RuntimeClass", "ClusterRole", "ClusterRoleBinding", "DeviceClass"}:
            ns = o["metadata"].get("namespace")
            cluster_scoped = {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
            assert ns == ("kube-system" if o["kind"] not in cluster_scoped else None), key(o)


@pytest.mark.parametrize("component", list(FOLDERS), ids=list(FOLDERS))
def test_workload_is_named_and_labelled_as_the_guide_says(component: str) -> None:
    obj = workload(component)
    name = f"lj-runtimekit-{component}"
    assert obj["spec"]["selector"]["matchLabels"] == {"app": name}
    assert obj["spec"]["template"]["metadata"]["labels"]["app"] == name
    assert [c["name"] for c in containers(obj)] == [name]
    assert pod_spec(obj)["serviceAccountName"] == name


@pytest.mark.parametrize("component", list(FOLDERS), ids=list(FOLDERS))
def test_image_is_the_release_of_that_component(component: str) -> None:
    (c,) = containers(workload(component))
    assert c["image"] == f"{REGISTRY}/{IMAGES[component]}:v{component_version(component)}"
    assert c["imagePullPolicy"] == "IfNotPresent"


def test_controller_runs_the_job_agent_of_the_same_release() -> None:
    (c,) = containers(workload("controller"))
    (job_image,) = [a.split("=", 1)[1] for a in c["args"] if a.startswith("--job-image=")]
    assert job_image == f"{REGISTRY}/{IMAGES['job-agent']}:v{component_version('job-agent')}"


@pytest.mark.parametrize("component", ["device-plugin", "exporter"])
def test_node_agents_run_only_on_labelled_nodes_and_are_critical(component: str) -> None:
    obj = workload(component)
    spec = pod_spec(obj)
    assert spec["nodeSelector"] == {"lj_runtimekit_enable": "true"}
    assert spec["priorityClassName"] == "system-node-critical"
    assert obj["spec"]["updateStrategy"]["type"] == "RollingUpdate"


@pytest.mark.parametrize("component", ["scheduler", "controller"])
def test_cluster_services_run_as_non_root(component: str) -> None:
    obj = workload(component)
    spec = pod_spec(obj)
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    assert spec["priorityClassName"] == "system-cluster-critical"
    assert obj["spec"]["strategy"]["type"] == "RollingUpdate"


@pytest.mark.parametrize("component", list(FOLDERS), ids=list(FOLDERS))
def test_containers_are_hardened_probed_and_bounded(component: str) -> None:
    (c,) = containers(workload(component))
    sc = c["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc.get("privileged", False) is False
    assert c["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert set(c["resources"]["requests"]) == {"cpu", "memory"}
    assert "memory" in c["resources"]["limits"]


@pytest.mark.parametrize("component", list(FOLDERS), ids=list(FOLDERS))
def test_config_comes_from_the_component_configmap(component: str) -> None:
    objs = static_objects([component])
    (cm,) = [o for o in objs if o["kind"] == "ConfigMap"]
    assert cm["metadata"]["name"] == f"lj-runtimekit-{component}"
    assert re.search(r"^version: v1$", cm["data"]["config.yaml"], re.M)
    spec = pod_spec(workload(component))
    (vol,) = [v for v in spec["volumes"] if v["name"] == "config"]
    assert vol["configMap"]["name"] == cm["metadata"]["name"]
    (c,) = containers(workload(component))
    assert "--config=/etc/lj-runtimekit/config.yaml" in c["args"]


def test_exporter_serves_9501_on_the_node() -> None:
    obj = workload("exporter")
    (c,) = containers(obj)
    assert pod_spec(obj)["hostNetwork"] is True
    assert {"name": "metrics", "containerPort": 9501, "hostPort": 9501} in c["ports"]


def test_runtime_class_is_the_guides() -> None:
    (rc,) = [o for o in static_objects([]) if o["kind"] == "RuntimeClass"]
    assert rc["metadata"]["name"] == "lj-runtime"
    assert rc["handler"] == "lj-runtime"


def test_no_role_grants_secrets_or_wildcards() -> None:
    for o in static_objects():
        if o["kind"] not in {"ClusterRole", "Role"}:
            continue
        for rule in o["rules"]:
            assert "*" not in rule["verbs"], key(o)
            assert "*" not in rule["resources"], key(o)
            assert "secrets" not in rule["resources"], key(o)


NODE_AGENTS = ["device-plugin", "exporter"]


def mounts(component: str) -> dict[str, tuple[Obj, Obj]]:
    """mountPath → (volumeMount, volume) of the component's container."""
    obj = workload(component)
    (c,) = containers(obj)
    volumes = {v["name"]: v for v in pod_spec(obj)["volumes"]}
    return {m["mountPath"]: (m, volumes[m["name"]]) for m in c["volumeMounts"]}


@pytest.mark.parametrize("component", NODE_AGENTS)
def test_node_agents_reach_the_kubelets_read_only_port_on_the_host_network(
    component: str,
) -> None:
    # pods_source kubelet reads http://localhost:10255/pods: localhost must be the node's.
    spec = pod_spec(workload(component))
    assert spec["hostNetwork"] is True
    assert spec["dnsPolicy"] == "ClusterFirstWithHostNet", "or cluster DNS is lost on the host net"
    (c,) = containers(workload(component))
    for port in c["ports"]:
        assert port.get("hostPort", port["containerPort"]) == port["containerPort"], port


@pytest.mark.parametrize(
    ("component", "path", "writable"),
    [
        ("device-plugin", "/var/lib/kubelet/device-plugins", True),
        ("device-plugin", "/var/lib/kubelet/pod-resources", False),
        ("device-plugin", "/run/amp/eKitC/xdm/sockets", True),
        ("exporter", "/var/lib/kubelet/pod-resources", False),
        ("exporter", "/run/amp/eKitC/xdm/sockets", False),
    ],
    ids=lambda v: str(v).replace("/", "_") if isinstance(v, str) else str(v),
)
def test_node_agents_mount_the_node_sockets_they_use_at_the_nodes_paths(
    component: str, path: str, writable: bool
) -> None:
    assert path in mounts(component), f"{component} does not mount {path}"
    mount, volume = mounts(component)[path]
    assert volume["hostPath"]["path"] == path, "settings name host paths: mount them as such"
    assert mount.get("readOnly", False) is not writable


@pytest.mark.parametrize("component", NODE_AGENTS)
def test_every_host_path_says_its_type(component: str) -> None:
    for path, (_, volume) in mounts(component).items():
        if "hostPath" not in volume:
            continue
        kind = volume["hostPath"].get("type")
        # The kubelet's own directory must exist; a peer's (Runtime, pod-resources under another
        # --root-dir) may come later: the daemon waits and says so instead of the pod hanging.
        want = "Directory" if path == "/var/lib/kubelet/device-plugins" else "DirectoryOrCreate"
        assert kind == want, (component, path, kind)


@pytest.mark.parametrize("component", NODE_AGENTS)
def test_node_agents_connect_to_root_owned_sockets_as_root_without_capabilities(
    component: str,
) -> None:
    (c,) = containers(workload(component))
    sc = c["securityContext"]
    assert sc["runAsUser"] == 0
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
