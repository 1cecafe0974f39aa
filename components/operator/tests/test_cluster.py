"""The operator on the harness cluster: real apiserver, kube-controller-manager and scheduler;
the suite's workloads run on KWOK nodes (KWOK makes their pods Running and Ready), and in the
rollback test the device plugin on a node played by the test's stand-in kubelet, which reports
a missing tag's pull failing as a kubelet does (KWOK would make any image Ready)."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from lj_runtimekit_operator.policy import GROUP

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[3]
REGISTRY = "registry.test/lj"
FEATURE = "lj_runtimekit_enable"
STATUS = "lj-runtimekit-controller/last-action-status"
TTL = "node.alpha.kubernetes.io/ttl"
#: The device plugin's DRA mode (docs/dra.md): rendered, applied and removed with it.
DRA_PLUGIN = "lj-runtimekit-dra-plugin"
DEVICE_CLASSES = [
    ("DeviceClass", "", f"{kind}.lj-runtimekit.aliyun.com")
    for kind in ("gpu", "gpu-share", "ppu", "mig", "tdm")
]
ORDER = [
    ("controller", "Deployment", "lj-runtimekit-controller"),
    ("scheduler", "Deployment", "lj-runtimekit-scheduler"),
    ("device-plugin", "DaemonSet", "lj-runtimekit-device-plugin"),
    ("exporter", "DaemonSet", "lj-runtimekit-exporter"),
]
KEYS = {
    "controller": "controller",
    "scheduler": "scheduler",
    "device-plugin": "devicePlugin",
    "exporter": "exporter",
}


def spec(kube: Any, version: str = "v1.14.0", **components: dict[str, Any]) -> dict[str, Any]:
    selector = {"lj-test/operator": kube.label}
    return {
        "registry": REGISTRY,
        "namespace": kube.namespace,
        "components": {
            KEYS[name]: {
                "version": version,
                "nodeSelector": selector,
                **components.get(KEYS[name], {}),
            }
            for name, _, _ in ORDER
        },
    }


def ready(kube: Any, name: str) -> Any:
    c = kube.condition(name, "Ready")
    return c if c.get("status") == "True" else None


async def kwok_nodes(cluster: Any, kube: Any, n: int = 2) -> list[str]:
    made: list[str] = await asyncio.to_thread(
        cluster.create_gpu_nodes, n, "op", 8, {"lj-test/operator": kube.label}, enable=True
    )
    return made


def node_state(kube: Any, names: list[str]) -> dict[str, Any]:
    """Each node's labels, annotations and taints, once kube-controller-manager's TTL controller
    has annotated it (it does so some time after the node is made, whatever the operator does)."""
    out = {}
    for n in names:
        node = kube.core.read_node(n)
        for _ in range(300):
            if TTL in (node.metadata.annotations or {}):
                break
            time.sleep(0.1)
            node = kube.core.read_node(n)
        out[n] = (node.metadata.labels, node.metadata.annotations, node.spec.taints)
    return out


def assert_one_node_in_dra_mode(kube: Any, nodes: int) -> None:
    """The DRA DaemonSet runs on the one node in DRA mode, the device plugin's on the others."""
    dra = kube.apps.read_namespaced_daemon_set(DRA_PLUGIN, kube.namespace)
    assert (dra.status.desired_number_scheduled, dra.status.number_available) == (1, 1)
    image = dra.spec.template.spec.containers[0].image
    assert image == f"{REGISTRY}/lj-runtimekit-device-plugin:v1.14.0"
    main = kube.apps.read_namespaced_daemon_set("lj-runtimekit-device-plugin", kube.namespace)
    assert main.status.desired_number_scheduled == nodes - 1


