"""A deleted policy is undone as ``deploy-all.sh undeploy`` does it (#39): the nodes disabled
first, within a deadline, then the suite, then what it left on the nodes, then the finalizer;
every pass from what the cluster and the status say, so that a restart goes on where it stopped.
The decisions are pure (:mod:`.teardown`); :mod:`.deletion` runs here against a small fake of
the apiserver calls it makes."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from lj_runtimekit_operator import teardown
from lj_runtimekit_operator.deletion import Deletion, target
from lj_runtimekit_operator.metrics import Metrics
from lj_runtimekit_operator.policy import FINALIZER, POLICY_LABEL
from lj_runtimekit_operator.settings import Settings

NS = "kube-system"
POLICY = "suite"


def result(action: str, outcome: str, message: str = "") -> str:
    return json.dumps({"action": action, "result": outcome, "message": message})


class FakeKube:
    """The calls :class:`Deletion` makes, over dicts; deletes are immediate."""

    def __init__(self, spec: dict[str, Any] | None = None) -> None:
        self.policy: dict[str, Any] = {
            "metadata": {
                "name": POLICY,
                "uid": "u-1",
                "resourceVersion": "1",
                "deletionTimestamp": "2025-01-01T00:00:00Z",
                "finalizers": [FINALIZER],
            },
            "spec": spec or {},
        }
        self.nodes: dict[str, dict[str, Any]] = {}
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: list[dict[str, Any]] = []
        self.events: list[dict[str, str]] = []
        self.node_patches: list[tuple[str, dict[str, Any]]] = []

    def node(self, name: str, labels: dict[str, str], annotations: dict[str, str]) -> None:
        self.nodes[name] = {
            "metadata": {"name": name, "labels": labels, "annotations": annotations}
        }

    def add(self, kind: str, name: str, **extra: Any) -> None:
        meta = {"name": name, "labels": {POLICY_LABEL: POLICY}, "namespace": NS}
        meta.update(extra.pop("metadata", {}))
        self.objects[kind, name] = {"kind": kind, "metadata": meta, **extra}

    def read(self) -> dict[str, Any]:
        return copy.deepcopy(self.policy)

    async def list_nodes(self) -> list[dict[str, Any]]:
        return copy.deepcopy(list(self.nodes.values()))

    async def patch_node(self, name: str, patch: dict[str, Any]) -> None:
        self.node_patches.append((name, patch))
        meta = self.nodes[name]["metadata"]
        for part in ("labels", "annotations"):
            for k, v in (patch["metadata"].get(part) or {}).items():
                if v is None:
                    meta[part].pop(k, None)
                else:
                    meta[part][k] = v

    async def list_objects(self, kind: str, selector: str, namespace: str = "") -> list[Any]:
        out = []
        for (k, _), obj in self.objects.items():
            labels = obj["metadata"].get("labels") or {}
            wanted = dict(p.split("=", 1) for p in selector.split(",") if p)
            if k == kind and all(labels.get(a) == b for a, b in wanted.items()):
                out.append(copy.deepcopy(obj))
        return out

    async def delete(self, kind: str, namespace: str, name: str) -> None:
        self.objects.pop((kind, name), None)

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.objects.get((kind, name)))

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return self.pods

    async def patch_status(self, name: str, status: dict[str, Any]) -> dict[str, Any]:
        self.policy["status"] = copy.deepcopy(status)
        rv = int(self.policy["metadata"]["resourceVersion"]) + 1
        self.policy["metadata"]["resourceVersion"] = str(rv)
        return self.read()

    async def set_finalizers(self, name: str, finalizers: list[str], rv: str) -> dict[str, Any]:
        assert rv == self.policy["metadata"]["resourceVersion"], "a stale resourceVersion"
        self.policy["metadata"]["finalizers"] = finalizers
        return self.read()

    async def post_event(self, policy: str, uid: str, **event: str) -> None:
        self.events.append({"policy": policy, "uid": uid, **event})


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def deletion(kube: FakeKube, clock: Clock, deadline: float = 600.0) -> Deletion:
    """A fresh one each time: what a new leader after a restart has (nothing in memory)."""
    return Deletion(Settings(teardown_deadline=deadline), kube, Metrics(), clock)  # type: ignore[arg-type]


def condition(kube: FakeKube, kind: str) -> dict[str, Any]:
    conds = kube.policy.get("status", {}).get("conditions", [])
    return next(c for c in conds if c["type"] == kind)


def cluster() -> FakeKube:
    kube = FakeKube()
    enabled = {"lj_runtimekit_enable": "true", "lj-runtimekit.aliyun.com/count": "8", "zone": "a"}
    kube.node(
        "gpu-1",
        enabled,
        {
            teardown.STATUS_ANNOTATION: result("enable", "succeeded"),
            "lj-runtimekit-device-plugin/x": "1",
            "other/keep": "yes",
        },
    )
    kube.node("gpu-2", {"lj_runtimekit_enable": "true"}, {})  # labelled, never enabled
    kube.node("cpu-1", {"zone": "b"}, {"other/keep": "yes"})
    kube.add("Deployment", "lj-runtimekit-controller", status={"availableReplicas": 1})
    kube.add("DaemonSet", "lj-runtimekit-device-plugin")
    kube.add(
        "Job",
        "lj-agent-gpu-9-enable",
        metadata={"labels": {"app.kubernetes.io/managed-by": "lj-runtimekit-controller"}},
        status={"failed": 1},
    )
    kube.add("NodeDevices", "gpu-1", metadata={"labels": {}, "namespace": ""})
    return kube


async def test_the_nodes_are_disabled_before_the_suite_goes_and_cleaned_after_a_restart_too() -> (
    None
):
    kube, clock = cluster(), Clock()
    assert await deletion(kube, clock).step(kube.read()) is True
    # The feature label off every node that has it; nothing removed yet: the controller must run.
    assert [n for n, _ in kube.node_patches] == ["gpu-1", "gpu-2"]
    assert "lj_runtimekit_enable" not in kube.nodes["gpu-1"]["metadata"]["labels"]
    assert ("Deployment", "lj-runtimekit-controller") in kube.objects
    progressing = condition(kube, "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("True", "Deleting")
    assert "gpu-1: last action enable succeeded" in progressing["message"]
    assert "gpu-2" not in progressing["message"], "a node never enabled needs only the label off"
    assert condition(kube, "Ready")["status"] == "False"
    started = kube.policy["status"]["teardown"]["startedAt"]

    # A restart (a new leader, nothing in memory) goes on waiting, on the same deadline.
    clock.now += 30
    assert await deletion(kube, clock).step(kube.read()) is True
    assert kube.policy["status"]["teardown"] == {"startedAt": started}
    assert ("DaemonSet", "lj-runtimekit-device-plugin") in kube.objects

    # The controller's disable Job succeeds: the suite goes, then what it left on the nodes.
    annotations = kube.nodes["gpu-1"]["metadata"]["annotations"]
    annotations[teardown.STATUS_ANNOTATION] = result("disable", "succeeded")
    assert await deletion(kube, clock).step(kube.read()) is True
    assert kube.policy["status"]["teardown"]["nodes"] == teardown.DISABLED
    assert ("DaemonSet", "lj-runtimekit-device-plugin") not in kube.objects
    kube.pods = [{"metadata": {"name": "lj-runtimekit-device-plugin-x"}}]
    assert await deletion(kube, clock).step(kube.read()) is True, "waits for the suite's pods"
    assert kube.nodes["gpu-1"]["metadata"]["labels"].get("lj-runtimekit.aliyun.com/count")
    kube.pods = []
    assert await deletion(kube, clock).step(kube.read()) is False
    assert kube.policy["metadata"]["finalizers"] == []
    assert kube.objects == {}, "the kept agent Job and the NodeDevices go too"
    assert kube.nodes["gpu-1"]["metadata"] == {
        "name": "gpu-1",
        "labels": {"zone": "a"},
        "annotations": {"other/keep": "yes"},
    }
    assert kube.nodes["gpu-2"]["metadata"]["labels"] == {}
    assert kube.nodes["cpu-1"]["metadata"]["labels"] == {"zone": "b"}
    assert kube.events == []


async def test_nodes_still_enabled_at_the_deadline_are_named_once_and_the_suite_goes_anyway() -> (
    None
):
    kube, clock = cluster(), Clock()
    failed = result("disable", "failed", "containerd did not restart")
    kube.nodes["gpu-1"]["metadata"]["annotations"][teardown.STATUS_ANNOTATION] = failed
    assert await deletion(kube, clock, deadline=60).step(kube.read()) is True
    clock.now += 59
    assert await deletion(kube, clock, deadline=60).step(kube.read()) is True
    assert kube.events == []
    assert "in 1 s at the latest" in condition(kube, "Progressing")["message"]
    clock.now += 2
    assert await deletion(kube, clock, deadline=60).step(kube.read()) is True
    [event] = kube.events
    assert (event["kind"], event["reason"], event["uid"]) == ("Warning", "NodesNotDisabled", "u-1")
    assert "gpu-1: last action disable failed: containerd did not restart" in event["message"]
    assert "keeps the lj-runtime handler" in event["message"]
    degraded = condition(kube, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "NodesNotDisabled")
    assert kube.policy["status"]["teardown"]["notDisabled"] == ["gpu-1"]
    # Restarted after giving up: no second Event, the suite goes on being removed.
    assert await deletion(kube, clock, deadline=60).step(kube.read()) is False
    assert len(kube.events) == 1
    assert kube.policy["metadata"]["finalizers"] == []


async def test_a_renamed_feature_label_and_label_prefix_are_the_ones_taken_off() -> None:
    spec = {
        "components": {
            "controller": {"config": "version: v1\nlabel_key: example.com/gpu-suite\n"},
            "devicePlugin": {"config": "version: v1\nnode_label_prefix: gpu.example.com\n"},
        }
    }
    kube, clock = FakeKube(spec), Clock()
    labels = {"example.com/gpu-suite": "true", "gpu.example.com/count": "8", "a": "b"}
    kube.node("gpu-1", labels, {})
    assert await deletion(kube, clock).step(kube.read()) is False
    assert kube.nodes["gpu-1"]["metadata"]["labels"] == {"a": "b"}


@pytest.mark.parametrize(
    ("annotations", "jobs", "expected"),
    [
        ({}, [], {}),
        ({teardown.STATUS_ANNOTATION: result("disable", "succeeded")}, [], {}),
        (
            {teardown.STATUS_ANNOTATION: result("enable", "failed", "no runtime")},
            [],
            {"n": "last action enable failed: no runtime"},
        ),
        (
            {teardown.STATUS_ANNOTATION: "{garbled"},
            [],
            {"n": "its last action status is not one the controller wrote"},
        ),
        ({}, [("lj-agent-n-disable", "n")], {"n": "Job lj-agent-n-disable running"}),
    ],
    ids=["never-enabled", "disabled", "failed", "garbled", "job-running"],
)
def test_a_node_is_disabled_once_the_controller_says_so_and_no_agent_job_runs(
    annotations: dict[str, str], jobs: list[tuple[str, str]], expected: dict[str, str]
) -> None:
    assert teardown.pending([teardown.Node("n", {}, annotations)], jobs) == expected


def test_the_state_survives_its_json_and_garbage_reads_as_not_started() -> None:
    st = teardown.State("2025-01-01T00:00:00Z", teardown.NOT_DISABLED, ("a", "b"))
    assert teardown.state({"teardown": st.to_json()}) == st
    assert teardown.state({"teardown": "x"}) == teardown.State()
    assert teardown.state({"teardown": {"startedAt": 5}}) == teardown.State()


def test_a_spec_it_cannot_read_is_torn_down_with_the_defaults() -> None:
    obj = {"metadata": {"name": "p"}, "spec": {"namespace": "Bad"}, "status": {"namespace": "ns"}}
    t = target(obj)
    assert (t.namespace, t.label, t.prefix) == ("ns", teardown.FEATURE_LABEL, "")
