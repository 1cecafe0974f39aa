"""What users and other writers put in front of the scheduler (issue 19), attacked: annotations
and labels on their own pods, resource quantities, NodeDevices contents, apiserver answers. No
crash, no hang, bounded work, and never a device over-committed."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lj_runtimekit_scheduler import gang, gpu, objects, quantity
from lj_runtimekit_scheduler.errors import ConfigError
from lj_runtimekit_scheduler.feed import Informers
from lj_runtimekit_scheduler.model import (
    ASSIGNMENT_ANNOTATION,
    CORE_PER_GPU,
    POD_GROUP_ANNOTATION,
    POD_GROUP_SIZE_ANNOTATION,
    Device,
    DeviceRequest,
    Node,
    Pod,
)
from lj_runtimekit_scheduler.queue import SchedulingQueue
from lj_runtimekit_scheduler.settings import Settings
from lj_runtimekit_scheduler.settings import load as load_settings
from lj_runtimekit_scheduler.state import ClusterState

FAST = settings(max_examples=80, deadline=1000, suppress_health_check=[HealthCheck.too_slow])
DECISION = ASSIGNMENT_ANNOTATION

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=20,
)
quantity_text = st.one_of(
    st.text(max_size=20),
    st.from_regex(
        r"-?[0-9]{0,5}(\.[0-9]{0,3})?([eE][+-]?[0-9]{1,12})?(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?",
        fullmatch=True,
    ),
)


@FAST
@given(quantity_text)
def test_any_quantity_string_parses_to_a_bounded_int_or_is_refused(text: str) -> None:
    try:
        value = quantity.parse(text)
    except ValueError as e:
        error = str(e)
    else:
        assert abs(value) <= 2**63, "beyond what the apiserver can hold: refused, not computed"
        return
    assert repr(text) in error, "the error names the input"


def informers() -> Informers:
    return Informers(
        cast(Any, None), Settings(), ClusterState(), SchedulingQueue(1, 10, 60), lambda: None
    )


def good_pod() -> dict[str, Any]:
    return {
        "metadata": {"uid": "u1", "name": "p", "namespace": "ns", "annotations": {}, "labels": {}},
        "spec": {
            "schedulerName": "lj-runtimekit-scheduler",
            "containers": [{"name": "c", "resources": {"limits": {"aliyun.com/gpu": "1"}}}],
        },
        "status": {"phase": "Pending"},
    }


@FAST
@given(
    where=st.sampled_from(
        ["metadata", "spec", "status", "annotations", "labels", "resources", "root"]
    ),
    key=st.text(max_size=30),
    value=json_values,
)
def test_any_pod_shape_is_taken_or_skipped_never_crashes_the_informer(
    where: str, key: str, value: Any
) -> None:
    raw = good_pod()
    target: Any = {
        "metadata": raw["metadata"],
        "spec": raw["spec"],
        "status": raw["status"],
        "annotations": raw["metadata"]["annotations"],
        "labels": raw["metadata"]["labels"],
        "resources": raw["spec"]["containers"][0]["resources"]["limits"],
        "root": raw,
    }[where]
    target[key] = value
    inf = informers()
    inf._handle("pods", "ADDED", raw)
    inf._handle("pods", "MODIFIED", raw)
    inf._handle("pods", "DELETED", raw)


@FAST
@given(
    where=st.sampled_from(["metadata", "spec", "policy", "gang", "status", "root"]),
    key=st.sampled_from(
        ["name", "namespace", "schedulingPolicy", "minCount", "basic", "gang", "conditions"]
    )
    | st.text(max_size=20),
    value=json_values,
)
def test_any_pod_group_shape_is_taken_or_skipped_never_crashes_the_informer(
    where: str, key: str, value: Any
) -> None:
    gang: dict[str, Any] = {"minCount": 2}
    policy: dict[str, Any] = {"gang": gang}
    raw: dict[str, Any] = {
        "metadata": {"name": "g", "namespace": "ns"},
        "spec": {"schedulingPolicy": policy},
        "status": {},
    }
    target = {
        "metadata": raw["metadata"],
        "spec": raw["spec"],
        "policy": policy,
        "gang": gang,
        "status": raw["status"],
        "root": raw,
    }[where]
    target[key] = value
    inf = informers()
    inf._handle("podgroups", "ADDED", raw)
    group = inf.state.pod_groups.get("ns/g")
    assert group is None or group.min_count >= 0
    taken = (
        raw.get("spec", {}).get("schedulingPolicy") if isinstance(raw.get("spec"), dict) else None
    )
    assert group is None or (isinstance(taken, dict) and group.gang == ("gang" in taken))
    inf._handle("podgroups", "DELETED", raw)


@FAST
@given(
    st.lists(
        json_values
        | st.fixed_dictionaries(
            {"id": st.text(max_size=5)},
            optional={
                "memoryBytes": json_values,
                "healthy": json_values,
                "index": json_values,
                "numaNode": json_values,
                "partitionMode": json_values,
                "partitions": json_values,
            },
        ),
        max_size=6,
    )
)
def test_any_nodedevices_content_is_taken_or_skipped_never_crashes(devices: list[Any]) -> None:
    inf = informers()
    inf._handle("nodedevices", "ADDED", {"metadata": {"name": "n"}, "status": {"devices": devices}})


@FAST
@given(
    st.text(max_size=30),
    st.one_of(st.text(max_size=30), st.integers(-(10**30), 10**30).map(str), st.just("9" * 5000)),
)
def test_gang_annotations_of_any_value_give_a_sane_gang_or_none(name: str, size: str) -> None:
    pod = Pod(
        "u",
        "ns",
        "p",
        annotations=((POD_GROUP_ANNOTATION, name), (POD_GROUP_SIZE_ANNOTATION, size)),
    )
    gid = gang.gang_of(pod)
    if gid is not None:
        assert 2 <= gid.size <= gang.MAX_GANG_SIZE
    elif name and size and gang.gang_size(size) is None:
        why = gang.invalid_size(pod)
        assert why is not None
        assert repr(size[:40]) in why or size[:40] in why, "the Event names the value"


def test_duplicated_device_ids_in_nodedevices_count_once() -> None:
    raw = {
        "metadata": {"name": "n"},
        "status": {
            "devices": [
                {"id": "gpu-0", "memoryBytes": 80 * 2**30, "healthy": True, "index": 0},
                {"id": "gpu-0", "memoryBytes": 80 * 2**30, "healthy": True, "index": 1},
            ]
        },
    }
    _, devices = objects.node_devices(raw)
    assert [d.id for d in devices] == ["gpu-0"]


def eight() -> tuple[Device, ...]:
    return tuple(Device(f"gpu-{i}", "GPU", 80, True, index=i) for i in range(8))


def forged(core: Any, memory: Any, whole: Any = False, device: str = "gpu-0") -> str:
    return json.dumps(
        {
            "containers": [
                {
                    "name": "c",
                    "devices": [{"id": device, "whole": whole, "core": core, "memoryGiB": memory}],
                }
            ]
        }
    )


def bound(
    uid: str,
    annotation: str | None = None,
    devices: tuple[DeviceRequest, ...] = (DeviceRequest("c", gpus=1),),
) -> Pod:
    notes = ((DECISION, annotation),) if annotation else ()
    return Pod(
        uid,
        "ns",
        uid,
        scheduler_name="default-scheduler",
        node_name="n",
        phase="Running",
        annotations=notes,
        devices=devices,
    )


def free_core(state: ClusterState, device: str = "gpu-0") -> int:
    use = state.nodes["n"].device_use.get(device)
    return CORE_PER_GPU if use is None else (0 if use.whole else CORE_PER_GPU - use.core)


def test_a_forged_negative_decision_on_a_users_own_pod_frees_nothing() -> None:
    state = ClusterState()
    state.set_node(Node("n"))
    state.set_devices("n", eight())
    state.observe_pod(bound("theirs", forged(-100, -80)))
    state.add_pod(
        Pod("a", "ns", "a"),
        "n",
        gpu.choose(eight(), {}, [DeviceRequest("c", core=100, memory_gib=80)]),
    )
    assert free_core(state) >= 0
    assert free_core(state) <= CORE_PER_GPU
    with_room = state.nodes["n"].device_use
    try:
        gpu.choose(eight()[:1], with_room, [DeviceRequest("c", core=50)])
    except gpu.NoFit:
        return
    raise AssertionError("gpu-0 is full: a forged negative share must not make room on it")


def test_a_forged_whole_gpu_given_back_does_not_free_the_real_holders_gpu() -> None:
    state = ClusterState()
    state.set_node(Node("n"))
    state.set_devices("n", eight())
    real = gpu.choose(eight()[:1], {}, [DeviceRequest("c", gpus=1)])
    state.add_pod(Pod("a", "ns", "a"), "n", real)
    state.observe_pod(bound("theirs", forged(0, 0, whole=True)))
    state.remove_pod("theirs")
    use = state.nodes["n"].device_use.get("gpu-0")
    assert use is not None
    assert use.whole, "pod a still holds gpu-0"


@FAST
@given(
    st.lists(
        st.tuples(
            st.booleans(),
            st.sampled_from(["gpu-0", "gpu-1"]),
            st.integers(-300, 300),
            st.integers(-300, 300),
            st.booleans(),
        ),
        max_size=12,
    )
)
def test_any_forged_decisions_added_and_removed_never_overcommit_what_real_pods_hold(
    ops: list[tuple[bool, str, int, int, bool]],
) -> None:
    state = ClusterState()
    state.set_node(Node("n"))
    state.set_devices("n", eight())
    real = gpu.choose(eight(), {}, [DeviceRequest("c", core=60, memory_gib=40)])
    state.add_pod(Pod("real", "ns", "real"), "n", real)
    for i, (add, device, core, mem, whole) in enumerate(ops):
        uid = f"forged-{i % 4}"
        if add:
            state.observe_pod(bound(uid, forged(core, mem, whole, device)))
        else:
            state.remove_pod(uid)
        for d in ("gpu-0", "gpu-1"):
            use = state.nodes["n"].device_use.get(d)
            if use is not None and not use.whole:
                assert use.core >= 0
                assert use.memory_gib >= 0
    for i in range(4):
        state.remove_pod(f"forged-{i}")
    assert state.nodes["n"].device_use == gpu.apply({}, real), "only the real pod's use is left"


@FAST
@given(
    doc=st.dictionaries(
        st.one_of(
            st.sampled_from(
                [
                    "scheduler_name",
                    "gpu_strategy",
                    "plugins",
                    "gang_timeout",
                    "resource_gpu",
                    "topology_labels",
                    "schedulerName",
                    "gangTimeoutSeconds",
                ]
            ),
            st.text(max_size=8),
            st.integers(),
            st.none(),
        ),
        json_values,
        max_size=4,
    )
)
def test_any_configmap_document_gives_settings_or_an_error_naming_it(doc: dict[Any, Any]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cm.yaml"
        path.write_text(yaml.safe_dump({"version": "v1", **doc}))
        try:
            load_settings(["--config", str(path)], {})
        except ConfigError as e:
            error = str(e)
        else:
            return
    assert "cm.yaml" in error or any(str(k) in error for k in doc), "the error names the input"


def _slice(devices: Any, pool: Any = "n1") -> dict[str, Any]:
    spec = {"driver": "lj-runtimekit.aliyun.com", "nodeName": "n1", "pool": {"name": pool}}
    return {"metadata": {"name": "s", "uid": "s"}, "spec": {**spec, "devices": devices}}


def _claim(results: Any, reserved: Any = ()) -> dict[str, Any]:
    status = {"allocation": {"devices": {"results": results}}, "reservedFor": reserved}
    return {"metadata": {"name": "c", "uid": "c"}, "status": status}


@FAST
@given(
    devices=st.lists(
        json_values
        | st.fixed_dictionaries(
            {"name": json_values},
            optional={
                "attributes": json_values
                | st.fixed_dictionaries({"runtimeDeviceID": json_values, "type": json_values}),
                "capacity": json_values,
                "allowMultipleAllocations": json_values,
            },
        ),
        max_size=4,
    ),
    pool=json_values,
    results=st.lists(
        json_values
        | st.fixed_dictionaries(
            {
                "driver": st.just("lj-runtimekit.aliyun.com"),
                "pool": json_values,
                "device": json_values,
            },
            optional={"consumedCapacity": json_values},
        ),
        max_size=3,
    ),
    reserved=json_values,
)
def test_any_slice_or_claim_is_taken_or_skipped_and_the_ledger_still_answers(
    devices: list[Any], pool: Any, results: list[Any], reserved: Any
) -> None:
    """A slice or claim of any shape (a broken writer, a hostile one with RBAC to write them):
    skipped by name or taken whole, never half; what the ledger then says never raises."""
    inf = informers()
    good = _slice([{"name": "d0", "attributes": {"runtimeDeviceID": {"string": "gpu-0"}}}])
    inf._handle("resourceslices", "ADDED", good)
    for ev in ("ADDED", "MODIFIED"):
        inf._handle("resourceslices", ev, _slice(devices, pool))
        inf._handle("resourceclaims", ev, _claim(results, reserved))
    ledger = inf.state.dra
    use = ledger.use("n1", lambda uid: False)
    assert all(isinstance(k, str) for k in use), use
    inf._handle("resourceclaims", "DELETED", _claim(results))
    inf._handle("resourceslices", "DELETED", _slice(devices, pool))
    assert ledger.use("n1", lambda uid: False) == {}
    assert not ledger.serves("n1")


@pytest.mark.parametrize(
    ("memory", "kept"),
    [
        (80 * 2**30, True),
        (0, True),
        (-(2**30), False),
        (10**30, False),
        (1.5, False),
        ("80Gi", False),
        (True, False),
    ],
    ids=["80GiB", "absent-as-0", "negative", "beyond-16TiB", "fraction", "text", "bool"],
)
def test_a_nodedevices_memory_that_cannot_be_true_leaves_that_device_out_and_says_so(
    memory: object, kept: bool
) -> None:
    # issue 34: an impossible capacity (negative was read as 0, 1e30 bytes as room for any
    # share) is refused, that device alone, with the reason
    raw = {
        "metadata": {"name": "n"},
        "status": {
            "devices": [
                {"id": "gpu-0", "memoryBytes": memory, "healthy": True, "index": 0},
                {"id": "gpu-1", "memoryBytes": 80 * 2**30, "healthy": True, "index": 1},
            ]
        },
    }
    refused: list[str] = []
    _, devices = objects.node_devices(raw, refused=refused)
    assert [d.id for d in devices] == (["gpu-0", "gpu-1"] if kept else ["gpu-1"])
    assert bool(refused) is not kept
    if refused:
        assert "gpu-0" in refused[0]
        assert "memoryBytes" in refused[0]


def test_a_partition_larger_than_its_gpu_is_left_out() -> None:
    raw = {
        "metadata": {"name": "n"},
        "status": {
            "devices": [
                {
                    "id": "gpu-0",
                    "memoryBytes": 80 * 2**30,
                    "healthy": True,
                    "partitionMode": "MIG",
                    "partitions": [
                        {"id": "gpu-0-mig-0", "memoryBytes": 10 * 2**30, "healthy": True},
                        {"id": "gpu-0-mig-1", "memoryBytes": 800 * 2**30, "healthy": True},
                    ],
                }
            ]
        },
    }
    refused: list[str] = []
    _, devices = objects.node_devices(raw, refused=refused)
    assert [d.id for d in devices] == ["gpu-0-mig-0"]
    assert "gpu-0-mig-1" in refused[0]
