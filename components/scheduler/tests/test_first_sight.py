"""A bound pod seen for the first time — after a restart, by a newly elected leader, or bound by
another scheduler — holds what its scheduler decided only as the Binding left it; an assignment
someone set since (``metadata.managedFields`` names a writer, or its sizes are not what the pod
requests) is reported and not counted: the pod's requests are, on the devices the device plugin
reports it allocated (issue 34: an edit made while no scheduler ran freed the share)."""

from __future__ import annotations

import json
from typing import Any, cast

from hypothesis import given, settings
from hypothesis import strategies as st

from lj_runtimekit_scheduler import assignment, objects
from lj_runtimekit_scheduler.feed import Informers
from lj_runtimekit_scheduler.model import (
    ALLOCATED_ANNOTATION,
    ALLOCATION_ANNOTATION,
    ASSIGNMENT_ANNOTATION,
    Device,
    Node,
    Pod,
)
from lj_runtimekit_scheduler.queue import SchedulingQueue
from lj_runtimekit_scheduler.settings import Settings as SchedulerSettings
from lj_runtimekit_scheduler.state import ClusterState

SHARE = {"aliyun.com/gpu-core": "60", "aliyun.com/gpu-memory": "8"}
CREATED = {  # the creator's entry, as the apiserver records a kubectl create
    "manager": "kubectl-create",
    "operation": "Update",
    "apiVersion": "v1",
    "fieldsType": "FieldsV1",
    "fieldsV1": {"f:spec": {"f:containers": {}}, "f:metadata": {"f:labels": {}}},
}


def decision(device: str, core: int = 60, memory: int = 8) -> str:
    doc = {
        "version": "v1",
        "node": "n1",
        "assumedAt": "2026-01-01T00:00:00.000000Z",
        "containers": [
            {"name": "main", "devices": [{"id": device, "core": core, "memoryGiB": memory}]}
        ],
    }
    return json.dumps(doc, separators=(",", ":"))


def wrote(manager: str, *keys: str, subresource: str = "") -> dict[str, Any]:
    """A managedFields entry: ``manager`` set these annotations."""
    entry: dict[str, Any] = {
        "manager": manager,
        "operation": "Update",
        "apiVersion": "v1",
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:metadata": {"f:annotations": {f"f:{k}": {} for k in keys}}},
    }
    if subresource:
        entry["subresource"] = subresource
    return entry


def bound(
    name: str,
    annotations: dict[str, str],
    managed: list[dict[str, Any]] | None = None,
    *,
    limits: dict[str, str] = SHARE,
    scheduler: str = "lj-runtimekit-scheduler",
) -> dict[str, Any]:
    return {
        "metadata": {
            "uid": name,
            "name": name,
            "namespace": "ns",
            "annotations": annotations,
            "managedFields": [CREATED, *(managed or [])],
        },
        "spec": {
            "schedulerName": scheduler,
            "nodeName": "n1",
            "containers": [{"name": "main", "resources": {"requests": limits, "limits": limits}}],
        },
        "status": {"phase": "Running"},
    }


def report(device: str, resources: tuple[str, ...] = tuple(SHARE)) -> dict[str, str]:
    """The device plugin's mark and report: ``main`` got ``device``."""
    got = {r: [device] for r in resources}
    doc = {"containers": {"main": {r: ["alloc-1"] for r in resources}}, "devices": {"main": got}}
    return {ALLOCATED_ANNOTATION: "2026-01-01T00:00:05Z", ALLOCATION_ANNOTATION: json.dumps(doc)}


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    def event(self, pod: Pod, kind: str, reason: str, message: str) -> None:
        self.events.append((pod.name, reason, message))

    def edited(self) -> list[tuple[str, str]]:
        return [(p, m) for p, r, m in self.events if r == "GpuAssignmentEdited"]