async def test_a_policy_installs_converges_and_its_deletion_removes_the_suite(
    cluster: Any, kube: Any, start_operator: Any
) -> None:
    nodes = await kwok_nodes(cluster, kube)
    kube.core.patch_node(nodes[0], {"metadata": {"labels": {"lj_runtimekit_device_mode": "dra"}}})
    before = await asyncio.to_thread(node_state, kube, nodes)
    config = "version: v1\nlog_format: json\nconcurrency: 3\n"
    name = kube.create_policy(spec(kube, controller={"config": config}))
    first = await start_operator()

    await kube.poll(lambda: ready(kube, name), what="the policy Ready")
    for component, kind, workload in ORDER:
        image = kube.workload_image(kind, workload)
        assert image == f"{REGISTRY}/{workload}:v1.14.0", component
        st = kube.component(name, component)
        assert (st["version"], st["ready"], st["lastReadyVersion"]) == ("v1.14.0", True, "v1.14.0")
    cm = kube.core.read_namespaced_config_map("lj-runtimekit-controller", kube.namespace)
    assert cm.data["config.yaml"] == config
    dep = kube.apps.read_namespaced_deployment("lj-runtimekit-controller", kube.namespace)
    assert f"--job-image={REGISTRY}/lj-runtimekit-controller-job-agent:v1.14.0" in (
        dep.spec.template.spec.containers[0].args
    )
    assert dep.spec.template.spec.node_selector == {"lj-test/operator": kube.label}
    assert [o.kind for o in dep.metadata.owner_references] == ["RuntimeKitPolicy"]
    made = kube.labelled(name)
    assert ("ClusterRole", "", "lj-runtimekit-scheduler") in made
    assert ("RuntimeClass", "", "lj-runtime") in made
    assert set(DEVICE_CLASSES) <= set(made)
    assert_one_node_in_dra_mode(kube, len(nodes))
    row = kube.table(name)
    assert row["Name"] == name
    assert (row["Ready"], row["Progressing"], row["Degraded"]) == ("True", "False", "False")
    assert [row[c] for c in ("Controller", "Scheduler", "Device-Plugin", "Exporter")] == [
        "v1.14.0"
    ] * 4
    obj = kube.policy(name)
    assert f"{GROUP}/operator" in obj["metadata"]["finalizers"]

    # A spec it cannot use changes nothing and says which field.
    kube.patch_policy(name, {"components": {"scheduler": {"config": "log_level: debug"}}})
    invalid = await kube.poll(
        lambda: (c := kube.condition(name, "Degraded")).get("reason") == "InvalidSpec" and c,
        what="Degraded InvalidSpec",
    )
    assert invalid["message"].startswith("spec.components.scheduler.config: expected a YAML")
    cm = kube.core.read_namespaced_config_map("lj-runtimekit-scheduler", kube.namespace)
    assert "log_level: debug" not in cm.data["config.yaml"]
    kube.patch_policy(name, {"components": {"scheduler": {"config": None}}})
    await kube.poll(lambda: ready(kube, name), what="Ready again")
    assert obj["status"]["observedGeneration"] == obj["metadata"]["generation"]

    # A second policy is refused, the first stays in force.
    second = kube.create_policy(spec(kube))
    degraded = await kube.poll(
        lambda: (c := kube.condition(second, "Degraded")).get("status") == "True" and c,
        what="the second policy Degraded",
    )
    assert degraded["reason"] == "DuplicatePolicy"
    assert degraded["message"] == f"only one RuntimeKitPolicy per cluster; {name} is in force"
    kube.delete_policy(second)

    # A component switched off: its objects go, the rest stays Ready.
    kube.patch_policy(name, {"components": {"exporter": {"enabled": False}}})
    await kube.poll(
        lambda: not [o for o in kube.labelled(name) if "exporter" in o[2]],
        what="the exporter's objects removed",
    )
    await kube.poll(
        lambda: kube.component(name, "exporter").get("enabled") is False and ready(kube, name),
        what="exporter disabled, policy Ready",
    )
    assert kube.workload_image("DaemonSet", "lj-runtimekit-device-plugin")

    await undone_as_undeploy_does(kube, name, nodes, before, first=first, start=start_operator)


def controller_result(action: str) -> str:
    return json.dumps({"action": action, "result": "succeeded", "job": f"lj-agent-x-{action}"})


async def undone_as_undeploy_does(
    kube: Any, name: str, nodes: list[str], before: dict[str, Any], *, first: Any, start: Any
) -> None:
    """Deleting the policy undoes it as deploy-all.sh undeploy does (#39): the feature label off,
    the suite kept until the controller has disabled every node it enabled (played here: KWOK
    runs no controller), then removed, then its labels and annotations off the nodes; a restart
    of the operator in the middle goes on where it stopped."""
    enabled, never = nodes[0], nodes[1]
    suite = {
        "labels": {"lj-runtimekit.aliyun.com/count": "8"},
        "annotations": {STATUS: controller_result("enable"), "lj-runtimekit-scheduler/x": "1"},
    }
    kube.core.patch_node(enabled, {"metadata": suite})
    kube.delete_policy(name)

    def waiting() -> str:
        message = str(kube.condition(name, "Progressing").get("message", ""))
        return message if "waiting for the controller to disable" in message else ""

    message = await kube.poll(waiting, what="the policy waiting for the nodes")
    assert f"{enabled}: last action enable succeeded" in message
    assert never not in message, "a node the controller never enabled needs only the label off"
    for n in nodes:
        assert FEATURE not in (kube.core.read_node(n).metadata.labels or {}), n
    assert ("Deployment", kube.namespace, "lj-runtimekit-controller") in kube.labelled(name)
    await first.stop()  # a restart mid-teardown: the next leader goes on from the status
    await start()
    await kube.poll(waiting, what="the new leader waiting for the nodes too")
    kube.core.patch_node(
        enabled, {"metadata": {"annotations": {STATUS: controller_result("disable")}}}
    )
    await kube.poll(lambda: kube.policy(name) is None, what="the policy gone (finalizer released)")
    assert kube.labelled(name) == []
    after = await asyncio.to_thread(node_state, kube, nodes)
    for n in nodes:
        labels, annotations, taints = before[n]
        expected = ({k: v for k, v in labels.items() if k != FEATURE}, annotations or {}, taints)
        assert (after[n][0], after[n][1] or {}, after[n][2]) == expected, n


