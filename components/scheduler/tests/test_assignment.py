"""What a bound pod holds: the decision, corrected by the devices the device plugin reports;
and when its allocation counts as pending (docs/contracts.md)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lj_runtimekit_scheduler import assignment, objects
from lj_runtimekit_scheduler.model import Device, DeviceUse, Node
from lj_runtimekit_scheduler.state import ClusterState

DEVICES = tuple(Device(f"gpu-{i}", "GPU", 80, True, 0, 0, i) for i in range(8))

DECISION = {
    "version": "v1",
    "node": "n1",
    "assumedAt": "2026-01-01T00:00:00.000000Z",
    "containers": [
        {
            "name": "train",
            "devices": [{"id": "gpu-0", "whole": True}, {"id": "gpu-1", "whole": True}],
        },
        {"name": "eval", "devices": [{"id": "gpu-2", "core": 30, "memoryGiB": 8}]},
    ],
}
LIMITS = {
    "train": {"aliyun.com/gpu": "2"},
    "eval": {"aliyun.com/gpu-core": "30", "aliyun.com/gpu-memory": "8"},
}


def raw_pod(annotations: dict[str, str], phase: str = "Pending", **meta: str) -> dict[str, object]:
    return {
        "metadata": {
            "uid": "u1",
            "name": "p",
            "namespace": "ns",
            "annotations": annotations,
            **meta,
        },
        "spec": {
            "nodeName": "n1",
            "containers": [{"name": n, "resources": {"limits": lim}} for n, lim in LIMITS.items()],
        },
        "status": {"phase": phase},
    }


def allocation(devices: dict[str, dict[str, list[str]]]) -> str:
    return json.dumps(
        {
            "containers": {
                c: {**{r: ["alloc-1"] for r in d}, "devices": d} for c, d in devices.items()
            }
        }
    )


def held_state(annotations: dict[str, str], phase: str = "Pending", **meta: str) -> ClusterState:
    state = ClusterState()
    state.set_devices("n1", DEVICES, confirms=True)
    state.set_node(Node("n1"))
    state.observe_pod(objects.pod(raw_pod(annotations, phase, **meta)))
    return state


def test_the_devices_the_device_plugin_reports_are_counted_not_the_assigned_ones() -> None:
    notes = {
        "lj-runtimekit-scheduler/gpu-assignment": json.dumps(DECISION),
        "lj-runtimekit-device-plugin/allocated": "2026-01-01T00:00:01Z",
        "lj-runtimekit-device-plugin/allocation": allocation(
            {
                "train": {"aliyun.com/gpu": ["gpu-5", "gpu-4"]},
                "eval": {"aliyun.com/gpu-core": ["gpu-3"], "aliyun.com/gpu-memory": ["gpu-3"]},
            }
        ),
    }
    use = held_state(notes).nodes["n1"].device_use
    assert use == {
        "gpu-5": DeviceUse(whole=True),
        "gpu-4": DeviceUse(whole=True),
        "gpu-3": DeviceUse(False, 30, 8),
    }


def test_devices_inside_a_container_s_entry_are_read_too() -> None:
    doc = {
        "containers": {
            "train": {"aliyun.com/gpu": ["a"], "devices": {"aliyun.com/gpu": ["gpu-6", "gpu-7"]}}
        }
    }
    pod = objects.pod(raw_pod({"lj-runtimekit-device-plugin/allocation": json.dumps(doc)}))
    assert assignment.actual_devices(pod) == {"train": {"aliyun.com/gpu": ("gpu-6", "gpu-7")}}


def test_without_reported_devices_the_decision_is_counted() -> None:
    notes = {
        "lj-runtimekit-scheduler/gpu-assignment": json.dumps(DECISION),
        "lj-runtimekit-device-plugin/allocation": json.dumps(
            {"containers": {"eval": {"aliyun.com/gpu-core": ["alloc-1"]}}}
        ),
    }
    assert set(held_state(notes).nodes["n1"].device_use) == {"gpu-0", "gpu-1", "gpu-2"}


def test_the_reported_devices_replace_the_decision_when_they_arrive() -> None:
    state = held_state({"lj-runtimekit-scheduler/gpu-assignment": json.dumps(DECISION)})
    notes = {
        "lj-runtimekit-scheduler/gpu-assignment": json.dumps(DECISION),
        "lj-runtimekit-device-plugin/allocated": "2026-01-01T00:00:01Z",
        "lj-runtimekit-device-plugin/allocation": allocation(
            {"train": {"aliyun.com/gpu": ["gpu-7", "gpu-1"]}}
        ),
    }
    state.observe_pod(objects.pod(raw_pod(notes)))
    assert set(state.nodes["n1"].device_use) == {"gpu-7", "gpu-1", "gpu-2"}
    state.remove_pod("u1")
    assert state.nodes["n1"].device_use == {}


@pytest.mark.parametrize(
    ("notes", "phase", "meta", "pending"),
    [
        ({}, "Pending", {}, False),
        ({"lj-runtimekit-device-plugin/allocated": "t"}, "Pending", {}, False),
        ({}, "Running", {}, False),
        ({}, "Pending", {"deletionTimestamp": "2026-01-01T00:00:00Z"}, False),
        ({"x": "y"}, "Pending", {}, True),
    ],
    ids=["no-decision", "marked", "running", "deleting", "decided-unmarked"],
)
def test_a_pod_is_pending_while_decided_unmarked_and_not_started(
    notes: dict[str, str], phase: str, meta: dict[str, str], pending: bool
) -> None:
    if notes != {}:
        notes = {**notes, "lj-runtimekit-scheduler/gpu-assignment": json.dumps(DECISION)}
    state = held_state(notes, phase, **meta)
    if "deletionTimestamp" not in meta:
        assert state.is_pending("u1") is pending
    else:
        assert not state.is_pending("u1")
    if pending:
        units = state.nodes["n1"].pending["u1"].units
        assert units == {("gpu", 2), ("gpu-core", 30), ("gpu-memory", 8)}


@given(
    st.text(max_size=200)
    | st.recursive(
        st.none() | st.integers() | st.text(max_size=5),
        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3),
        max_leaves=12,
    ).map(json.dumps)
)
def test_a_hand_edited_allocation_never_raises(raw: str) -> None:
    pod = objects.pod(raw_pod({"lj-runtimekit-device-plugin/allocation": raw}))
    got = assignment.actual_devices(pod)
    assert isinstance(got, dict)
    choice = assignment.decision(
        objects.pod(raw_pod({"lj-runtimekit-scheduler/gpu-assignment": json.dumps(DECISION)}))
    )
    assignment.held(pod, choice)
