"""MIG instances made on demand by DRA on a real node (#24, "Done when": "a MIG partition created
on demand"): the suite deployed by deploy-all.sh from the built images, with the device plugin's
ConfigMap saying ``dra_partitions: dynamic``, on a real node (kubelet + containerd + runc) whose
Runtime simulator has four MIG/TDM GPUs (a layout left two of them partitioned and one in TDM).

kube-scheduler allocates a claim for a 3g.40gb instance on the whole gpu-3 and one for a 1g.10gb
beside it; the DRA plugin makes each instance in the Runtime when the kubelet prepares the claim,
and the pods run with the Runtime's injection for their instance reaching the container through
CDI. A whole-GPU claim on gpu-1 clears that GPU's idle layout partitions first. Deleting the pods
releases everything, and the instances go with them: every GPU they touched is whole again."""

from __future__ import annotations

import functools
import shutil
from pathlib import Path
from typing import Any

import pytest

from lj_runtimekit_testkit.manifests import DEPLOY
from lj_runtimekit_testkit.node import RealNode
from lj_runtimekit_testkit.suite import (
    Operator,
    allocations,
    simulator_state,
    wait_for,
)

from .conftest import RealCluster
from .test_dra_on_real_nodes import (
    DRIVER,
    GPU_CLASS,
    MODE_LABEL,
    WORK_NS,
    cdi_specs,
    claim_pod,
    delete_and_expect_release,
    devices,
    held,
    plugin_pod,
    pod_env,
    slices,
)
from .test_lifecycle_on_real_nodes import enabled

pytestmark = [pytest.mark.realnode, pytest.mark.images, pytest.mark.timeout(900)]

MIG_CLASS = "mig.lj-runtimekit.aliyun.com"
CONFIG = "deviceplugin/01-configmap.yaml"


def on(gpu: str, profile: str = "") -> list[dict[str, Any]]:
    """CEL selectors: on Runtime device ``gpu``, of MIG ``profile``."""
    attrs = f'device.attributes["{DRIVER}"]'
    out = [{"cel": {"expression": f'{attrs}.runtimeDeviceID == "{gpu}"'}}]
    if profile:
        out.append({"cel": {"expression": f'{attrs}.profile == "{profile}"'}})
    return out


def mig(gpu: str, profile: str) -> dict[str, Any]:
    """A request (``exactly``) for one MIG instance of ``profile`` on ``gpu``."""
    return {"deviceClassName": MIG_CLASS, "selectors": on(gpu, profile)}


@pytest.fixture(scope="module")
def node(real_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory) -> RealNode:
    rc = real_cluster
    node = rc.add_node("mig", "mig-tdm")
    op = rc.operator
    # the operator's deploy directory with the device plugin's ConfigMap saying dynamic
    deploy = tmp_path_factory.mktemp("deploy") / "deploy"
    shutil.copytree(DEPLOY, deploy)
    config = deploy / CONFIG
    text = config.read_text()
    assert "    dra_partitions: static\n" in text
    config.write_text(text.replace("    dra_partitions: static\n", "    dra_partitions: dynamic\n"))
    op.deploy_dir = Path(deploy)
    op.label(node.name, True)
    op.kubectl("label", "node", node.name, f"{MODE_LABEL}=dra", "--overwrite")
    out = op.deploy_all("deploy")
    assert "all selected components are ready" in out.stdout, out.stdout
    op.kubectl("create", "namespace", WORK_NS)
    wait_for(f"{node.name} enabled", functools.partial(enabled, op, node.name), 240)
    wait_for("the DRA plugin running", lambda: plugin_pod(op, node), 180)
    wait_for("4 GPUs x 15 devices in the slices", lambda: len(devices(op, node)) == 60, 120)
    wait_for(
        "the default service account",
        lambda: op.kubectl("-n", WORK_NS, "get", "sa", "default", check=False).returncode == 0,
        30,
        0.2,
    )
    return node


@pytest.fixture
def op(real_cluster: RealCluster) -> Operator:
    return real_cluster.operator


def partitions(node: RealNode) -> dict[str, list[str]]:
    """Runtime device id → its partition ids, as the Runtime has them now."""
    state: dict[str, Any] = simulator_state(node)["devices"]
    return {d: list(v["partitions"]) for d, v in state.items()}


def test_mig_instances_are_made_on_demand_and_go_with_their_pods(
    op: Operator, node: RealNode
) -> None:
    before = partitions(node)
    assert before["gpu-3"] == []
    assert len(before["gpu-1"]) == 7  # the layout's seven idle 1g.10gb
    counter_sets = [c for s in slices(op, node) for c in s["spec"].get("sharedCounters", [])]
    assert len(counter_sets) == 4

    big = claim_pod(
        op, node, "mig-big", {"deviceClassName": MIG_CLASS, "selectors": on("gpu-3", "3g.40gb")}
    )
    (a,) = held(node, "mig-big")
    (made,) = a["devices"]
    assert made.startswith("gpu-3-mig-3g.40gb-"), a
    assert partitions(node)["gpu-3"] == [made]
    env = pod_env(node, big)
    assert env.get("LJ_ALLOCATION_ID") == a["id"], env
    assert env.get("LJ_VISIBLE_DEVICES") == made
    assert made in env.get("NVIDIA_VISIBLE_DEVICES", ""), env

    small = claim_pod(
        op, node, "mig-small", {"deviceClassName": MIG_CLASS, "selectors": on("gpu-3", "1g.10gb")}
    )
    (b,) = held(node, "mig-small")
    (beside,) = b["devices"]
    assert beside.startswith("gpu-3-mig-1g.10gb-")
    assert sorted(partitions(node)["gpu-3"]) == sorted([made, beside])
    assert pod_env(node, small).get("LJ_VISIBLE_DEVICES") == beside
    assert held(node, "mig-big") == [a]  # the first instance and its pod untouched

    # a whole GPU on gpu-1: its idle layout partitions are cleared first
    claim_pod(op, node, "whole", {"deviceClassName": GPU_CLASS, "selectors": on("gpu-1")})
    (w,) = held(node, "whole")
    assert w["devices"] == ["gpu-1"]
    assert partitions(node)["gpu-1"] == []
    assert len(cdi_specs(node)) == 3

    for name in ("mig-big", "mig-small", "whole"):
        delete_and_expect_release(op, node, name)
    wait_for("the instances removed with their claims", lambda: partitions(node)["gpu-3"] == [], 60)
    assert allocations(node) == []
    wait_for("the claims' CDI specs removed", lambda: not cdi_specs(node), 60)
    # nothing the scheduler reads changed while instances came and went
    assert len(devices(op, node)) == 60
