"""What the demo does on the running stack: switch the accelerator nodes on, run the job agent
the controller asks for, submit sample workloads, and gather what happened."""

from __future__ import annotations

import asyncio
import json
import subprocess
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from lj_runtimekit_testkit.demo.processes import console_script
from lj_runtimekit_testkit.demo.stack import FEATURE_LABEL, AcceleratorNode, Stack

NAMESPACE = "demo"
SCHEDULER = "lj-runtimekit-scheduler"
ASSIGNMENT = "lj-runtimekit-scheduler/gpu-assignment"
POD_GROUP = "lj-runtimekit-scheduler/pod-group"
POD_GROUP_SIZE = "lj-runtimekit-scheduler/pod-group-size"


@dataclass(frozen=True)
class Workload:
    """A sample pod: what it asks for and which accelerator node kind must run it."""

    name: str
    limits: dict[str, str]
    expect_node: str
    annotations: dict[str, str] = field(default_factory=dict)


WORKLOADS = (
    Workload("train-4gpu", {"aliyun.com/gpu": "4"}, "demo-gpu-nvlink"),
    Workload("infer-shared-a", {"aliyun.com/gpu-core": "30", "aliyun.com/gpu-memory": "10"}, "gpu"),
    Workload("infer-shared-b", {"aliyun.com/gpu-core": "30", "aliyun.com/gpu-memory": "10"}, "gpu"),
    Workload("ppu-job", {"alibabacloud.com/ppu": "2"}, "demo-ppu"),
    *(
        Workload(
            f"gang-{i}",
            {"aliyun.com/gpu": "1"},
            "gpu",
            {POD_GROUP: "demo-gang", POD_GROUP_SIZE: "3"},
        )
        for i in range(3)
    ),
)


@dataclass
class Outcome:
    workload: Workload
    node: str = ""
    phase: str = "Pending"
    assignment: str = ""
    message: str = ""

    @property
    def placed_as_expected(self) -> bool:
        want = self.workload.expect_node
        if not self.node:
            return False
        return self.node == want if want.startswith("demo-") else self.node.startswith("demo-")


def pod_body(w: Workload) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": w.name, "namespace": NAMESPACE, "annotations": dict(w.annotations)},
        "spec": {
            "schedulerName": SCHEDULER,
            "runtimeClassName": "lj-runtime",
            "restartPolicy": "Never",
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/workload:demo",
                    "resources": {"limits": dict(w.limits), "requests": dict(w.limits)},
                }
            ],
        },
    }


