"""What each mode learns of the other's allocations when a node changes mode (pure)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from lj_runtimekit_device_plugin.dra.checkpoint import Checkpoint, ClaimRecord, claimed_ids
from lj_runtimekit_device_plugin.dra.offers import device_names
from lj_runtimekit_device_plugin.dra.slices import UNHEALTHY_TAINT_KEY, NodeFacts, resource_slices
from lj_runtimekit_device_plugin.handover import (
    HELD_TAINT_KEY,
    Handover,
    held_taints,
    holders,
    split,
    taint_value,
    withhold,
)
from lj_runtimekit_device_plugin.model import Allocation, Device, Injection
from lj_runtimekit_device_plugin.reconcile import Holding, Memory, decide
from lj_runtimekit_device_plugin.resources import ResourceNames, advertise


def alloc(
    i: str, devices: tuple[str, ...], pod: str = "old", resource: str = "aliyun.com/gpu"
) -> Allocation:
    return Allocation(i, devices, Injection(), pod=("ns", pod, f"{pod}-uid"), resource=resource)


def test_claims_allocations_are_told_apart_from_the_device_plugins_by_the_checkpoint() -> None:
    cp = Checkpoint(
        "boot",
        {
            "u1": ClaimRecord("ns", "c1", allocation_ids=("a2",)),
            "u2": ClaimRecord("ns", "c2", allocation_ids=("a3", "a4")),
        },
    )
    assert claimed_ids(cp) == {"a2", "a3", "a4"}
    allocs = [alloc(i, ("gpu-0",)) for i in ("a1", "a2", "a3", "a5")]
    s = split(allocs, claimed_ids(cp))
    assert [a.id for a in s.device_plugin] == ["a1", "a5"]
    assert [a.id for a in s.claims] == ["a2", "a3"]


def test_holders_name_the_gpu_of_a_partition_and_one_pod_per_device(mig_tdm: list[Device]) -> None:
    devices = mig_tdm
    held = holders(
        [
            alloc("a1", ("gpu-0-mig-1g.10gb-1",), pod="b"),
            alloc("a2", ("gpu-0-mig-3g.40gb-0",), pod="a"),
            alloc("a3", ("gpu-2",), pod="c", resource="aliyun.com/gpu-core"),
            alloc("a4", ("gpu-gone",), pod="d"),
        ],
        devices,
    )
    assert held == {
        "gpu-0": ("ns", "a", "a-uid"),  # the first pod by name, whatever the order
        "gpu-2": ("ns", "c", "c-uid"),
        "gpu-gone": ("ns", "d", "d-uid"),
    }


@pytest.mark.parametrize(
    ("pod", "value"),
    [
        (("ml", "train-0", "u-1"), "ml.train-0"),
        (
            ("ml", "x" * 70, "0b6f6d2e-1111-2222-3333-444455556666"),
            "0b6f6d2e-1111-2222-3333-444455556666",
        ),
        (("ml", "x" * 70, "not a label value!"), ""),
    ],
    ids=["namespace-dot-name", "too-long-uid", "nothing-valid"],
)
def test_the_taint_value_is_the_pod_when_it_is_a_label_value(
    pod: tuple[str, str, str], value: str
) -> None:
    assert taint_value(pod) == value
    (taint,) = held_taints({"gpu-1": pod})["gpu-1"]
    assert taint.get("value", "") == value
    assert (taint["key"], taint["effect"]) == (HELD_TAINT_KEY, "NoSchedule")


def test_a_held_gpu_is_tainted_in_the_slices_beside_its_health_taint(
    eight_gpus: list[Device],
) -> None:
    devices = list(eight_gpus)
    sick = devices[5]
    devices[5] = replace(sick, healthy=False, reason="xid-79")
    taints = held_taints({"gpu-3": ("ns", "old", "u"), "gpu-5": ("ns", "old", "u")})
    (s,) = resource_slices(devices, NodeFacts(node="n", device_taints=taints))
    names = device_names(devices)
    by_name = {d["name"]: d for d in s["spec"]["devices"]}
    assert by_name[names["gpu-3"]]["taints"] == [
        {"key": HELD_TAINT_KEY, "value": "ns.old", "effect": "NoSchedule"}
    ]
    assert [t["key"] for t in by_name[names["gpu-5"]]["taints"]] == [
        UNHEALTHY_TAINT_KEY,
        HELD_TAINT_KEY,
    ]
    assert [n for n, d in by_name.items() if d.get("taints")] == [names["gpu-3"], names["gpu-5"]]


def test_units_of_devices_prepared_claims_hold_are_unhealthy_and_the_others_untouched(
    eight_gpus: list[Device],
) -> None:
    units = advertise(eight_gpus[:4], ResourceNames())
    gpus = withhold(units["aliyun.com/gpu"], {"gpu-1"})
    assert [u.healthy for u in gpus] == [True, False, True, True]
    cores = withhold(units["aliyun.com/gpu-core"], {"gpu-1"})
    assert {u.device_id for u in cores if not u.healthy} == {"gpu-1"}
    assert withhold(gpus, ()) == gpus


async def test_the_handover_is_known_after_its_first_answer_and_wakes_on_change_only() -> None:
    h = Handover()
    assert not h.known.is_set()
    assert not await h.set({})
    assert h.known.is_set()
    assert h.generation == 0
    waiter = asyncio.ensure_future(h.changed(0))
    await asyncio.sleep(0)
    assert not waiter.done()
    assert await h.set({"gpu-0": ("ns", "p", "u")})
    assert await asyncio.wait_for(waiter, 1) == 1
    assert not await h.set({"gpu-0": ("ns", "p", "u")})
    assert h.generation == 1


@pytest.mark.parametrize(
    ("holdings", "released"),
    [
        ([Holding("ns", "p", "main", "", ())], False),
        ([], True),
    ],
    ids=["listed-pod-keeps-it", "gone-pod-releases-it"],
)
def test_in_mode_dra_a_listed_pod_keeps_an_allocation_its_container_does_not_list(
    holdings: list[Holding], released: bool
) -> None:
    """A claim the checkpoint lost looks like a device-plugin allocation whose container holds
    nothing (pod-resources lists a claim's devices under dynamic_resources): never released under
    its running pod; once the pod is gone it is."""
    a = alloc("a1", ("gpu-0",), pod="p")
    memory = Memory({"a1": 0.0}, frozenset({"a1"}))
    kw = {"now": 100.0, "grace_s": 0.0, "memory": memory, "shared_resources": frozenset()}
    d = decide([a], holdings, None, listed_pods_hold=True, **kw)  # type: ignore[arg-type]
    assert bool(d.release) == released
    # in mode device-plugin the same container is a leak
    assert decide([a], holdings, None, **kw).release  # type: ignore[arg-type]
