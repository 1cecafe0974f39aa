"""The node's ResourceSlices: what the scheduler sees of the Runtime's devices under DRA."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from lj_runtimekit_device_plugin.dra.claims import quantity
from lj_runtimekit_device_plugin.dra.offers import DYNAMIC, device_names, offers, shareable
from lj_runtimekit_device_plugin.dra.slices import NodeFacts, resource_slices, semver
from lj_runtimekit_device_plugin.model import GIB, Device, Link, Partition

FACTS = NodeFacts(
    node="gpu-node-0",
    generation=3,
    node_uid="5b0d4e1a-0000-4000-8000-00000000aaaa",
    driver_version="535.104.05",
    runtime_version="v1.13.0",
    compute_capability={f"gpu-{i}": "8.0" for i in range(8)},
)


def test_golden_eight_gpus_in_two_nvlink_islands(eight_gpus: list[Device]) -> None:
    devices = list(eight_gpus)
    devices[5] = Device(**{**devices[5].__dict__, "healthy": False, "reason": "XidError79"})
    (rs,) = resource_slices(devices, FACTS)
    assert rs["apiVersion"] == "resource.k8s.io/v1"
    assert rs["kind"] == "ResourceSlice"
    assert rs["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "name": "gpu-node-0",
            "uid": "5b0d4e1a-0000-4000-8000-00000000aaaa",
            "controller": True,
        }
    ]
    spec = rs["spec"]
    assert spec["driver"] == "lj-runtimekit.aliyun.com"
    assert spec["nodeName"] == "gpu-node-0"
    assert spec["pool"] == {"name": "gpu-node-0", "generation": 3, "resourceSliceCount": 1}
    assert [d["name"] for d in spec["devices"]] == [f"gpu-{i}" for i in range(8)]
    assert spec["devices"][2] == {
        "name": "gpu-2",
        "attributes": {
            "type": {"string": "gpu"},
            "index": {"int": 2},
            "runtimeDeviceID": {"string": "gpu-2"},
            "uuid": {"string": "GPU-0002"},
            "model": {"string": "A100"},
            "partitionMode": {"string": "none"},
            "numaNode": {"int": 0},
            "nvlinkIsland": {"int": 0},
            "pcieSwitch": {"int": 1},
            "computeCapability": {"version": "8.0.0"},
            "driverVersion": {"version": "535.104.5"},
            "runtimeVersion": {"version": "1.13.0"},
        },
        "allowMultipleAllocations": True,
        "capacity": {
            "cores": {
                "value": "100",
                "requestPolicy": {
                    "default": "100",
                    "validRange": {"min": "1", "max": "100", "step": "1"},
                },
            },
            "memory": {
                "value": "80Gi",
                "requestPolicy": {"default": "80Gi", "validRange": {"min": "1Mi"}},
            },
        },
    }
    islands = [d["attributes"]["nvlinkIsland"]["int"] for d in spec["devices"]]
    assert islands == [0, 0, 0, 0, 1, 1, 1, 1]
    assert spec["devices"][5]["taints"] == [
        {"key": "lj-runtimekit.aliyun.com/unhealthy", "value": "XidError79", "effect": "NoSchedule"}
    ]
    assert all("taints" not in d for i, d in enumerate(spec["devices"]) if i != 5)


def test_recovery_clears_the_taint(eight_gpus: list[Device]) -> None:
    devices = eight_gpus
    sick = [Device(**{**devices[0].__dict__, "healthy": False, "reason": "bad reason: spaces"})]
    (rs,) = resource_slices(sick, FACTS)
    # the reason is no label value, so the taint carries none
    assert rs["spec"]["devices"][0]["taints"] == [
        {"key": "lj-runtimekit.aliyun.com/unhealthy", "effect": "NoSchedule"}
    ]
    (rs,) = resource_slices(devices[:1], FACTS)
    assert "taints" not in rs["spec"]["devices"][0]


def test_vfio_and_other_kinds_are_not_published_and_no_devices_no_slices() -> None:
    devices = [Device(id="gpu-0", binding="vfio"), Device(id="x-0", kind="other")]
    assert resource_slices(devices, FACTS) == []


def test_large_pools_are_split_and_counted() -> None:
    devices = [Device(id=f"gpu-{i}", index=i) for i in range(200)]
    slices = resource_slices(devices, FACTS)
    assert [len(s["spec"]["devices"]) for s in slices] == [128, 72]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {2}
    devices[0] = Device(id="gpu-0", healthy=False)
    slices = resource_slices(devices, FACTS)
    assert [len(s["spec"]["devices"]) for s in slices] == [64, 64, 64, 8]
    assert len({s["metadata"]["name"] for s in slices}) == 4


def test_only_whole_unpartitioned_gpus_with_memory_can_be_shared() -> None:
    mig = Partition(id="gpu-1-mig-0", profile="1g.10gb", memory_bytes=10 * GIB)
    devices = [
        Device(id="gpu-0", index=0, memory_bytes=80 * GIB),
        Device(id="gpu-1", index=1, memory_bytes=80 * GIB, partition_mode="mig", partitions=(mig,)),
        Device(id="gpu-2", index=2, memory_bytes=0),
        Device(id="ppu-0", index=3, kind="ppu", memory_bytes=96 * GIB),
        Device(id="gpu-4", index=4, memory_bytes=80 * GIB + 512),
    ]
    (rs,) = resource_slices(devices, FACTS)
    got = {d["name"]: d for d in rs["spec"]["devices"]}
    assert [n for n, d in got.items() if d.get("allowMultipleAllocations")] == ["gpu-0", "gpu-4"]
    # a partitioned GPU is its partitions (static): the MIG instance, with its own memory
    assert "gpu-1" not in got
    assert got["gpu-1-mig-0"]["capacity"] == {"memory": {"value": "10Gi"}}
    assert "capacity" not in got["gpu-2"]
    assert got["ppu-0"]["capacity"] == {"memory": {"value": "96Gi"}}
    # memory that is no whole GiB is published in bytes, its whole as the default
    memory = got["gpu-4"]["capacity"]["memory"]
    assert memory["value"] == memory["requestPolicy"]["default"] == str(80 * GIB + 512)
    assert not shareable(Device(id="gpu-5", binding="vfio", memory_bytes=80 * GIB))
    assert not shareable(Device(id="gpu-6", memory_bytes=(1 << 20) - 1))


def test_semver() -> None:
    assert semver("9.0") == "9.0.0"
    assert semver("v1.13.0") == "1.13.0"
    assert semver("1.2.3-rc.1") == "1.2.3-rc.1"
    assert semver("535.104.05") == "535.104.5"
    assert semver("latest") is None


# --- the API's validation rules, written from the resource.k8s.io/v1 reference ---------------
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,31}\Z")
LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?\Z")
SEMVER = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?"
    r"(\+[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?\Z"
)
QUANTITY = re.compile(r"\d+(Ki|Mi|Gi|Ti|Pi|Ei)?\Z")


def assert_valid(rs: dict[str, Any]) -> None:
    name = rs["metadata"]["name"]
    assert len(name) <= 253
    assert DNS_SUBDOMAIN.match(name)
    spec = rs["spec"]
    assert len(spec["driver"]) <= 63
    assert DNS_SUBDOMAIN.match(spec["driver"])
    assert len(spec["pool"]["name"]) <= 253
    assert spec["pool"]["generation"] >= 0
    devices = spec["devices"]
    tainted = any("taints" in d for d in devices)
    assert 1 <= len(devices) <= (64 if tainted else 128)
    for d in devices:
        assert DNS_LABEL.match(d["name"]), d["name"]
        attrs, caps = d.get("attributes", {}), d.get("capacity", {})
        assert len(attrs) + len(caps) <= 32
        for key, value in attrs.items():
            # the driver's own names, or fully qualified ones (<DNS subdomain>/<C identifier>)
            domain, _, short = key.rpartition("/")
            assert C_IDENTIFIER.match(short)
            assert not domain or (len(domain) <= 63 and DNS_SUBDOMAIN.match(domain)), key
            ((kind, v),) = value.items()
            if kind == "string":
                assert len(v) <= 64
            elif kind == "version":
                assert len(v) <= 64
                assert SEMVER.match(v), v
            else:
                assert kind in ("int", "bool")
        for key, value in caps.items():
            assert C_IDENTIFIER.match(key)
            assert QUANTITY.match(value["value"])
            if "requestPolicy" in value:
                assert d.get("allowMultipleAllocations") is True
                assert_valid_policy(value["value"], value["requestPolicy"])
        assert len(d.get("taints", [])) <= 4
        for taint in d.get("taints", []):
            assert taint["effect"] in ("NoSchedule", "NoExecute", "None")
            assert LABEL_VALUE.match(taint.get("value", ""))


def assert_valid_policy(capacity: str, policy: dict[str, Any]) -> None:
    """A validRange policy as the apiserver checks it: a default, min <= default, max and every
    step within the capacity, default and max whole steps from min."""
    r = policy["validRange"]
    values = [capacity, policy["default"], r["min"], r.get("max", capacity), r.get("step", "1")]
    cap, default, low, high, step = (quantity(v) or 0 for v in values)
    assert 0 < low <= default <= high <= cap
    assert step > 0
    assert low + step <= cap or "step" not in r
    assert (default - low) % step == 0
    assert (high - low) % step == 0


@st.composite
def inventories(draw: st.DrawFn) -> list[Device]:
    n = draw(st.integers(min_value=0, max_value=140))
    ids = draw(st.lists(st.text(min_size=1, max_size=80), min_size=n, max_size=n, unique=True))
    devices = []
    for i, dev_id in enumerate(ids):
        peer = ids[draw(st.integers(0, n - 1))]
        devices.append(
            Device(
                id=dev_id,
                uuid=draw(st.text(max_size=70)),
                index=i,
                kind=draw(st.sampled_from(["gpu", "ppu", "other"])),
                model=draw(st.text(max_size=70)),
                memory_bytes=draw(st.integers(0, 1 << 44)),
                numa_node=draw(st.integers(-1, 3)),
                links=(Link(peer, draw(st.sampled_from(["nvlink", "pcie_switch"]))),),
                healthy=draw(st.booleans()),
                reason=draw(st.text(max_size=70)),
                binding=draw(st.sampled_from(["driver", "vfio"])),
            )
        )
    return devices


@settings(max_examples=40, deadline=None)
@given(
    devices=inventories(),
    node=st.from_regex(DNS_SUBDOMAIN, fullmatch=True).filter(lambda s: len(s) <= 253),
    version=st.text(max_size=80),
)
def test_every_slice_is_valid(devices: list[Device], node: str, version: str) -> None:
    facts = NodeFacts(node=node, driver_version=version, runtime_version=version)
    slices = resource_slices(devices, facts)
    for rs in slices:
        assert_valid(rs)
    published = [d for d in devices if d.kind in ("gpu", "ppu") and d.binding == "driver"]
    names = [d["name"] for rs in slices for d in rs["spec"]["devices"]]
    assert len(names) == len(published)
    assert len(set(names)) == len(names)
    assert len({rs["metadata"]["name"] for rs in slices}) == len(slices)
    assert names == [device_names(published)[d.id] for d in published]


def _mig_gpu(i: int, **kw: Any) -> Device:
    return Device(
        id=f"gpu-{i}",
        index=i,
        memory_bytes=80 * GIB,
        partition_modes=frozenset({"mig", "tdm"}),
        **kw,
    )


def test_dynamic_partitions_offer_every_mig_instance_on_one_counter_set_per_gpu() -> None:
    facts = replace(FACTS, partitions=DYNAMIC)
    listed = offers([_mig_gpu(0)], DYNAMIC)
    assert [(o.name, o.kind, o.profile) for o in listed][:3] == [
        ("gpu-0", "whole", ""),
        ("gpu-0-mig-1g-10gb-0", "mig", "1g.10gb"),
        ("gpu-0-mig-1g-10gb-1", "mig", "1g.10gb"),
    ]
    per_profile: dict[str, int] = {}
    for o in listed[1:]:
        per_profile[o.profile] = per_profile.get(o.profile, 0) + 1
    assert per_profile == {"1g.10gb": 7, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1}
    devices, counters = resource_slices([_mig_gpu(0)], facts)
    assert counters["spec"]["sharedCounters"] == [
        {
            "name": "gpu-0-counters",
            "counters": {"compute-slices": {"value": "7"}, "memory": {"value": "80Gi"}},
        }
    ]
    assert "devices" not in counters["spec"]
    assert "sharedCounters" not in devices["spec"]
    by_name = {d["name"]: d for d in devices["spec"]["devices"]}
    whole = by_name["gpu-0"]
    assert whole["allowMultipleAllocations"] is True
    assert whole["attributes"]["partitionMode"] == {"string": "dynamic"}
    assert whole["consumesCounters"][0]["counters"] == {
        "compute-slices": {"value": "7"},
        "memory": {"value": "80Gi"},
    }
    four = by_name["gpu-0-mig-4g-40gb-0"]
    assert four["attributes"]["type"] == {"string": "mig"}
    assert four["attributes"]["profile"] == {"string": "4g.40gb"}
    assert four["attributes"]["runtimeDeviceID"] == {"string": "gpu-0"}
    assert four["capacity"] == {"memory": {"value": "40Gi"}}
    assert "allowMultipleAllocations" not in four


def test_what_is_published_on_demand_does_not_change_when_a_partition_is_made() -> None:
    facts = replace(FACTS, partitions=DYNAMIC)
    made = _mig_gpu(
        0, partition_mode="mig", partitions=(Partition("gpu-0-mig-3g.40gb-0", "3g.40gb", 40 * GIB),)
    )
    assert resource_slices([made], facts) == resource_slices([_mig_gpu(0)], facts)
    # ... while under static the GPU is its partitions
    (rs,) = resource_slices([made], FACTS)
    assert [d["attributes"]["partitionID"] for d in rs["spec"]["devices"]] == [
        {"string": "gpu-0-mig-3g.40gb-0"}
    ]


def test_tdm_on_demand_on_a_gpu_without_mig_and_nothing_on_demand_for_ppus_or_vfio() -> None:
    tdm_only = Device(id="gpu-0", memory_bytes=40 * GIB, partition_modes=frozenset({"tdm"}))
    ppu = Device(id="ppu-0", index=1, kind="ppu", memory_bytes=96 * GIB)
    vfio = replace(_mig_gpu(2), binding="vfio")
    plain = Device(id="gpu-3", index=3, memory_bytes=80 * GIB)
    listed = offers([tdm_only, ppu, vfio, plain], DYNAMIC)
    assert [(o.name, o.percent) for o in listed] == [
        ("gpu-0", 0),
        *((f"gpu-0-tdm-25-{i}", 25) for i in range(4)),
        *((f"gpu-0-tdm-50-{i}", 50) for i in range(2)),
        ("ppu-0", 0),
        ("gpu-3", 0),
    ]
    assert [o.counter_set for o in listed if o.device.id != "gpu-0"] == ["", ""]


def test_many_gpus_on_demand_split_into_slices_within_the_apis_limits() -> None:
    facts = replace(FACTS, partitions=DYNAMIC)
    slices = resource_slices([_mig_gpu(i) for i in range(10)], facts)
    device_slices = [s for s in slices if "devices" in s["spec"]]
    counter_slices = [s for s in slices if "sharedCounters" in s["spec"]]
    assert [len(s["spec"]["devices"]) for s in device_slices] == [64, 64, 22]
    assert [len(s["spec"]["sharedCounters"]) for s in counter_slices] == [8, 2]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {5}
    assert len({s["metadata"]["name"] for s in slices}) == 5


def test_a_layouts_unhealthy_partition_alone_is_tainted() -> None:
    parts = (
        Partition("gpu-0-tdm-0", "tdm-50", 40 * GIB, time_percent=50),
        Partition("gpu-0-tdm-1", "tdm-50", 40 * GIB, time_percent=50, healthy=False, reason="Xid"),
    )
    gpu = Device(id="gpu-0", memory_bytes=80 * GIB, partition_mode="tdm", partitions=parts)
    (rs,) = resource_slices([gpu], FACTS)
    taints = {
        d["attributes"]["partitionID"]["string"]: d.get("taints") for d in rs["spec"]["devices"]
    }
    assert taints["gpu-0-tdm-0"] is None
    assert taints["gpu-0-tdm-1"] == [
        {"key": "lj-runtimekit.aliyun.com/unhealthy", "effect": "NoSchedule", "value": "Xid"}
    ]
    assert {d["attributes"]["type"]["string"] for d in rs["spec"]["devices"]} == {"tdm"}


def test_the_standard_pcie_root_attribute_when_the_runtime_names_a_valid_root() -> None:
    devices = [
        Device(id="gpu-0", memory_bytes=80 * GIB, pcie_root="pci0000:00"),
        Device(id="gpu-1", index=1, memory_bytes=80 * GIB, pcie_root="not a root"),
        Device(id="gpu-2", index=2, memory_bytes=80 * GIB),
    ]
    (rs,) = resource_slices(devices, FACTS)
    roots = {
        d["name"]: d["attributes"].get("resource.kubernetes.io/pcieRoot")
        for d in rs["spec"]["devices"]
    }
    assert roots == {"gpu-0": {"string": "pci0000:00"}, "gpu-1": None, "gpu-2": None}


def test_the_nodes_topology_labels_are_attributes_of_every_device(
    eight_gpus: list[Device],
) -> None:
    facts = replace(
        FACTS, topology={"network.topology/block": "b1", "network.topology/rack": "x" * 65}
    )
    (rs,) = resource_slices(eight_gpus, facts)
    for d in rs["spec"]["devices"]:
        assert d["attributes"]["network.topology/block"] == {"string": "b1"}
        # longer than an attribute string may be: left out, never a slice the apiserver refuses
        assert "network.topology/rack" not in d["attributes"]
    assert_valid(rs)