async def test_a_version_bump_rolls_out_one_component_at_a_time_in_the_safe_order(
    cluster: Any, kube: Any, start_operator: Any
) -> None:
    await kwok_nodes(cluster, kube)
    name = kube.create_policy(spec(kube))
    await start_operator()
    await kube.poll(lambda: ready(kube, name), what="the policy Ready")
    seen: list[tuple[str, dict[str, str]]] = []  # (component switched, every image at that time)

    def watch_order() -> Any:
        images = {c: kube.workload_image(k, w).rpartition(":")[2] for c, k, w in ORDER}
        if not seen or seen[-1][1] != images:
            changed = [c for c in images if not seen or seen[-1][1][c] != images[c]]
            seen.extend((c, images) for c in changed)
        return all(v == "v1.14.1" for v in images.values()) and ready(kube, name)

    kube.patch_policy(name, spec(kube, version="v1.14.1"))
    await kube.poll(watch_order, what="every component at v1.14.1 and Ready")
    switched = [c for c, _ in seen if c in dict((o[0], 1) for o in ORDER)][-4:]
    assert switched == [c for c, _, _ in ORDER]
    # each switched only when every one before it already ran the new version
    for i, (component, images) in enumerate(seen[-4:]):
        assert all(images[c] == "v1.14.1" for c, _, _ in ORDER[: i + 1]), (component, images)
    for component, _, _ in ORDER:
        assert kube.component(name, component)["lastReadyVersion"] == "v1.14.1"


async def test_a_tag_that_does_not_pull_is_rolled_back_with_degraded_rollout_failed(
    cluster: Any, kube: Any, start_operator: Any, kubelet: Any
) -> None:
    await kwok_nodes(cluster, kube, 1)
    standin = {"lj-test/standin": kube.label}
    await asyncio.to_thread(kubelet.add_nodes, 1, standin)
    dp = {"nodeSelector": standin}
    name = kube.create_policy(spec(kube, devicePlugin=dp))
    first = await start_operator()
    await kube.poll(lambda: ready(kube, name), what="the policy Ready")

    bad = f"{REGISTRY}/lj-runtimekit-device-plugin:{kubelet.missing_tag}"
    kube.patch_policy(name, {"components": {"devicePlugin": {"version": kubelet.missing_tag}}})
    degraded = await kube.poll(
        lambda: (c := kube.condition(name, "Degraded")).get("status") == "True" and c,
        what="Degraded",
    )
    assert degraded["reason"] == "RolloutFailed"
    assert degraded["message"].startswith(f"device-plugin: image {bad} failed: pod ")
    assert "is waiting: ImagePullBackOff" in degraded["message"]
    assert degraded["message"].endswith("; rolled back to v1.14.0")
    assert bad in kubelet.pulled, "the bad image was tried on the node"
    st = await kube.poll(
        lambda: (s := kube.component(name, "device-plugin")).get("ready") and s,
        what="the device plugin ready again at the old version",
    )
    assert (st["version"], st["failedImage"]) == ("v1.14.0", bad)
    image = kube.workload_image("DaemonSet", "lj-runtimekit-device-plugin")
    assert image == f"{REGISTRY}/lj-runtimekit-device-plugin:v1.14.0"
    assert kube.condition(name, "Ready")["reason"] == "RolloutFailed"
    # A new leader remembers from the status: it does not try the failed tag again.
    await first.stop()
    second = await start_operator()
    await kube.poll(
        lambda: second.operator.metrics.reconciles._value.get() >= 1,
        what="a whole pass of the new leader",
    )
    image = kube.workload_image("DaemonSet", "lj-runtimekit-device-plugin")
    assert image == f"{REGISTRY}/lj-runtimekit-device-plugin:v1.14.0"
    assert kube.condition(name, "Degraded")["reason"] == "RolloutFailed"
    # The failed tag is not retried by itself; naming a good one again clears Degraded.
    kube.patch_policy(name, {"components": {"devicePlugin": {"version": "v1.14.0"}}})
    await kube.poll(
        lambda: kube.condition(name, "Degraded").get("status") == "False" and ready(kube, name),
        what="Degraded cleared",
    )


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return str(resp.read().decode())


