"""GPUs fenced for a waiting partition layout change (issue 39; pure and the inventory): exactly
the named GPUs leave the kubelet's allocatable and read unavailable in NodeDevices."""

from __future__ import annotations

import dataclasses
import json

from hypothesis import given
from hypothesis import strategies as st

from lj_runtimekit_device_plugin import fence
from lj_runtimekit_device_plugin.inventory import Inventory
from lj_runtimekit_device_plugin.model import Device, RuntimeInfo
from lj_runtimekit_device_plugin.nodedevices import status
from lj_runtimekit_device_plugin.resources import ResourceNames, advertise, capacity

HELD = "gpu-1 by team/train/main (a-1)"
TEXT = json.dumps(
    {"layout": "mig-2", "digest": "d", "devices": ["gpu-0", "gpu-1"], "heldBy": [HELD]}
)


def fenced_view(devices: list[Device]) -> tuple[Device, ...]:
    return fence.overlay(devices, fence.parse(TEXT))


def test_the_fenced_gpus_and_only_they_leave_what_the_kubelet_can_give(
    eight_gpus: list[Device],
) -> None:
    caps = capacity(advertise(fenced_view(eight_gpus), ResourceNames()))
    assert caps == {"aliyun.com/gpu": 6, "aliyun.com/gpu-core": 600, "aliyun.com/gpu-memory": 480}
    units = advertise(fenced_view(eight_gpus), ResourceNames())["aliyun.com/gpu"]
    assert [u.id for u in units if not u.healthy] == ["gpu-0", "gpu-1"]
    assert len(units) == 8, "fenced units stay listed, Unhealthy: they do not vanish"


def test_the_partitions_of_a_fenced_mig_gpu_are_fenced_too(mig_tdm: list[Device]) -> None:
    gpu0 = mig_tdm[0]
    assert gpu0.partitions
    only = fence.overlay(mig_tdm, {gpu0.id: "fenced for partition layout x"})
    units = [u for us in advertise(only, ResourceNames()).values() for u in us]
    assert {u.id for u in units if not u.healthy} == {p.id for p in gpu0.partitions}


def test_nodedevices_shows_a_fenced_gpu_unavailable_and_why(eight_gpus: list[Device]) -> None:
    s = status(list(fenced_view(eight_gpus)), RuntimeInfo("v1.14.0", "v1"))
    by_id = {d["id"]: d for d in s["devices"]}
    assert [i for i, d in by_id.items() if not d["healthy"]] == ["gpu-0", "gpu-1"]
    assert "mig-2" in by_id["gpu-0"]["fenced"]
    assert HELD in by_id["gpu-1"]["fenced"]
    assert by_id["gpu-2"]["fenced"] == ""
    assert s["healthyCount"] == 6


def test_an_unhealthy_gpu_keeps_its_own_reason_under_a_fence(eight_gpus: list[Device]) -> None:
    sick = [dataclasses.replace(eight_gpus[0], healthy=False, reason="XID 79"), *eight_gpus[1:]]
    [first, second, *_] = fenced_view(sick)
    assert (first.healthy, first.reason, first.fenced) == (False, "XID 79", "")
    assert (second.healthy, bool(second.fenced)) == (False, True)


@given(st.text(max_size=300))
def test_any_annotation_text_fences_named_devices_or_nothing(text: str) -> None:
    got = fence.parse(text)
    assert all(isinstance(k, str) and k for k in got)


def test_a_hand_edited_annotation_that_is_no_fence_fences_nothing() -> None:
    for text in ("", "all", "[]", '{"devices": "all"}', "{}"):
        assert fence.parse(text) == {}, text


async def test_the_inventory_view_follows_the_fence(eight_gpus: list[Device]) -> None:
    inv = Inventory()
    await inv.replace(eight_gpus)
    before = inv.view()
    assert not inv.fence_known.is_set()
    assert await inv.set_fence(fence.parse(TEXT))
    assert inv.fence_known.is_set()
    after = inv.view()
    assert after.generation > before.generation
    assert [d.id for d in after.devices if not d.healthy] == ["gpu-0", "gpu-1"]
    assert not await inv.set_fence(fence.parse(TEXT)), "the same fence is no change"
    assert await inv.set_fence({})
    assert all(d.healthy for d in inv.view().devices)
