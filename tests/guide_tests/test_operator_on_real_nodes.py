"""The full plan on a real node, from the offline bundle (#23, "Done when"): ``make bundle``'s
package is unpacked, its installer pushes every image (``push --tool=crane``) to a site
registry — the CNCF distribution registry of the harness, on the node network's bridge address,
which the node's containerd is told to use — and the ``lj-runtimekit-operator`` chart of the
bundle is ``helm push``ed there and installed from ``oci://``. Nothing is preloaded on the node:
every image of the suite (the job agent's too) is pulled from that registry.

The operator brings every component Ready from the policy; the policy changes — a component off,
an image tag up (a new tag pushed with crane, as a site mirrors a newer release), a resource
renamed — and the operator converges; a tag the registry lacks is rolled back with ``Degraded``
saying why; deleting the policy disables the node (the lj-runtime handler out of containerd),
then removes the suite and the suite's labels and annotations (#39).

What ``kubectl get runtimekitpolicy -o wide`` showed at each step, with the conditions, is
written to ``<deploy logs>/operator-steps.txt`` (the closing note quotes it)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from lj_runtimekit_testkit.manifests import tool_dir
from lj_runtimekit_testkit.node import RealNode
from lj_runtimekit_testkit.registry import LocalRegistry, RegistryUnavailable, pull_through
from lj_runtimekit_testkit.suite import NS, Operator, wait_for
from tests.bundle_tests.conftest import PROJECT, Bundle, bundle, crane_dir

from .conftest import RealCluster

__all__ = ["bundle", "crane_dir"]  # the bundle's fixtures, for this module

pytestmark = [pytest.mark.realnode, pytest.mark.images, pytest.mark.timeout(900)]

POLICY = "lj-runtimekit"
RELEASE = "ljrk"
RENAMED = "gpu.example.com"
WORKLOADS = {
    "controller": "deployment/lj-runtimekit-controller",
    "scheduler": "deployment/lj-runtimekit-scheduler",
    "device-plugin": "daemonset/lj-runtimekit-device-plugin",
    "exporter": "daemonset/lj-runtimekit-exporter",
}


def helm(home: Path, op: Operator, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "KUBECONFIG": op.kubeconfig,
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
        "HOME": str(home),
    }
    out = subprocess.run(
        [str(tool_dir() / "helm"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, f"helm {' '.join(args)}: {out.stdout}{out.stderr}"
    return out


def policy(op: Operator) -> dict[str, Any]:
    found: dict[str, Any] = op.json("get", "runtimekitpolicy", POLICY)
    return found


def condition(p: dict[str, Any], kind: str) -> dict[str, Any]:
    for c in p.get("status", {}).get("conditions", []):
        if c.get("type") == kind:
            return dict(c)
    return {}


def component(p: dict[str, Any], name: str) -> dict[str, Any]:
    for c in p.get("status", {}).get("components", []):
        if c.get("name") == name:
            return dict(c)
    return {}


def ready(op: Operator) -> dict[str, Any] | None:
    p = policy(op)
    if p.get("status", {}).get("observedGeneration") != p["metadata"]["generation"]:
        return None
    return p if condition(p, "Ready").get("status") == "True" else None


def patch(op: Operator, spec: dict[str, Any]) -> None:
    op.kubectl(
        "patch", "runtimekitpolicy", POLICY, "--type=merge", "-p", json.dumps({"spec": spec})
    )


class Steps:
    """``kubectl get runtimekitpolicy -o wide`` and the conditions, step by step, to a file."""

    def __init__(self, op: Operator) -> None:
        self.op = op
        self.path = op.log_dir / "operator-steps.txt"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("")

    def record(self, step: str) -> None:
        wide = self.op.kubectl("get", "runtimekitpolicy", "-o", "wide").stdout
        conditions = [
            f"  {c['type']}={c['status']} {c.get('reason', '')}: {c.get('message', '')}"
            for c in policy(self.op).get("status", {}).get("conditions", [])
        ]
        with self.path.open("a") as f:
            f.write(f"## {step}\n$ kubectl get runtimekitpolicy -o wide\n{wide}")
            f.write("\n".join(conditions) + "\n\n")


def handler_loaded(node: RealNode) -> bool:
    """containerd has the lj-runtime handler loaded (its effective config, not only the file)."""
    out = node.exec(["sh", "-c", "containerd config dump | grep -A 5 lj-runtime"], check=False)
    # The nodes' pause image also matches the guide's grep: the handler is there when its
    # BinaryName is (as test_guide_on_real_nodes.py checks it).
    return "xpu-container-runtime" in out.stdout


def gone(op: Operator, workload: str) -> bool:
    return op.kubectl("-n", NS, "get", workload, check=False).returncode != 0


def capacity(op: Operator, node: RealNode, resource: str) -> str | None:
    found: str | None = op.node(node.name)["status"].get("capacity", {}).get(resource)
    return found


def degraded_by_rollout(op: Operator) -> dict[str, Any] | None:
    p = policy(op)
    return p if condition(p, "Degraded").get("reason") == "RolloutFailed" else None


def image_of(op: Operator, workload: str) -> str:
    obj = op.json("-n", NS, "get", workload)
    return str(obj["spec"]["template"]["spec"]["containers"][0]["image"])


def install_from_oci(op: Operator, bundle: Bundle, site: LocalRegistry, tmp_path: Path) -> Path:
    """The bundle's operator chart pushed to the site registry and installed from oci://, its
    images from the same registry; helm's home."""
    home = tmp_path / "helm"
    [tgz] = [c for c in bundle.charts() if c.name.startswith("lj-runtimekit-operator-")]
    helm(home, op, "push", str(tgz), f"oci://{site.address}/charts", "--plain-http")
    chart_version = tgz.name.removeprefix("lj-runtimekit-operator-").removesuffix(".tgz")
    helm(
        home, op, "install", RELEASE, f"oci://{site.address}/charts/lj-runtimekit-operator",
        "--version", chart_version, "--plain-http", "-n", NS,
        "--set", f"registry={site.address}/{PROJECT}", "--set", f"version={bundle.version}",
    )  # fmt: skip
    return home