def new_leader() -> tuple[ClusterState, Informers, Recorder]:
    """A scheduler that has just started: it wrote none of the decisions it is about to see."""
    state = ClusterState()
    state.set_node(Node("n1"))
    state.set_devices("n1", tuple(Device(f"gpu-{i}", "GPU", 80, True, 0, 0, i) for i in range(8)))
    rec = Recorder()
    feed = Informers(
        cast(Any, None),
        SchedulerSettings(leader_elect=False),
        state,
        SchedulingQueue(),
        lambda: None,
        recorder=rec,
    )
    return state, feed, rec


def use(state: ClusterState) -> dict[str, tuple[bool, int, int]]:
    return {k: (u.whole, u.core, u.memory_gib) for k, u in state.nodes["n1"].device_use.items()}


def test_managed_fields_name_who_set_the_suite_s_annotations() -> None:
    meta = bound(
        "p",
        {},
        [
            wrote("kubectl-annotate", ASSIGNMENT_ANNOTATION, "team"),
            wrote("lj-runtimekit-device-plugin", ALLOCATED_ANNOTATION, ALLOCATION_ANNOTATION),
            wrote("kube-scheduler", ASSIGNMENT_ANNOTATION, subresource="binding"),
            {"manager": "odd", "fieldsV1": {"f:metadata": "not a map"}},
            cast(Any, "not an entry"),
        ],
    )["metadata"]
    assert objects.annotation_writers(meta) == (
        (ALLOCATED_ANNOTATION, "lj-runtimekit-device-plugin"),
        (ALLOCATION_ANNOTATION, "lj-runtimekit-device-plugin"),
        (ASSIGNMENT_ANNOTATION, "kubectl-annotate"),
    )
    pod = objects.pod(bound("p", {}, [wrote("kubectl-edit", ASSIGNMENT_ANNOTATION)]))
    assert pod.writers(ASSIGNMENT_ANNOTATION) == {"kubectl-edit"}
    assert not assignment.left_by_binding(pod)


def test_a_new_leader_believes_the_decision_the_binding_left() -> None:
    state, feed, rec = new_leader()
    feed._handle("pods", "ADDED", bound("p1", {ASSIGNMENT_ANNOTATION: decision("gpu-3")}))
    assert use(state) == {"gpu-3": (False, 60, 8)}
    assert rec.events == []


def test_a_share_shrunk_while_no_scheduler_ran_is_counted_at_its_request() -> None:
    # the edit made room on gpu-3 for a new leader: core 60 read as 0
    state, feed, rec = new_leader()
    edit = [wrote("kubectl-annotate", ASSIGNMENT_ANNOTATION)]
    feed._handle("pods", "ADDED", bound("p1", {ASSIGNMENT_ANNOTATION: decision("gpu-3", 0)}, edit))
    assert use(state) == {"gpu-3": (False, 60, 8)}
    ((pod, message),) = rec.edited()
    assert pod == "p1"
    assert "changed by kubectl-annotate" in message
    assert "gpu-3 (core 60, 8 GiB)" in message
    # the same edit seen again (a resync, a relist) is not told twice, and counts the same
    feed._handle(
        "pods", "MODIFIED", bound("p1", {ASSIGNMENT_ANNOTATION: decision("gpu-3", 0)}, edit)
    )
    assert len(rec.edited()) == 1
    assert use(state) == {"gpu-3": (False, 60, 8)}


def test_a_share_moved_while_no_scheduler_ran_stays_where_the_device_plugin_put_it() -> None:
    state, feed, rec = new_leader()
    annotations = {ASSIGNMENT_ANNOTATION: decision("gpu-7"), **report("gpu-0")}
    managed = [
        wrote("lj-runtimekit-device-plugin", ALLOCATED_ANNOTATION, ALLOCATION_ANNOTATION),
        wrote("kubectl-edit", ASSIGNMENT_ANNOTATION),
    ]
    feed._handle("pods", "ADDED", bound("p1", annotations, managed))
    assert use(state) == {"gpu-0": (False, 60, 8)}
    ((_, message),) = rec.edited()
    assert "now: main: gpu-7 (core 60, 8 GiB)" in message
    assert "device plugin reports it allocated (main: gpu-0 (core 60, 8 GiB))" in message


