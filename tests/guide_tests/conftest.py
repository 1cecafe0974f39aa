"""Fixtures of the guide's tests: a control plane with real nodes, the images of ``make images``
on every node, and the operator's tools. A machine that cannot run a real node skips with the
reason; one that could but fails, fails with the error."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from lj_runtimekit_testkit.cluster.launcher import ControlPlane
from lj_runtimekit_testkit.node import RealNode, RealNodes, host_support
from lj_runtimekit_testkit.suite import (
    BuiltImage,
    ImagesMissing,
    Operator,
    built_images,
    load_images,
    registry_of,
)


@dataclass
class RealCluster:
    control_plane: ControlPlane
    nodes: RealNodes
    images: list[BuiltImage]
    operator: Operator
    work: Path
    named: dict[str, RealNode] = field(default_factory=dict)

    def add_node(
        self, role: str, inventory: str | None, *, read_only_port: int = 10255
    ) -> RealNode:
        """A real node with the Runtime simulator on ``inventory`` and every image loaded (its
        kubelet's read-only port closed with ``read_only_port=0``)."""
        node = self.nodes.add(
            inventory=inventory,
            private_dev=inventory is not None,
            read_only_port=read_only_port,
            seed_images=[i.archive for i in self.images],
        )
        load_images(node, self.images)
        self.named[role] = node
        return node


@pytest.fixture(scope="module")
def real_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    reason = host_support()
    if reason:
        pytest.skip(reason)
    try:
        images = built_images()
    except ImagesMissing as e:
        pytest.fail(str(e), pytrace=False)
    work = tmp_path_factory.mktemp("guide")
    control_plane = ControlPlane(work_dir=work / "cluster", node_network=True)
    control_plane.start()
    nodes = RealNodes(control_plane, prefix="guide-node")
    operator = Operator(
        str(control_plane.kubeconfig), work / "deploy-logs", registry=registry_of(images)
    )
    try:
        yield RealCluster(control_plane, nodes, images, operator, work)
    finally:
        nodes.stop()
        control_plane.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if not report.failed:
        return
    rc = getattr(item, "funcargs", {}).get("real_cluster")
    if isinstance(rc, RealCluster):
        report.sections.append(("control plane logs", rc.control_plane.log_tails()))
        for node in rc.nodes.nodes:
            report.sections.append((f"node {node.name}", node.log_tails()))
        pods = rc.operator.kubectl("get", "pods", "-A", "-o", "wide", check=False)
        report.sections.append(("pods", pods.stdout + pods.stderr))