def pulling_node(rc: RealCluster, site: LocalRegistry) -> RealNode:
    """A real node with nothing preloaded whose containerd pulls from ``site`` over plain HTTP."""
    node = rc.nodes.add(inventory="gpu-8x-nvlink", private_dev=True)
    pull_through(node, site.address)
    return node


def upgrade_scheduler(
    op: Operator, site: LocalRegistry, crane: Path, version: str, steps: Steps
) -> str:
    """An image tag up: the site mirrors a newer scheduler tag (crane tag), the policy names it."""
    new_version = f"{version}-up"
    ref = f"{site.address}/{PROJECT}/lj-runtimekit-scheduler:{version}"
    done = subprocess.run(
        [str(crane), "tag", "--insecure", ref, new_version],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    patch(op, {"components": {"scheduler": {"version": new_version}}})
    steps.record(f"scheduler {version} → {new_version} requested (the rollout under way)")

    def upgraded() -> dict[str, Any] | None:
        q = ready(op)
        return q if q and component(q, "scheduler").get("version") == new_version else None

    wait_for("the scheduler upgraded", upgraded, 240, 2)
    assert image_of(op, WORKLOADS["scheduler"]).endswith(f":{new_version}")
    return new_version


def bad_tag_rolls_back(op: Operator, version: str, steps: Steps) -> None:
    patch(op, {"components": {"controller": {"version": "v0.0.0-missing"}}})
    steps.record("controller v0.0.0-missing requested (the rollout under way)")
    p = wait_for("Degraded RolloutFailed", lambda: degraded_by_rollout(op), 420, 2)
    message = condition(p, "Degraded")["message"]
    assert "v0.0.0-missing" in message, message
    assert "rolled back" in message, message
    assert any(w in message for w in ("ErrImagePull", "ImagePullBackOff")), message
    wait_for(
        "the controller back on its ready image",
        lambda: image_of(op, WORKLOADS["controller"]).endswith(f":{version}"),
        120,
        2,
    )


def test_the_bundle_pushed_to_a_site_registry_installs_and_runs_the_full_plan(
    real_cluster: RealCluster, bundle: Bundle, crane_dir: Path, tmp_path: Path
) -> None:
    rc = real_cluster
    op = rc.operator
    bridge = rc.control_plane.bridge
    assert bridge is not None, "the control plane has no node network"
    # A node has its own network namespace: it reaches the host only at the bridge's address.
    site = LocalRegistry(tmp_path / "registry", host=bridge.ip)
    try:
        site.start()
    except RegistryUnavailable as e:
        pytest.fail(str(e), pytrace=False)
    try:
        pushed = bundle.installer(
            "push", f"{site.address}/{PROJECT}", "--tool=crane", "--insecure", path=[crane_dir]
        )
        assert pushed.returncode == 0, pushed.stdout + pushed.stderr
        node = pulling_node(rc, site)
        op.label(node.name, True)
        run_the_plan(
            op, node, bundle=bundle, site=site, crane=crane_dir / "crane", tmp_path=tmp_path
        )
    finally:
        site.stop()


def run_the_plan(
    op: Operator,
    node: RealNode,
    *,
    bundle: Bundle,
    site: LocalRegistry,
    crane: Path,
    tmp_path: Path,
) -> None:
    version = bundle.version
    steps = Steps(op)
    home = install_from_oci(op, bundle, site, tmp_path)

    # 1. Every component Ready from the policy, every image pulled; the node advertises its GPUs.
    p = wait_for("the policy Ready", lambda: ready(op), 420, 2)
    steps.record("installed from oci:// of the site registry — every component ready")
    for name, workload in WORKLOADS.items():
        assert component(p, name).get("ready") is True, component(p, name)
        assert not gone(op, workload), workload
    wait_for("8 GPUs advertised", lambda: capacity(op, node, "aliyun.com/gpu") == "8", 120)
    on_node = node.exec(["ctr", "-n", "k8s.io", "images", "ls", "-q"]).stdout.split()
    for image in ("controller", "scheduler", "device-plugin", "exporter", "controller-job-agent"):
        ref = f"{site.address}/{PROJECT}/lj-runtimekit-{image}:{version}"
        assert ref in on_node, f"{ref} not pulled from the site registry: {on_node}"
    # From here on no step changes what the node needs: containerd is never restarted (the
    # operator's anchor's top complaint is restarts of containerd nobody asked for).
    containerd = node.host_pids().get("containerd")
    assert containerd, node.host_pids()

    # 2. A component off: its objects go, the rest stays Ready.
    patch(op, {"components": {"exporter": {"enabled": False}}})
    wait_for("the exporter removed", lambda: gone(op, WORKLOADS["exporter"]), 120)
    wait_for("Ready without the exporter", lambda: ready(op), 120, 2)
    steps.record("exporter disabled")

    # 3. An image tag up.
    new_version = upgrade_scheduler(op, site, crane, version, steps)
    steps.record(f"scheduler {version} → {new_version}")

    # 4. A resource and the label prefix renamed, through the device plugin's config in the
    # policy: the operator widens the plugin's admission policy to the new prefix (#39), so its
    # label writes under it are admitted and the old labels go.
    config = f"version: v1\nresource_gpu: example.com/gpu\nnode_label_prefix: {RENAMED}\n"
    patch(op, {"components": {"devicePlugin": {"config": config}}})
    wait_for(
        "the new name advertised", lambda: capacity(op, node, "example.com/gpu") == "8", 240, 2
    )
    wait_for(
        "the node labelled under the renamed prefix",
        lambda: op.node(node.name)["metadata"]["labels"].get(f"{RENAMED}/count") == "8",
        120,
        2,
    )
    assert "lj-runtimekit.aliyun.com/count" not in op.node(node.name)["metadata"]["labels"]
    wait_for("Ready after the rename", lambda: ready(op), 120, 2)
    steps.record("device plugin resource renamed to example.com/gpu")

    # 5. A bad image tag: rolled back, Degraded says why; a good one again clears it.
    bad_tag_rolls_back(op, version, steps)
    steps.record("controller v0.0.0-missing: rolled back")
    patch(op, {"components": {"controller": {"version": version}}})
    wait_for("Ready again", lambda: ready(op), 240, 2)
    assert condition(policy(op), "Degraded").get("status") == "False"
    steps.record("controller back on a good version")
    assert node.host_pids().get("containerd") == containerd, "containerd was restarted"

    # 6. Delete the policy: as deploy-all.sh undeploy does (#39), the node is disabled first (the
    # controller's disable Job takes the lj-runtime handler out of its containerd), then the
    # suite goes and with it the suite's labels and annotations; the operator stays. The prefix
    # was renamed, so the admin first names it in the operator's own admission policy, as
    # docs/operator.md says (the operator cannot widen the policy that fences it).
    assert handler_loaded(node), "the controller enabled the node"
    admit_prefix_removal(op, f"{RENAMED}/")
    op.kubectl("delete", "runtimekitpolicy", POLICY, "--wait=true", "--timeout=300s")
    wait_for("every component removed", lambda: all(gone(op, w) for w in WORKLOADS.values()), 120)
    assert not gone(op, "deployment/lj-runtimekit-operator")
    assert not handler_loaded(node), "the lj-runtime handler is still loaded in containerd"
    meta = op.node(node.name)["metadata"]
    ours = ("lj_runtimekit_enable", "lj-runtimekit.aliyun.com/", f"{RENAMED}/")
    assert not [k for k in meta.get("labels", {}) if k.startswith(ours)], meta["labels"]
    assert not [k for k in meta.get("annotations", {}) if k.startswith("lj-runtimekit-")], meta
    assert node.is_active("containerd")
    helm(home, op, "uninstall", RELEASE, "-n", NS)


def admit_prefix_removal(op: Operator, prefix: str) -> None:
    """The admin's step of docs/operator.md for a renamed label prefix: add it to
    ``labelPrefixes`` of the operator's ValidatingAdmissionPolicy."""
    vap = op.json("get", "validatingadmissionpolicy", "lj-runtimekit-operator-writes")
    for variable in vap["spec"]["variables"]:
        if variable["name"] == "labelPrefixes":
            prefixes = json.loads(variable["expression"].replace("'", '"'))
            variable["expression"] = repr([*prefixes, prefix])
    subprocess.run(
        [str(tool_dir() / "kubectl"), "replace", "-f", "-"],
        input=json.dumps(vap),
        env=op.env(),
        text=True,
        capture_output=True,
        check=True,
        timeout=60,
    )
