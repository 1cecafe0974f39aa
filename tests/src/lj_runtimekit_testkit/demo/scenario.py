"""What the demo does on the running cluster — switch the accelerator nodes on, deploy the suite,
submit sample workloads, delete and resubmit them — and what it reads back to show an operator:
pods, node resources, the agents' results, the injections that reached each node's runtime, the
Runtime's allocations and the exporters' pod-labelled series."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from lj_runtimekit_testkit.demo.stack import Stack
from lj_runtimekit_testkit.node import RealNode
from lj_runtimekit_testkit.suite import (
    LAST_ACTION,
    accelerator_capacity,
    all_running,
    allocations,
    injected,
    metrics,
    pod_series,
    wait_for,
    workload,
)

NAMESPACE = "demo"
ASSIGNMENT = "lj-runtimekit-scheduler/gpu-assignment"
POD_GROUP = "lj-runtimekit-scheduler/pod-group"
POD_GROUP_SIZE = "lj-runtimekit-scheduler/pod-group-size"
INJECTION_PREFIX = "xdm.amp.com"


@dataclass(frozen=True)
class Workload:
    """A sample pod: what it asks for and which accelerator node must run it (``gpu``: any node
    with GPUs)."""

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
GPU_NODES = ("demo-gpu-nvlink", "demo-mig-tdm")


@dataclass
class Outcome:
    workload: Workload
    node: str = ""
    phase: str = "Pending"
    uid: str = ""
    assignment: str = ""
    message: str = ""
    injected: bool = False
    allocated: bool = False
    decided: bool = False
    """The Runtime allocated exactly the devices of the scheduler's decision."""
    series: int = 0

    @property
    def placed_as_expected(self) -> bool:
        want = self.workload.expect_node
        return self.node in GPU_NODES if want == "gpu" else self.node == want

    @property
    def ok(self) -> bool:
        return (
            self.placed_as_expected
            and self.phase == "Running"
            and self.injected
            and self.allocated
            and self.decided
            and self.series > 0
        )


class Scenario:
    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.op = stack.operator

    def by_name(self) -> dict[str, RealNode]:
        return {n.name: n for n in self.stack.nodes}

    # ------------------------------------------------------------------ the operator's steps
    def label_nodes(self) -> None:
        for node in self.stack.nodes:
            self.op.label(node.name, True)

    def deploy(self) -> str:
        return self.op.deploy_all("deploy").stdout

    def submit(self) -> None:
        if self.op.kubectl("get", "namespace", NAMESPACE, check=False).returncode != 0:
            self.op.kubectl("create", "namespace", NAMESPACE)
        docs = [workload(w.name, NAMESPACE, w.limits, annotations=w.annotations) for w in WORKLOADS]
        path = self.op.log_dir / "workloads.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))
        # Pods are refused until the namespace's default service account exists.
        wait_for(
            "the demo namespace's default service account",
            lambda: (
                self.op.kubectl("-n", NAMESPACE, "get", "sa", "default", check=False).returncode
                == 0
            ),
            30,
            0.2,
        )
        self.op.kubectl("create", "-f", str(path))

    def delete_workloads(self) -> None:
        self.op.kubectl("-n", NAMESPACE, "delete", "pods", "--all", "--wait=true", "--timeout=120s")

    # ------------------------------------------------------------------ what an operator sees
    def suite_ready(self) -> bool:
        return all_running(self.op.suite_pods())

    def agents(self) -> dict[str, dict[str, Any]]:
        """The controller's recorded result per accelerator node."""
        out = {}
        for node in self.stack.nodes:
            meta = self.op.node(node.name)["metadata"]
            text = meta.get("annotations", {}).get(LAST_ACTION, "")
            out[node.name] = json.loads(text) if text else {}
        return out

    def agents_done(self) -> bool:
        return all(
            a.get("action") == "enable" and a.get("result") == "succeeded"
            for a in self.agents().values()
        )

    def handler_loaded(self, node: RealNode) -> bool:
        out = node.exec(["sh", "-c", "containerd config dump | grep -A 5 lj-runtime"], check=False)
        return out.returncode == 0 and "xpu-container-runtime" in out.stdout

    def resources(self) -> dict[str, dict[str, str]]:
        return {n.name: accelerator_capacity(self.op.node(n.name)) for n in self.stack.nodes}

    def registered(self) -> bool:
        return all(any(int(v) > 0 for v in r.values()) for r in self.resources().values())

    def outcomes(self) -> list[Outcome]:
        pods = {
            p["metadata"]["name"]: p for p in self.op.json("-n", NAMESPACE, "get", "pods")["items"]
        }
        nodes = self.by_name()
        held = {name: allocations(node) for name, node in nodes.items()}
        texts = {name: _metrics_or_empty(node) for name, node in nodes.items()}
        out = []
        for w in WORKLOADS:
            o = Outcome(w)
            pod = pods.get(w.name)
            if pod is not None:
                o.node = pod["spec"].get("nodeName", "")
                o.phase = pod["status"].get("phase", "Pending")
                o.uid = pod["metadata"]["uid"]
                o.assignment = pod["metadata"].get("annotations", {}).get(ASSIGNMENT, "")
                conds = [
                    c for c in pod["status"].get("conditions", []) if c["type"] == "PodScheduled"
                ]
                if conds and conds[0]["status"] != "True":
                    o.message = conds[0].get("message", "")
                node = nodes.get(o.node)
                if node is not None:
                    records = injected(node, o.uid)
                    o.injected = any(
                        k.startswith(INJECTION_PREFIX) for r in records for k in r["annotations"]
                    )
                    mine = [a for a in held[o.node] if a["pod"] == f"{NAMESPACE}/{w.name}"]
                    o.allocated = bool(mine)
                    o.decided = o.allocated and decided_devices(o.assignment) == {
                        d for a in mine for d in a["devices"]
                    }
                    o.series = pod_series(texts[o.node], w.name)
            out.append(o)
        return out

    def allocation_counts(self) -> dict[str, int]:
        return {n.name: len(allocations(n)) for n in self.stack.nodes}

    def leftover_allocations(self) -> dict[str, list[str]]:
        """Allocations whose pod is not one of the current workload pods."""
        live = {
            f"{NAMESPACE}/{p['metadata']['name']}"
            for p in self.op.json("-n", NAMESPACE, "get", "pods")["items"]
        }
        return {
            n.name: [a["pod"] for a in allocations(n) if a["pod"] not in live]
            for n in self.stack.nodes
        }


def decided_devices(assignment: str) -> set[str]:
    """The device ids of the scheduler's decision (annotation JSON); empty when unreadable."""
    try:
        decision = json.loads(assignment)
        return {d["id"] for c in decision["containers"] for d in c["devices"]}
    except (ValueError, KeyError, TypeError):
        return set()


def _metrics_or_empty(node: RealNode) -> str:
    try:
        return metrics(node)
    except OSError:
        return ""
