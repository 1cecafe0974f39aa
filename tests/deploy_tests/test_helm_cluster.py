"""The chart on the local control plane (KWOK nodes): every rendered object passes the
apiserver's own validation (a server-side dry run with strict field validation: the cluster's
OpenAPI, as kubeconform would check it), and a release in its own namespace installs, upgrades,
rolls back and uninstalls as an operator's would."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from lj_runtimekit_testkit.cluster.handle import Cluster
from lj_runtimekit_testkit.manifests import CHART, tool_dir

pytestmark = pytest.mark.cluster

NS = "gpu-system"
RELEASE = "ljrk"
LABEL = "example.com/helm-gpu"


class Tools:
    def __init__(self, cluster: Cluster) -> None:
        self.env = {**os.environ, "KUBECONFIG": cluster.kubeconfig}

    def run(
        self, tool: str, *args: str, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(tool_dir() / tool), *args],
            env=self.env,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        done = self.run("kubectl", *args, stdin=stdin)
        assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
        return done.stdout

    def json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json"))

    def helm(self, *args: str) -> str:
        done = self.run("helm", *args)
        assert done.returncode == 0, f"helm {' '.join(args)}: {done.stdout}{done.stderr}"
        return done.stdout


def poll(check: Callable[[], bool], what: str, deadline_s: float = 120.0) -> None:
    deadline = time.monotonic() + deadline_s
    while not check():
        assert time.monotonic() < deadline, f"{what} not within {deadline_s:.0f} s"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def tools(cluster: Cluster) -> Iterator[Tools]:
    t = Tools(cluster)
    t.kubectl("create", "namespace", NS)
    yield t
    t.run("helm", "uninstall", RELEASE, "-n", NS, "--wait")
    t.run("kubectl", "delete", "namespace", NS, "--wait=false")
    # What Helm leaves on purpose (crds/), so that later modules start from a clean cluster.
    for crd in sorted((CHART / "crds").glob("*.yaml")):
        t.run("kubectl", "delete", "crd", crd.stem, "--ignore-not-found")


@pytest.fixture(scope="module")
def gpu_nodes(cluster: Cluster) -> set[str]:
    return set(cluster.create_gpu_nodes(2, prefix="helm-gpu", labels={LABEL: "true"}))


@pytest.mark.parametrize(
    "sets",
    [
        [],
        [
            "imagePullSecrets[0].name=my-registry",
            "scheduler.priorityClassName=",
            "exporter.nodeSelector.zone=a",
            "devicePlugin.tolerations[0].key=gpu",
            "devicePlugin.tolerations[0].operator=Exists",
            f"nodeLabel.key={LABEL}",
            "resourceNames.gpu=example.com/gpu",
        ],
    ],
    ids=["defaults", "every-knob"],
)
def test_every_rendered_object_passes_the_apiservers_strict_validation(
    tools: Tools, sets: list[str]
) -> None:
    args = ["template", RELEASE, str(CHART), "-n", NS, "--include-crds"]
    for s in sets:
        args += ["--set", s]
    rendered = tools.helm(*args)
    objs = [o for o in yaml.safe_load_all(rendered) if o]
    done = tools.run(
        "kubectl", "apply", "--dry-run=server", "--validate=strict", "-f", "-", stdin=rendered
    )
    assert done.returncode == 0, done.stderr
    said = [ln for ln in done.stdout.splitlines() if ln.endswith("(server dry run)")]
    assert len(said) == len(objs), done.stdout


def test_install_upgrade_rollback_uninstall_in_its_own_namespace(
    tools: Tools, gpu_nodes: set[str]
) -> None:
    tools.helm(
        "install", RELEASE, str(CHART), "-n", NS, "--set", f"nodeLabel.key={LABEL}",
        "--wait", "--timeout", "3m",
    )  # fmt: skip
    manifest = [
        o for o in yaml.safe_load_all(tools.helm("get", "manifest", RELEASE, "-n", NS)) if o
    ]
    for o in manifest:
        if "namespace" in o["metadata"]:
            assert o["metadata"]["namespace"] == NS, o["metadata"]["name"]
            tools.kubectl("-n", NS, "get", o["kind"].lower(), o["metadata"]["name"])
    pods = tools.json("-n", NS, "get", "pods", "-l", f"app.kubernetes.io/instance={RELEASE}")
    on = {
        p["spec"]["nodeName"]
        for p in pods["items"]
        if p["metadata"]["labels"]["app"].endswith(("device-plugin", "exporter"))
    }
    assert on == gpu_nodes, "the node agents run on the nodes of nodeLabel, and only there"
    binding = tools.json("get", "clusterrolebinding", "lj-runtimekit-controller")
    assert binding["subjects"][0]["namespace"] == NS
    # The CRD upgrade path of docs/deploy.md, over the CRD Helm's install created.
    crd = CHART / "crds" / "nodedevices.lj-runtimekit.aliyun.com.yaml"
    newer = yaml.safe_load(crd.read_text())
    newer["spec"]["versions"][0]["additionalPrinterColumns"].append(
        {"name": "Upgraded", "type": "string", "jsonPath": ".metadata.name"}
    )
    tools.kubectl(
        "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=yaml.safe_dump(newer)
    )
    live = tools.json("get", "crd", "nodedevices.lj-runtimekit.aliyun.com")
    columns = live["spec"]["versions"][0]["additionalPrinterColumns"]
    assert columns[-1]["name"] == "Upgraded"

    tools.helm(
        "upgrade", RELEASE, str(CHART), "-n", NS, "--reuse-values", "--set", "exporter.tag=v1.14.9",
        "--wait", "--timeout", "3m",
    )  # fmt: skip

    def exporter_image() -> str:
        ds = tools.json("-n", NS, "get", "daemonset", "lj-runtimekit-exporter")
        return str(ds["spec"]["template"]["spec"]["containers"][0]["image"])

    assert exporter_image().endswith("/lj-runtimekit-exporter:v1.14.9")
    tools.helm("rollback", RELEASE, "1", "-n", NS, "--wait", "--timeout", "3m")
    assert exporter_image().endswith("/lj-runtimekit-exporter:v1.14.0")
    history = json.loads(tools.helm("history", RELEASE, "-n", NS, "-o", "json"))
    assert [h["status"] for h in history] == ["superseded", "superseded", "deployed"]

    tools.helm("uninstall", RELEASE, "-n", NS, "--wait")
    poll(
        lambda: (
            tools.kubectl("-n", NS, "get", "all,configmaps,serviceaccounts,roles", "-o", "name")
            .replace("configmap/kube-root-ca.crt\n", "")
            .replace("serviceaccount/default\n", "")
            == ""
        ),
        "every namespaced object of the release gone",
    )
    for kind, name in [("clusterrole", "lj-runtimekit-controller"), ("runtimeclass", "lj-runtime")]:
        assert tools.run("kubectl", "get", kind, name).returncode != 0, f"{kind} {name} left"
    # Helm never deletes (nor upgrades) what crds/ installed: docs/deploy.md says how.
    tools.kubectl("get", "crd", "nodedevices.lj-runtimekit.aliyun.com")