def install_operator_rbac(kube: Any, tmp_path: Path, server_kubeconfig: str) -> str:
    """deploy/operator/02-rbac.yaml in the test's namespace (its cluster-wide names suffixed), and
    a kubeconfig holding a token of its ServiceAccount: the operator then has only those rights."""
    ns, suffix = kube.namespace, f"-{kube.namespace}"
    rbac = client.RbacAuthorizationV1Api(kube.api)
    for obj in yaml.safe_load_all((REPO / "deploy" / "operator" / "02-rbac.yaml").read_text()):
        meta = obj["metadata"]
        for subject in obj.get("subjects") or []:
            subject["namespace"] = ns
        if obj["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            meta["name"] += suffix
            if obj["kind"] == "ClusterRoleBinding":
                obj["roleRef"]["name"] += suffix
            if obj["kind"] == "ClusterRole":
                rbac.create_cluster_role(obj)
            else:
                rbac.create_cluster_role_binding(obj)
            kube.cleanup.append((obj["kind"], meta["name"]))
            continue
        meta["namespace"] = ns
        if obj["kind"] == "ServiceAccount":
            kube.core.create_namespaced_service_account(ns, obj)
        elif obj["kind"] == "Role":
            rbac.create_namespaced_role(ns, obj)
        else:
            rbac.create_namespaced_role_binding(ns, obj)
    token = kube.core.create_namespaced_service_account_token(
        "lj-runtimekit-operator", ns, {"spec": {"expirationSeconds": 3600}}
    ).status.token
    config = yaml.safe_load(Path(server_kubeconfig).read_text())
    config["users"] = [{"name": "operator", "user": {"token": token}}]
    for context in config["contexts"]:
        context["context"]["user"] = "operator"
    path = tmp_path / "operator.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return str(path)


async def test_the_operator_does_its_job_with_only_the_rights_deploy_operator_grants(
    cluster: Any, kube: Any, start_operator: Any, tmp_path: Path
) -> None:
    await kwok_nodes(cluster, kube, 1)
    kubeconfig = await asyncio.to_thread(install_operator_rbac, kube, tmp_path, cluster.kubeconfig)
    name = kube.create_policy(spec(kube))
    running = await start_operator(kubeconfig=kubeconfig)
    await kube.poll(lambda: ready(kube, name), what="the policy Ready")
    assert not running.operator.degraded(), "no request of the operator was refused"
    # The device plugin in DRA mode comes with it: the DaemonSet (on no node here: none is in
    # DRA mode, and that is ready) and the DeviceClasses, cluster-scoped.
    made = kube.labelled(name)
    assert [o for o in made if o[0] == "DeviceClass"] == sorted(DEVICE_CLASSES)
    assert ("DaemonSet", kube.namespace, DRA_PLUGIN) in made
    dra = kube.apps.read_namespaced_daemon_set(DRA_PLUGIN, kube.namespace)
    assert dra.spec.template.spec.containers[0].image == (
        f"{REGISTRY}/lj-runtimekit-device-plugin:v1.14.0"
    )
    assert dra.spec.template.spec.node_selector == {
        "lj-test/operator": kube.label,
        "lj_runtimekit_device_mode": "dra",
    }
    assert dra.status.desired_number_scheduled == 0
    assert kube.component(name, "device-plugin")["ready"] is True
    port = running.operator.port
    health = await asyncio.to_thread(fetch, f"http://127.0.0.1:{port}/healthz")
    assert health == "ok\n"
    metrics = await asyncio.to_thread(fetch, f"http://127.0.0.1:{port}/metrics")
    for component, _, _ in ORDER:
        assert f'lj_runtimekit_operator_component_ready{{component="{component}"}} 1.0' in metrics
    assert "lj_runtimekit_operator_leader 1.0" in metrics
    kube.delete_policy(name)
    await kube.poll(lambda: kube.policy(name) is None, what="the policy gone")
    assert kube.labelled(name) == []
