"""deploy-all.sh on the local control plane with KWOK nodes, some labelled and some not: what the
guide promises in §3.3–§3.6 and §7.3, and least privilege checked with real tokens."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from lj_runtimekit_testkit.cluster.handle import Cluster
from lj_runtimekit_testkit.manifests import DEPLOY, key, static_objects, tool_dir

pytestmark = pytest.mark.cluster

NS = "kube-system"
DS = ("device-plugin", "exporter")
DEPLOYMENTS = ("scheduler", "controller")


class Kubectl:
    def __init__(self, cluster: Cluster, log_dir: Path) -> None:
        self.bin = tool_dir() / "kubectl"
        self.env = {
            **os.environ,
            "KUBECONFIG": cluster.kubeconfig,
            "KUBECTL": str(self.bin),
            "LJ_RUNTIMEKIT_LOG_DIR": str(log_dir),
            "ROLLOUT_TIMEOUT": "180s",
        }
        self.env.pop("lj_runtimekit_version", None)
        self.env.pop("LJ_RUNTIMEKIT_REGISTRY", None)

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bin), *args], env=self.env, capture_output=True, text=True, check=check
        )

    def json(self, *args: str) -> Any:
        return json.loads(self(*args, "-o", "json").stdout)

    def deploy_all(
        self, *args: str, check: bool = True, **env: str
    ) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(
            [str(DEPLOY / "deploy-all.sh"), *args],
            env={**self.env, **env},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if check:
            assert out.returncode == 0, f"deploy-all.sh {' '.join(args)} failed:\n{out.stdout}"
        return out

    def resource_versions(self) -> dict[tuple[str, str, str], str]:
        """resourceVersion of every object deploy-all.sh applies (absent ones left out)."""
        versions = {}
        for obj in static_objects():
            kind, ns, name = key(obj)
            group = _group(obj)
            args = ["get", f"{kind.lower()}.{group}" if group else kind.lower(), name]
            if ns:
                args += ["-n", ns]
            got = self(*args, "-o", "jsonpath={.metadata.resourceVersion}", check=False)
            if got.returncode == 0:
                versions[(kind, ns, name)] = got.stdout
        return versions


def _group(obj: dict[str, Any]) -> str:
    api = str(obj["apiVersion"])
    return api.split("/", maxsplit=1)[0] if "/" in api else ""


def labelled_nodes(k: Kubectl) -> set[str]:
    nodes = k.json("get", "nodes", "-l", "lj_runtimekit_enable=true")["items"]
    return {n["metadata"]["name"] for n in nodes}


def pods_of(k: Kubectl, component: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = k.json(
        "-n", NS, "get", "pods", "-l", f"app=lj-runtimekit-{component}"
    )["items"]
    return items


def image_of(k: Kubectl, component: str) -> str:
    kind = "daemonset" if component in DS else "deployment"
    obj = k.json("-n", NS, "get", f"{kind}/lj-runtimekit-{component}")
    return str(obj["spec"]["template"]["spec"]["containers"][0]["image"])


def poll(check: Any, what: str, deadline_s: float = 60.0) -> None:
    deadline = time.monotonic() + deadline_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not within {deadline_s:.0f} s")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def k(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kubectl]:
    cluster.create_gpu_nodes(3, prefix="deploy-on", enable=True)
    cluster.create_gpu_nodes(2, prefix="deploy-off")
    kubectl = Kubectl(cluster, tmp_path_factory.mktemp("deploy-logs"))
    yield kubectl
    kubectl.deploy_all("undeploy", "--yes", "--purge")


@pytest.fixture(scope="module")
def deployed(k: Kubectl) -> subprocess.CompletedProcess[str]:
    return k.deploy_all("deploy")


def test_dry_run_passes_server_side_and_creates_nothing(k: Kubectl) -> None:
    out = k.deploy_all("deploy", "--dry-run")
    assert "(server dry run)" in out.stdout
    assert k.resource_versions() == {}


def test_deploy_brings_every_workload_to_ready_on_labelled_nodes_only(
    k: Kubectl, deployed: subprocess.CompletedProcess[str]
) -> None:
    assert "all selected components are ready" in deployed.stdout
    labelled = labelled_nodes(k)
    for c in DS:
        nodes = {p["spec"]["nodeName"] for p in pods_of(k, c)}
        assert nodes == labelled, f"{c} runs on {nodes}, expected the labelled {labelled}"
    for c in DEPLOYMENTS:
        assert pods_of(k, c), f"{c} has no pod"
    log_files = list(Path(k.env["LJ_RUNTIMEKIT_LOG_DIR"]).glob("deploy-*.log"))
    assert any("verification (guide §3.4)" in f.read_text() for f in log_files), (
        "deploy-all.sh wrote no log file with its verification"
    )


APPLIED = re.compile(r"\[INFO\]   (\S+/\S+) (created|configured|unchanged|restarted)$", re.M)


def test_a_second_deploy_changes_nothing_and_says_so(k: Kubectl, deployed: Any) -> None:
    before = k.resource_versions()
    assert len(before) == len(static_objects())
    again = k.deploy_all("deploy")
    assert k.resource_versions() == before
    said = dict(APPLIED.findall(again.stdout))
    assert len(said) == len(static_objects()), again.stdout
    # kubectl says "configured" whenever its patch is not empty, even when the apiserver then
    # stores nothing new: a manifest that differs from what the apiserver keeps (a field it
    # defaults) would look like a change on every run.
    assert {o: v for o, v in said.items() if v != "unchanged"} == {}


def test_the_node_label_reaches_every_component_and_a_node_agent_on_no_node_is_not_ready(
    k: Kubectl, deployed: Any
) -> None:
    """NODE_LABEL=example.com/lj-gpu=true on one node: the DaemonSets run there only, the
    RuntimeClass selects it, the scheduler and controller read that label (restarted to read
    it). Then no node has the label: verify says the node agents run nowhere."""
    (node, *_) = sorted(labelled_nodes(k))
    label = "example.com/lj-gpu"
    k("label", "node", node, f"{label}=true")
    try:
        out = k.deploy_all("deploy", NODE_LABEL=f"{label}=true")
        assert f"node label {label}=true" in out.stdout
        for c in DS:
            ds = k.json("-n", NS, "get", f"daemonset/lj-runtimekit-{c}")
            assert ds["spec"]["template"]["spec"]["nodeSelector"] == {label: "true"}, c
            poll(lambda c=c: {p["spec"]["nodeName"] for p in pods_of(k, c)} == {node}, c)
        rc = k.json("get", "runtimeclass", "lj-runtime")
        assert rc["scheduling"]["nodeSelector"] == {label: "true"}
        config = {
            c: yaml.safe_load(
                k.json("-n", NS, "get", "configmap", f"lj-runtimekit-{c}")["data"]["config.yaml"]
            )
            for c in DEPLOYMENTS
        }
        assert config["scheduler"]["feature_label"] == label
        assert (config["controller"]["label_key"], config["controller"]["label_value"]) == (
            label,
            "true",
        )
        for c in DEPLOYMENTS:
            assert f"restart deployment/lj-runtimekit-{c} to read it" in out.stdout, c

        k("label", "node", node, f"{label}-")
        poll(lambda: not pods_of(k, "exporter"), "the exporter gone from the unlabelled node")
        verify = k.deploy_all("verify", check=False, NODE_LABEL=f"{label}=true")
        assert verify.returncode == 1
        (line,) = [ln for ln in verify.stdout.splitlines() if "/lj-runtimekit-exporter " in ln]
        assert "[WARN]" in line
        assert "ready 0/0: on no node" in line
        assert "all selected components are ready" not in verify.stdout
    finally:
        k("label", "node", node, f"{label}-", check=False)
        k.deploy_all("deploy")
    for c in DS:
        ds = k.json("-n", NS, "get", f"daemonset/lj-runtimekit-{c}")
        assert ds["spec"]["template"]["spec"]["nodeSelector"] == {"lj_runtimekit_enable": "true"}


def test_one_component_deploy_touches_only_that_component_and_rolls_back(
    k: Kubectl, deployed: Any
) -> None:
    before = k.resource_versions()
    k.deploy_all("deploy", "--components=exporter", lj_runtimekit_version="v1.14.1")
    after = k.resource_versions()
    changed = {kk for kk in before if before[kk] != after[kk]}
    assert changed == {("DaemonSet", NS, "lj-runtimekit-exporter")}
    assert image_of(k, "exporter").endswith("/lj-runtimekit-exporter:v1.14.1")
    assert image_of(k, "device-plugin").endswith(":v1.14.0")
    k("-n", NS, "rollout", "status", "daemonset/lj-runtimekit-exporter", "--timeout=180s")
    poll(
        lambda: all(
            p["spec"]["containers"][0]["image"].endswith(":v1.14.1") for p in pods_of(k, "exporter")
        ),
        "every exporter pod on v1.14.1",
    )

    k.deploy_all("deploy", "--components=exporter")  # the tag written in the manifest again
    assert image_of(k, "exporter").endswith("/lj-runtimekit-exporter:v1.14.0")
    k("-n", NS, "rollout", "status", "daemonset/lj-runtimekit-exporter", "--timeout=180s")
    history = k("-n", NS, "rollout", "history", "daemonset/lj-runtimekit-exporter").stdout
    assert len([ln for ln in history.splitlines() if ln[:1].isdigit()]) >= 2


def test_exporter_can_read_pods_and_cannot_read_secrets(k: Kubectl, deployed: Any) -> None:
    sa = f"system:serviceaccount:{NS}:lj-runtimekit-exporter"
    assert k("auth", "can-i", "list", "pods", f"--as={sa}", check=False).stdout.strip() == "yes"
    for verb, what in [("list", "secrets"), ("patch", "nodes"), ("create", "pods")]:
        got = k("auth", "can-i", verb, what, f"--as={sa}", check=False).stdout.strip()
        assert got == "no", f"the exporter may {verb} {what}"


def test_controller_may_only_make_jobs_in_kube_system(k: Kubectl, deployed: Any) -> None:
    sa = f"system:serviceaccount:{NS}:lj-runtimekit-controller"

    def can(*a: str) -> str:
        return k("auth", "can-i", *a, f"--as={sa}", check=False).stdout.strip()

    assert can("create", "jobs.batch", "-n", NS) == "yes"
    assert can("create", "jobs.batch", "-n", "default") == "no"
    assert can("patch", "nodes") == "yes"
    assert can("list", "secrets", "-n", NS) == "no"
    agent = f"system:serviceaccount:{NS}:lj-runtimekit-job-agent"
    got = k("auth", "can-i", "get", "nodes", f"--as={agent}", check=False).stdout.strip()
    assert got == "no"


# A label of the kind the device plugin keeps on its node (its own-node policy allows no other).
OWNER = "lj-runtimekit.aliyun.com/test-owner"


def token_kubeconfig(k: Kubectl, token: str, path: Path) -> Path:
    admin = yaml.safe_load(Path(k.env["KUBECONFIG"]).read_text())
    cluster = admin["clusters"][0]
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [cluster],
                "users": [{"name": "sa", "user": {"token": token}}],
                "contexts": [{"name": "sa", "context": {"cluster": cluster["name"], "user": "sa"}}],
                "current-context": "sa",
            }
        )
    )
    return path


def test_device_plugin_token_may_label_its_own_node_and_no_other(
    k: Kubectl, deployed: Any, tmp_path: Path
) -> None:
    pods = pods_of(k, "device-plugin")
    mine = pods[0]
    own_node = mine["spec"]["nodeName"]
    other_node = next(iter(labelled_nodes(k) - {own_node}))
    token = k(
        "-n", NS, "create", "token", "lj-runtimekit-device-plugin",
        "--bound-object-kind=Pod",
        f"--bound-object-name={mine['metadata']['name']}",
        f"--bound-object-uid={mine['metadata']['uid']}",
    ).stdout.strip()  # fmt: skip
    as_plugin = token_kubeconfig(k, token, tmp_path / "plugin.kubeconfig")

    def label(node: str, value: str) -> subprocess.CompletedProcess[str]:
        return k(
            f"--kubeconfig={as_plugin}", "label", "node", node, f"{OWNER}={value}",
            "--overwrite", check=False,
        )  # fmt: skip

    poll(lambda: "may only write its own node" in label(other_node, "a").stderr, "policy active")
    assert label(own_node, "b").returncode == 0
    owner = OWNER.replace(".", "\\.")
    assert k("get", "node", own_node, "-o", f"jsonpath={{.metadata.labels.{owner}}}").stdout == "b"
    denied = k(f"--kubeconfig={as_plugin}", "get", "secrets", "-n", NS, check=False)
    assert "forbidden" in denied.stderr.lower()


def test_undeploy_keeps_the_shared_objects_and_purge_leaves_nothing_behind(
    k: Kubectl, deployed: Any
) -> None:
    k.deploy_all("undeploy", "--yes")
    assert set(k.resource_versions()) == {
        ("CustomResourceDefinition", "", "nodedevices.lj-runtimekit.aliyun.com"),
        # deploy/crds/ holds the operator's CRD too: kept like the other shared objects
        ("CustomResourceDefinition", "", "runtimekitpolicies.lj-runtimekit.aliyun.com"),
        ("RuntimeClass", "", "lj-runtime"),
    }
    assert k("get", "nodedevices", "-o", "name").stdout == "", "the nodes' inventories go"
    k.deploy_all("undeploy", "--yes", "--purge")
    assert k.resource_versions() == {}
    poll(lambda: not any(pods_of(k, c) for c in (*DS, *DEPLOYMENTS)), "the pods gone", 120)
