"""Devices → advertised units: counts, stable IDs, MIG/TDM strategies, health."""

from __future__ import annotations

import dataclasses

import pytest

from lj_runtimekit_device_plugin.model import Device
from lj_runtimekit_device_plugin.resources import (
    ResourceNames,
    advertise,
    capacity,
    device_of,
)


def test_eight_gpus_advertise_gpu_core_and_memory_as_the_guide_says(
    eight_gpus: list[Device],
) -> None:
    caps = capacity(advertise(eight_gpus, ResourceNames()))
    assert caps == {
        "aliyun.com/gpu": 8,
        "aliyun.com/gpu-core": 800,
        "aliyun.com/gpu-memory": 8 * 80,
    }


def test_unit_ids_are_stable_and_unique(eight_gpus: list[Device]) -> None:
    first = advertise(eight_gpus, ResourceNames())
    again = advertise(list(reversed(eight_gpus)), ResourceNames())
    assert first == again
    ids = [u.id for units in first.values() for u in units]
    assert len(ids) == len(set(ids))
    assert device_of("gpu-3::core-42") == "gpu-3"
    assert device_of("gpu-3::mem-7") == "gpu-3"
    assert device_of("gpu-3") == "gpu-3"


def test_resource_names_and_kinds_come_from_config(eight_gpus: list[Device]) -> None:
    names = ResourceNames(gpu_memory="aliyun.com/gpu-mem", enabled=frozenset({"gpu-memory"}))
    assert capacity(advertise(eight_gpus, names)) == {"aliyun.com/gpu-mem": 640}


def test_unhealthy_device_stays_listed_but_leaves_capacity(eight_gpus: list[Device]) -> None:
    eight_gpus[2] = dataclasses.replace(eight_gpus[2], healthy=False, reason="XID 79")
    adv = advertise(eight_gpus, ResourceNames())
    assert len(adv["aliyun.com/gpu"]) == 8
    assert capacity(adv)["aliyun.com/gpu"] == 7
    assert capacity(adv)["aliyun.com/gpu-core"] == 700


def test_ppu_goes_to_its_own_resource() -> None:
    ppus = [Device(id=f"ppu-{i}", index=i, kind="ppu", memory_bytes=1 << 36) for i in range(4)]
    assert capacity(advertise(ppus, ResourceNames())) == {"alibabacloud.com/ppu": 4}


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [
        (
            "single",
            {"aliyun.com/gpu": 3 + 2 + 1, "aliyun.com/gpu-core": 100, "aliyun.com/gpu-memory": 80},
        ),
        (
            "mixed",
            {
                "aliyun.com/gpu-mig-1g.10gb": 2,
                "aliyun.com/gpu-mig-3g.40gb": 1,
                "aliyun.com/gpu": 2 + 1,
                "aliyun.com/gpu-core": 100,
                "aliyun.com/gpu-memory": 80,
            },
        ),
        (
            "none",
            {"aliyun.com/gpu": 1 + 2 + 1, "aliyun.com/gpu-core": 100, "aliyun.com/gpu-memory": 80},
        ),
    ],
    ids=["single", "mixed", "none"],
)
def test_mig_strategy_and_tdm_slices(
    mig_tdm: list[Device], strategy: str, expected: dict[str, int]
) -> None:
    names = ResourceNames(mig_strategy=strategy)
    assert capacity(advertise(mig_tdm, names)) == expected


def test_tdm_slices_are_advertised_by_partition_id(mig_tdm: list[Device]) -> None:
    gpu = advertise(mig_tdm, ResourceNames())["aliyun.com/gpu"]
    assert "gpu-1-tdm-50-0" in {u.id for u in gpu}
    assert {u.device_id for u in gpu if u.id.startswith("gpu-1-")} == {"gpu-1"}
