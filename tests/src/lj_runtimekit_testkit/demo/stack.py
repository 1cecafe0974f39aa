"""The demo's cluster: the local control plane, KWOK nodes for scale, and three real accelerator
nodes (kubelet + containerd + runc, each with a runtime simulator) on which the suite is
deployed with ``deploy/deploy-all.sh`` from the images ``make images`` built — as an operator
would, nothing run beside the cluster."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from lj_runtimekit_testkit.cluster.handle import Cluster
from lj_runtimekit_testkit.cluster.launcher import ControlPlane
from lj_runtimekit_testkit.cluster.nodes import NodeShape, create_nodes, wait_nodes_ready
from lj_runtimekit_testkit.node import RealNode, RealNodes
from lj_runtimekit_testkit.suite import BuiltImage, Operator, built_images, load_images, registry_of

#: The real accelerator nodes: name → runtime simulator inventory (tests/inventories).
ACCELERATOR_NODES = {
    "demo-gpu-nvlink": "gpu-8x-nvlink",
    "demo-ppu": "ppu-8x",
    "demo-mig-tdm": "mig-tdm",
}


@dataclass
class Stack:
    work_dir: Path
    kwok_nodes: int
    control_plane: ControlPlane = field(init=False)
    cluster: Cluster = field(init=False)
    real: RealNodes = field(init=False)
    images: list[BuiltImage] = field(init=False)
    operator: Operator = field(init=False)

    @property
    def nodes(self) -> list[RealNode]:
        return list(self.real.nodes)

    def start_cluster(self) -> None:
        """The control plane with a bridge for real nodes, and the KWOK nodes. KWOK nodes carry
        GPUs (so the scheduler works at scale) and KWOK's taint, so that the suite's own pods and
        the demo's workloads, which do not tolerate it, run only on the real nodes."""
        self.images = built_images()
        self.control_plane = ControlPlane(work_dir=self.work_dir / "cluster", node_network=True)
        self.control_plane.start()
        self.cluster = Cluster.from_control_plane(self.control_plane)
        self.real = RealNodes(self.control_plane, prefix="demo")
        self.operator = Operator(
            str(self.control_plane.kubeconfig),
            self.work_dir / "logs" / "deploy",
            registry=registry_of(self.images),
        )
        names = [f"kwok-{i}" for i in range(self.kwok_nodes)]
        with self.cluster.api_client() as api:
            create_nodes(api, names, NodeShape(taint=True))
            wait_nodes_ready(api, names)

    def start_accelerator_node(self, name: str) -> RealNode:
        node = self.real.add(
            name,
            inventory=ACCELERATOR_NODES[name],
            private_dev=True,
            seed_images=[i.archive for i in self.images],
        )
        load_images(node, self.images)
        return node

    def stop(self) -> None:
        if hasattr(self, "real"):
            self.real.stop()
        if hasattr(self, "control_plane"):
            self.control_plane.stop()