class Scenario:
    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.api = stack.cluster.api_client()
        self.core = client.CoreV1Api(self.api)
        self.batch = client.BatchV1Api(self.api)
        self.agent_runs: dict[str, dict[str, Any]] = {}

    # ------------------------------------------------------------------ feature switch
    def label_nodes(self) -> None:
        for node in self.stack.nodes:
            self.core.patch_node(node.name, {"metadata": {"labels": {FEATURE_LABEL: "true"}}})

    async def run_job_agents(self, stop: asyncio.Event) -> None:
        """Run, on the emulated node, the job agent each of the controller's Jobs asks for."""
        by_name = {n.name: n for n in self.stack.nodes}
        while not stop.is_set():
            jobs: Any = await asyncio.to_thread(self.batch.list_namespaced_job, "kube-system")
            for job in jobs.items:
                name = job.metadata.name
                if not name.startswith("lj-agent-") or name in self.agent_runs:
                    continue
                args = list(job.spec.template.spec.containers[0].args or [])
                node_args = [a for a in args if a.startswith("--node-name=")]
                node = by_name.get(node_args[0].split("=", 1)[1]) if node_args else None
                if node is None:
                    continue
                self.agent_runs[name] = await asyncio.to_thread(self._agent, node, args[0])
            await asyncio.sleep(0.5)

    def _agent(self, node: AcceleratorNode, action: str) -> dict[str, Any]:
        result = node.root / f"agent-{action}.json"
        run = subprocess.run(
            [
                console_script("lj-runtimekit-job-agent"),
                action,
                f"--node-name={node.name}",
                f"--socket-dir={node.socket_dir}",
                f"--host-root={node.root}",
                "--restart-command=",
                "--confirm-command=",
                f"--termination-log={result}",
                "--log-format=json",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        out: dict[str, Any] = {"node": node.name, "action": action, "exit": run.returncode}
        if result.exists():
            out["result"] = json.loads(result.read_text() or "{}")
        out["handler"] = "lj-runtime" in node.containerd_config.read_text()
        return out

    # ------------------------------------------------------------------ workloads
    def submit(self) -> None:
        try:
            namespace: Any = {"metadata": {"name": NAMESPACE}}
            self.core.create_namespace(namespace)
        except ApiException as e:
            if e.status != 409:
                raise
        for w in WORKLOADS:
            body: Any = pod_body(w)
            self.core.create_namespaced_pod(NAMESPACE, body)

    def outcomes(self) -> list[Outcome]:
        listed: Any = self.core.list_namespaced_pod(NAMESPACE)
        pods: dict[str, Any] = {p.metadata.name: p for p in listed.items}
        out = []
        for w in WORKLOADS:
            p = pods.get(w.name)
            o = Outcome(w)
            if p is not None:
                o.node = p.spec.node_name or ""
                o.phase = p.status.phase or "Pending"
                o.assignment = (p.metadata.annotations or {}).get(ASSIGNMENT, "")
                conds = [c for c in (p.status.conditions or []) if c.type == "PodScheduled"]
                if conds and conds[0].status != "True":
                    o.message = conds[0].message or ""
            out.append(o)
        return out

    def resources(self) -> dict[str, dict[str, str]]:
        """The accelerator capacity of each emulated node, as the device plugin registered it."""
        out = {}
        for node in self.stack.nodes:
            read: Any = self.core.read_node(node.name)
            cap: dict[str, str] = read.status.capacity or {}
            out[node.name] = {k: v for k, v in cap.items() if "aliyun.com" in k or "alibaba" in k}
        return out

    def unanswered(self, outcomes: list[Outcome]) -> list[str]:
        """``workload resource`` for every accelerator resource of a placed workload whose
        Allocate the node's kubelet emulator has not had answered (KWOK runs a pod either way)."""
        by_name = {n.name: n for n in self.stack.nodes}
        out = []
        for o in outcomes:
            node = by_name.get(o.node)
            if node is None or node.kubelet is None:
                continue
            answered = {(r.pod, r.resource) for r in node.kubelet.allocations}
            for resource in o.workload.limits:
                if (f"{NAMESPACE}/{o.workload.name}", resource) not in answered:
                    out.append(f"{o.workload.name} {resource}")
        return out

    def allocations(self) -> dict[str, int]:
        """How many allocations each node's runtime simulator holds (its control socket)."""
        out = {}
        for node in self.stack.nodes:
            out[node.name] = len(_control_state(node).get("allocations", []))
        return out

    def metrics_with_pods(self) -> dict[str, int]:
        """Series carrying a pod label on each node's exporter."""
        out = {}
        for node in self.stack.nodes:
            url = f"http://127.0.0.1:{node.exporter_port}/metrics"
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    text = r.read().decode()
            except OSError:
                out[node.name] = -1
                continue
            out[node.name] = sum(
                1 for ln in text.splitlines() if not ln.startswith("#") and 'pod="' in ln
            )
        return out


def _control_state(node: AcceleratorNode) -> dict[str, Any]:
    """GET /state on the simulator's control socket (HTTP over a unix socket)."""
    import http.client
    import socket

    class UnixConnection(http.client.HTTPConnection):
        def connect(self) -> None:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(5)
            s.connect(str(node.socket_dir / "control.sock"))
            self.sock = s

    conn = UnixConnection("localhost")
    try:
        conn.request("GET", "/state")
        state: dict[str, Any] = json.loads(conn.getresponse().read() or b"{}")
        return state
    except OSError:
        return {}
    finally:
        conn.close()
