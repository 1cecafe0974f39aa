"""NodeDevices status and node labels from devices."""

from __future__ import annotations

import dataclasses

from lj_runtimekit_device_plugin.model import Device, RuntimeInfo
from lj_runtimekit_device_plugin.nodedevices import LABEL_PREFIX, label_patch, labels, status
from lj_runtimekit_device_plugin.resources import ResourceNames

RT = RuntimeInfo("v1.13.0", "v1")


def test_status_summarises_the_node_for_kubectl_get(eight_gpus: list[Device]) -> None:
    s = status(eight_gpus, RT)
    assert s["deviceCount"] == 8
    assert s["healthyCount"] == 8
    assert s["summary"] == {
        "kind": "GPU",
        "model": "A100",
        "memoryPerDevice": "80Gi",
        "partitioning": "none",
    }
    assert {d["nvlinkIsland"] for d in s["devices"]} == {0, 1}
    assert s["devices"][0]["links"][0]["type"] == "NVLINK"


def test_status_changes_only_when_devices_change(eight_gpus: list[Device]) -> None:
    assert status(eight_gpus, RT) == status(list(eight_gpus), RT)
    sick = [dataclasses.replace(eight_gpus[0], healthy=False, reason="XID 79"), *eight_gpus[1:]]
    s = status(sick, RT)
    assert s["healthyCount"] == 7
    assert s["devices"][0]["healthReason"] == "XID 79"


def test_labels_describe_devices_and_patch_only_differences(eight_gpus: list[Device]) -> None:
    new = labels(eight_gpus, RT)
    assert new[LABEL_PREFIX + "count"] == "8"
    assert new[LABEL_PREFIX + "memory-gib"] == "80"
    assert new[LABEL_PREFIX + "nvlink-islands"] == "4x4"
    assert new[LABEL_PREFIX + "runtime-version"] == "v1.13.0"
    assert label_patch(new, new) == {}
    old = {**new, LABEL_PREFIX + "stale": "x"}
    assert label_patch(old, new) == {LABEL_PREFIX + "stale": None}


def test_each_partition_names_the_resource_it_is_advertised_under(mig_tdm: list[Device]) -> None:
    def resources(names: ResourceNames) -> dict[str, str]:
        s = status(mig_tdm, RT, names)
        return {p["id"]: p["resource"] for d in s["devices"] for p in d["partitions"]}

    single = resources(ResourceNames())
    assert set(single.values()) == {"aliyun.com/gpu"}
    assert len(single) == 5
    mixed = resources(ResourceNames(mig_strategy="mixed"))
    assert mixed["gpu-0-mig-3g.40gb-0"] == "aliyun.com/gpu-mig-3g.40gb"
    assert mixed["gpu-1-tdm-50-0"] == "aliyun.com/gpu"
    off = resources(ResourceNames(enabled=frozenset({"gpu-core", "gpu-memory"})))
    assert set(off.values()) == {""}
