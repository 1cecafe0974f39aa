"""The demo's cluster: the local control plane, KWOK nodes, and emulated accelerator nodes each
with a runtime simulator, a kubelet emulator, a device plugin and an exporter; plus the
scheduler and the controller. Every component runs as its own process with its real flags."""

from __future__ import annotations

import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client

from lj_runtimekit_testkit.cluster.handle import Cluster
from lj_runtimekit_testkit.cluster.launcher import KWOK_NODE_ANNOTATION, ControlPlane
from lj_runtimekit_testkit.cluster.nodes import NodeShape, create_nodes, wait_nodes_ready
from lj_runtimekit_testkit.demo.processes import Processes, console_script
from lj_runtimekit_testkit.kubelet.emulator import KubeletEmulator
from lj_runtimekit_testkit.manifests import DEPLOY

FEATURE_LABEL = "lj_runtimekit_enable"
#: The emulated accelerator nodes: name → runtime simulator inventory.
ACCELERATOR_NODES = {
    "demo-gpu-nvlink": "gpu-8x-nvlink",
    "demo-ppu": "ppu-8x",
    "demo-mig-tdm": "mig-tdm",
}
#: A containerd config as a GPU node ships it, before the job agent adds lj-runtime.
CONTAINERD_CONFIG = """\
version = 2

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
  BinaryName = "/usr/bin/nvidia-container-runtime"
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class AcceleratorNode:
    """One emulated node: its folders, its simulator and kubelet emulator, its exporter port."""

    name: str
    inventory: str
    root: Path
    kubelet: KubeletEmulator | None = None
    exporter_port: int = 0

    @property
    def socket_dir(self) -> Path:
        return self.root / "run/amp/eKitC/xdm/sockets"

    @property
    def plugin_dir(self) -> Path:
        return self.root / "var/lib/kubelet/device-plugins"

    @property
    def containerd_config(self) -> Path:
        return self.root / "etc/containerd/config.toml"


@dataclass
class Stack:
    work_dir: Path
    kwok_nodes: int
    control_plane: ControlPlane = field(init=False)
    cluster: Cluster = field(init=False)
    processes: Processes = field(init=False)
    nodes: list[AcceleratorNode] = field(default_factory=list)
    scheduler_port: int = 0
    controller_port: int = 0

    def __post_init__(self) -> None:
        self.control_plane = ControlPlane(work_dir=self.work_dir / "cluster")
        self.processes = Processes(self.work_dir / "logs")

    # ------------------------------------------------------------------ cluster
    def start_cluster(self) -> None:
        self.control_plane.start()
        self.cluster = Cluster.from_control_plane(self.control_plane)
        with self.cluster.api_client() as api:
            names = [f"kwok-{i}" for i in range(self.kwok_nodes)]
            create_nodes(api, names, NodeShape(gpus=0))
            for node in ACCELERATOR_NODES:
                self._create_accelerator_node(api, node)
            wait_nodes_ready(api, [*names, *ACCELERATOR_NODES])
        kubectl = str(self._kubectl())
        for path in (DEPLOY / "crds", DEPLOY / "common"):
            subprocess.run(
                [kubectl, f"--kubeconfig={self.cluster.kubeconfig}", "apply", "-f", str(path)],
                check=True,
                capture_output=True,
            )

    def _kubectl(self) -> Path:
        from lj_runtimekit_testkit.manifests import tool_dir

        return tool_dir() / "kubectl"

    def _create_accelerator_node(self, api: client.ApiClient, name: str) -> None:
        """A KWOK-kept node (Ready, runs its pods) whose accelerators come only from the device
        plugin through the kubelet emulator: no GPU capacity until the plugin registers."""
        body: Any = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "annotations": {KWOK_NODE_ANNOTATION: "fake"},
                "labels": {
                    "kubernetes.io/hostname": name,
                    "type": "kwok",
                    "demo/accelerator": name,
                },
            },
            "status": {
                "capacity": {"cpu": "96", "memory": "768Gi", "pods": "110"},
                "allocatable": {"cpu": "96", "memory": "768Gi", "pods": "110"},
            },
        }
        client.CoreV1Api(api).create_node(body)

    # ------------------------------------------------------------------ nodes
    async def start_accelerator_nodes(self) -> None:
        sim = console_script("lj-runtime-sim")
        for name, inventory in ACCELERATOR_NODES.items():
            node = AcceleratorNode(name, inventory, self.work_dir / "nodes" / name)
            node.containerd_config.parent.mkdir(parents=True, exist_ok=True)
            node.containerd_config.write_text(CONTAINERD_CONFIG)
            node.socket_dir.mkdir(parents=True, exist_ok=True)
            self.processes.start(
                f"runtime-sim-{name}",
                [
                    sim,
                    f"--socket-dir={node.socket_dir}",
                    f"--inventory={inventory}",
                    f"--node={name}",
                ],
            )
            node.kubelet = KubeletEmulator(name, node.plugin_dir, self.cluster)
            await node.kubelet.start()
            self.nodes.append(node)
        _wait_for(
            lambda: all((n.socket_dir / "device-daemon.sock").exists() for n in self.nodes),
            "the runtime simulators' sockets",
        )

    def start_node_agents(self) -> None:
        """The device plugin and the exporter of every accelerator node."""
        kubeconfig = self.cluster.kubeconfig
        for node in self.nodes:
            assert node.kubelet is not None
            node.exporter_port = free_port()
            common = [
                f"--node-name={node.name}",
                f"--socket-dir={node.socket_dir}",
                "--pods-source=kubelet",
                f"--kubelet-pods-url={node.kubelet.pods_url}",
                f"--kubeconfig={kubeconfig}",
                "--log-format=console",
            ]
            self.processes.start(
                f"device-plugin-{node.name}",
                [
                    console_script("lj-runtimekit-device-plugin"),
                    *common,
                    f"--plugin-dir={node.plugin_dir}",
                    "--listen-address=127.0.0.1",
                    "--port=0",
                ],
            )
            self.processes.start(
                f"exporter-{node.name}",
                [
                    console_script("lj-runtimekit-exporter"),
                    *common,
                    "--listen-address=127.0.0.1",
                    f"--port={node.exporter_port}",
                    "--poll-interval=1",
                ],
            )

    def start_cluster_services(self) -> None:
        """The scheduler and the controller, with the flags their manifests give them."""
        kubeconfig = self.cluster.kubeconfig
        self.scheduler_port = free_port()
        self.controller_port = free_port()
        self.processes.start(
            "scheduler",
            [
                console_script("lj-runtimekit-scheduler"),
                f"--kubeconfig={kubeconfig}",
                f"--metrics-port={self.scheduler_port}",
            ],
            env={"POD_NAME": "demo-scheduler"},
        )
        self.processes.start(
            "controller",
            [
                console_script("lj-runtimekit-controller"),
                f"--kubeconfig={kubeconfig}",
                "--job-image=lj-runtimekit-registry.cn-hangzhou.cr.aliyuncs.com/lj-runtimekit/"
                "lj-runtimekit-controller-job-agent:v1.13.0",
                "--listen-address=127.0.0.1",
                f"--port={self.controller_port}",
            ],
            env={"POD_NAME": "demo-controller"},
        )

    async def stop(self) -> None:
        for node in self.nodes:
            if node.kubelet is not None:
                await node.kubelet.stop()
        self.processes.stop()
        self.control_plane.stop()


def _wait_for(check: object, what: str, deadline_s: float = 60.0) -> None:
    assert callable(check)
    deadline = time.monotonic() + deadline_s
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not ready within {deadline_s:.0f} s")
        time.sleep(0.1)