def test_sizes_that_are_not_the_pod_s_requests_are_no_decision_whatever_managed_fields_say() -> (
    None
):
    # a client that also reset managedFields hides who wrote it, not what it says
    state, feed, rec = new_leader()
    feed._handle("pods", "ADDED", bound("p1", {ASSIGNMENT_ANNOTATION: decision("gpu-3", 5, 1)}))
    assert use(state) == {"gpu-3": (False, 60, 8)}
    assert len(rec.edited()) == 1


def test_a_report_edited_apart_from_the_device_plugin_s_mark_is_not_believed() -> None:
    state, feed, _ = new_leader()
    annotations = {ASSIGNMENT_ANNOTATION: decision("gpu-3"), **report("gpu-5")}
    managed = [
        wrote("lj-runtimekit-device-plugin", ALLOCATED_ANNOTATION),
        wrote("kubectl-annotate", ALLOCATION_ANNOTATION),
    ]
    feed._handle("pods", "ADDED", bound("p1", annotations, managed))
    assert use(state) == {"gpu-3": (False, 60, 8)}


def test_another_scheduler_s_pod_is_counted_by_its_requests_and_not_told() -> None:
    state, feed, rec = new_leader()
    edit = [wrote("kubectl-create", ASSIGNMENT_ANNOTATION)]
    forged = bound(
        "other", {ASSIGNMENT_ANNOTATION: decision("gpu-2", 1)}, edit, scheduler="default-scheduler"
    )
    feed._handle("pods", "ADDED", forged)
    assert use(state) == {"gpu-2": (False, 60, 8)}
    assert rec.events == []


def test_whole_gpus_the_device_plugin_reports_for_a_pod_without_a_decision_are_held() -> None:
    # a pod of the default scheduler: no decision, but the device plugin says what it got
    state, feed, rec = new_leader()
    whole = {"aliyun.com/gpu": "2"}
    annotations = report("gpu-4", ("aliyun.com/gpu",))
    doc = json.loads(annotations[ALLOCATION_ANNOTATION])
    doc["devices"]["main"]["aliyun.com/gpu"] = ["gpu-4", "gpu-5"]
    annotations[ALLOCATION_ANNOTATION] = json.dumps(doc)
    managed = [wrote("lj-runtimekit-device-plugin", ALLOCATED_ANNOTATION, ALLOCATION_ANNOTATION)]
    pod = bound("dflt", annotations, managed, limits=whole, scheduler="default-scheduler")
    feed._handle("pods", "ADDED", pod)
    assert use(state) == {"gpu-4": (True, 0, 0), "gpu-5": (True, 0, 0)}
    assert rec.events == []


@settings(max_examples=200, deadline=None)
@given(
    core=st.integers(-5, 200),
    memory=st.integers(-5, 2**21),
    device=st.sampled_from(["gpu-0", "gpu-7", "gpu-9", "../gpu-0", ""]),
    writer=st.sampled_from([None, "kubectl-annotate", "OpenAPI-Generator"]),
)
def test_a_new_leader_never_counts_a_share_below_what_the_pod_requests(
    core: int, memory: int, device: str, writer: str | None
) -> None:
    state, feed, _ = new_leader()
    managed = [wrote(writer, ASSIGNMENT_ANNOTATION)] if writer else []
    raw = {ASSIGNMENT_ANNOTATION: decision(device, core, memory)}
    feed._handle("pods", "ADDED", bound("p1", raw, managed))
    held = list(use(state).values())
    assert held in ([], [(False, 60, 8)]), "the request, on one device, or nothing known"
