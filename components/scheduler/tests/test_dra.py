"""The DRA ledger and the claim a pod of ours gets on a node in DRA mode (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from lj_runtimekit_scheduler import dra
from lj_runtimekit_scheduler.gpu import Choice, Slice
from lj_runtimekit_scheduler.model import DEFAULT_NAMES, DeviceRequest, DeviceUse, Pod

DRIVER = dra.DEFAULT_DRIVER


def slice_of(node: str, *ids: str, shareable: bool = True) -> dict[str, Any]:
    devices = [
        {
            "name": f"dev-{i}",
            "attributes": {"runtimeDeviceID": {"string": rid}, "type": {"string": "gpu"}},
            "capacity": {"memory": {"value": "80Gi"}},
            **({"allowMultipleAllocations": True} if shareable else {}),
        }
        for i, rid in enumerate(ids)
    ]
    return {
        "metadata": {"name": f"{node}-slice"},
        "spec": {"driver": DRIVER, "nodeName": node, "pool": {"name": node}, "devices": devices},
    }


def claim_of(
    uid: str, node: str, device: str, used: dict[str, str] | None, pod: str = ""
) -> dict[str, Any]:
    result: dict[str, Any] = {"request": "r", "driver": DRIVER, "pool": node, "device": device}
    if used is not None:
        result["consumedCapacity"] = used
    status: dict[str, Any] = {"allocation": {"devices": {"results": [result]}}}
    if pod:
        status["reservedFor"] = [{"resource": "pods", "name": "p", "uid": pod}]
    return {"metadata": {"uid": uid}, "status": status}


def test_claims_count_against_the_runtime_devices_of_their_node() -> None:
    ledger = dra.Ledger()
    assert ledger.set_slice("n1-slice", slice_of("n1", "gpu-0", "gpu-1")) == {"n1"}
    assert ledger.serves("n1")
    assert not ledger.serves("n2")
    ledger.set_claim(claim_of("a", "n1", "dev-0", {"cores": "30", "memory": "10Gi"}))
    ledger.set_claim(claim_of("b", "n1", "dev-0", {"cores": "20", "memory": "5Gi"}, pod="ours"))
    ledger.set_claim(claim_of("c", "n1", "dev-1", None))
    ledger.set_claim({"metadata": {"uid": "unallocated"}, "status": {}})
    use = ledger.use("n1", lambda uid: False)
    assert use == {"gpu-0": DeviceUse(False, 50, 15), "gpu-1": DeviceUse(whole=True)}
    # a claim of a pod the caller counts by its own decision is left out
    assert ledger.use("n1", lambda uid: uid == "ours")["gpu-0"] == DeviceUse(False, 30, 10)
    # a claim taking all of a shareable GPU is the whole GPU
    ledger.set_claim(claim_of("c", "n1", "dev-1", {"cores": "100", "memory": "80Gi"}))
    assert ledger.use("n1", lambda uid: False)["gpu-1"].whole
    assert ledger.set_claim(None, "a") == {"n1"}
    assert ledger.set_slice("n1-slice", None) == {"n1"}
    assert not ledger.serves("n1")
    assert ledger.use("n1", lambda uid: False) == {}


def test_another_drivers_slices_and_claims_are_not_ours() -> None:
    ledger = dra.Ledger()
    other = slice_of("n1", "gpu-0")
    other["spec"]["driver"] = "gpu.example.com"
    assert ledger.set_slice("x", other) == set()
    assert not ledger.serves("n1")


def test_a_share_becomes_one_request_for_cores_and_memory_of_its_gpu() -> None:
    ledger = dra.Ledger()
    ledger.set_slice("s", slice_of("n1", "gpu-0", "gpu-1"))
    pod = Pod("uid-1", "ns", "p", devices=(DeviceRequest("main", core=30, memory_gib=10),))
    choice = Choice((("main", (Slice("gpu-1", core=30, memory_gib=10),)),))
    plan = dra.plan(pod, "n1", choice, ledger, DEFAULT_NAMES, new_id=lambda: "share-1")
    (request,) = plan.claim["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == f"gpu-share.{DRIVER}"
    assert request["exactly"]["capacity"] == {"requests": {"cores": "30", "memory": "10Gi"}}
    assert plan.results == [
        {
            "request": request["name"],
            "driver": DRIVER,
            "pool": "n1",
            "device": "dev-1",
            "shareID": "share-1",
            "consumedCapacity": {"cores": "30", "memory": "10Gi"},
        }
    ]
    assert {m["resourceName"] for m in plan.mappings} == {
        "aliyun.com/gpu-core",
        "aliyun.com/gpu-memory",
    }
    meta = plan.claim["metadata"]
    assert meta["annotations"] == {dra.EXTENDED_CLAIM_ANNOTATION: "true"}
    assert meta["ownerReferences"][0]["uid"] == "uid-1"
    status = dra.status(pod, "n1", plan, "2026-01-01T00:00:00Z")["status"]
    assert status["reservedFor"] == [{"resource": "pods", "name": "p", "uid": "uid-1"}]


def test_whole_gpus_take_all_of_a_shareable_device_and_a_missing_device_is_refused() -> None:
    ledger = dra.Ledger()
    ledger.set_slice("s", slice_of("n1", "gpu-0"))
    pod = Pod("u", "ns", "p", devices=(DeviceRequest("main", gpus=1),))
    plan = dra.plan(
        pod,
        "n1",
        Choice((("main", (Slice("gpu-0", whole=True),)),)),
        ledger,
        DEFAULT_NAMES,
        new_id=lambda: "x",
    )
    assert plan.results[0]["consumedCapacity"] == {"cores": "100", "memory": "80Gi"}
    assert [m["resourceName"] for m in plan.mappings] == ["aliyun.com/gpu"]
    with pytest.raises(dra.NotOffered):
        dra.plan(
            pod,
            "n1",
            Choice((("main", (Slice("gpu-9", whole=True),)),)),
            ledger,
            DEFAULT_NAMES,
            new_id=lambda: "x",
        )


@pytest.mark.parametrize(
    ("raw", "n"), [("80Gi", 80 << 30), ("30", 30), ("1.5k", 1500), ("10Mi", 10 << 20)]
)
def test_quantities(raw: str, n: int) -> None:
    assert dra.quantity(raw) == n


def test_a_share_naming_one_of_core_and_memory_cannot_be_a_claim() -> None:
    assert "names both" in dra.unmappable(
        Pod("u", "ns", "p", devices=(DeviceRequest("main", memory_gib=10),))
    )
    assert (
        dra.unmappable(
            Pod("u", "ns", "p", devices=(DeviceRequest("main", core=10, memory_gib=10),))
        )
        == ""
    )
