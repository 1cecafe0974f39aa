import contextlib
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lj_runtimekit_scheduler import gpu, objects, quantity
from lj_runtimekit_scheduler.model import DeviceRequest


def container(name: str, **req: str) -> dict[str, Any]:
    return {"name": name, "resources": {"requests": req}}


@pytest.mark.parametrize(
    ("spec", "cpu", "memory"),
    [
        (
            {"containers": [container("a", cpu="1", memory="1Gi"), container("b", cpu="500m")]},
            1500,
            2**30,
        ),
        (
            {
                "containers": [container("a", cpu="1")],
                "initContainers": [container("i", cpu="3", memory="1Mi")],
            },
            3000,
            2**20,
        ),
        ({"containers": [container("a", cpu="1")], "overhead": {"cpu": "250m"}}, 1250, 0),
        (
            {
                "containers": [container("a", cpu="1")],
                "initContainers": [
                    {**container("side", cpu="1"), "restartPolicy": "Always"},
                    container("i", cpu="1500m"),
                ],
            },
            2500,
            0,
        ),
    ],
    ids=["sum-of-containers", "init-max", "overhead", "sidecar-plus-init"],
)
def test_effective_requests_count_as_kube_scheduler(
    spec: dict[str, Any], cpu: int, memory: int
) -> None:
    r = objects.effective_requests(spec)
    assert r.get("cpu", 0) == cpu
    assert r.get("memory", 0) == memory
    assert r["pods"] == 1


@pytest.mark.parametrize(
    ("text", "milli", "value"),
    [
        ("500m", True, 500),
        ("2", True, 2000),
        ("4Gi", False, 4 * 2**30),
        ("1k", False, 1000),
        ("1e3", False, 1000),
        ("0.5", False, 1),
        ("100M", False, 10**8),
    ],
    ids=["milli", "cores", "Gi", "k", "exp", "round-up", "M"],
)
def test_quantities(text: str, milli: bool, value: int) -> None:
    assert quantity.parse(text, milli) == value


@given(st.text(max_size=12))
def test_quantity_parser_never_crashes_on_garbage(text: str) -> None:
    with contextlib.suppress(ValueError):
        quantity.parse(text)


def test_unsupported_features_are_named() -> None:
    raw = {
        "metadata": {"uid": "u", "name": "p"},
        "spec": {
            "containers": [],
            "resourceClaims": [{"name": "gpu"}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
        },
    }
    p = objects.pod(raw)
    # the claim of a volume is scheduled (VolumeBinding): only the pod's own DRA claims are named
    assert p.unsupported == ("dynamic resource allocation (spec.resourceClaims)",)


def test_inter_pod_affinity_and_topology_spread_are_placed_not_refused() -> None:
    """Issue 35: kube-scheduler's InterPodAffinity and PodTopologySpread are plugins here."""
    term = {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "zone"}
    required = {"requiredDuringSchedulingIgnoredDuringExecution": [term]}
    raw = {
        "metadata": {"uid": "u", "name": "p", "namespace": "ns", "labels": {"app": "web"}},
        "spec": {
            "containers": [],
            "topologySpreadConstraints": [
                {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}
            ],
            "affinity": {"podAffinity": required, "podAntiAffinity": required},
        },
    }
    p = objects.pod(raw)
    assert p.unsupported == ()
    assert len(p.spread) == 1
    assert p.spread[0].hard
    assert p.affinity.required[0].namespaces == frozenset({"ns"})
    assert p.affinity.required_anti[0].topology_key == "zone"


@pytest.mark.parametrize(
    ("spec", "names"),
    [
        ({"topologySpreadConstraints": [{}]}, "spec.topologySpreadConstraints[0].maxSkew"),
        (
            {
                "affinity": {
                    "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{}]}
                }
            },
            "spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0]"
            ".topologyKey",
        ),
    ],
    ids=["spread-without-max-skew", "anti-affinity-without-topology-key"],
)
def test_a_malformed_spread_or_affinity_is_refused_naming_the_field(
    spec: dict[str, object], names: str
) -> None:
    # the apiserver would not have accepted either: the feed skips the object, naming it
    with pytest.raises(ValueError, match=re.escape(names)):
        objects.pod({"metadata": {"uid": "u", "name": "p"}, "spec": {"containers": [], **spec}})


def test_a_pod_of_a_pod_group_names_its_group_and_one_of_an_unknown_group_kind_waits() -> None:
    """A PodGroup's pods are placed as their group says (issue 35), no longer refused; a
    ``schedulingGroup`` naming no PodGroup (a newer kind of group) cannot be honoured."""
    spec = {"containers": [], "schedulingGroup": {"podGroupName": "trainer-0"}}
    p = objects.pod({"metadata": {"uid": "u", "name": "p"}, "spec": spec})
    assert p.unsupported == ()
    assert p.scheduling_group == "trainer-0"
    spec = {"containers": [], "schedulingGroup": {"compositePodGroupName": "c"}}
    odd = objects.pod({"metadata": {"uid": "u", "name": "p"}, "spec": spec})
    assert odd.unsupported == ("a scheduling group other than a PodGroup (spec.schedulingGroup)",)
    assert odd.scheduling_group == ""
    lone = objects.pod({"metadata": {"uid": "u", "name": "p"}, "spec": {"containers": []}})
    assert lone.unsupported == ()
    assert lone.scheduling_group == ""


@pytest.mark.parametrize(
    ("spec", "min_count", "whole", "topology"),
    [
        ({"schedulingPolicy": {"gang": {"minCount": 4}}}, 4, True, None),
        ({"schedulingPolicy": {"basic": {}}}, 0, False, None),
        ({"schedulingPolicy": {"basic": {}}, "disruptionMode": {"all": {}}}, 0, True, None),
        (
            {
                "schedulingPolicy": {"gang": {"minCount": 2}},
                "schedulingConstraints": {"topology": [{"key": "rack"}]},
            },
            2,
            True,
            "rack",
        ),
    ],
    ids=["gang", "basic", "basic-disrupted-whole", "gang-in-one-rack"],
)
def test_pod_group_reads_policy_min_count_and_topology(
    spec: dict[str, Any], min_count: int, whole: bool, topology: str | None
) -> None:
    raw = {"metadata": {"name": "g", "namespace": "ns"}, "spec": spec}
    group = objects.pod_group(raw)
    assert (group.key, group.min_count, group.gang) == ("ns/g", min_count, min_count > 0)
    assert (group.evicted_whole, group.topology, group.scheduled) == (whole, topology, False)


@pytest.mark.parametrize(
    "policy",
    [{}, {"gang": {"minCount": 2}, "basic": {}}, {"gang": {"minCount": 0}}, {"gang": {}}],
    ids=["none", "both", "zero", "no-min-count"],
)
def test_a_pod_group_the_apiserver_would_refuse_is_malformed(policy: dict[str, Any]) -> None:
    raw = {"metadata": {"name": "g"}, "spec": {"schedulingPolicy": policy}}
    with pytest.raises((ValueError, KeyError)):
        objects.pod_group(raw)


def test_a_pod_group_scheduled_once_says_so() -> None:
    cond = {"type": "PodGroupInitiallyScheduled", "status": "True", "reason": "Scheduled"}
    raw = {
        "metadata": {"name": "g"},
        "spec": {"schedulingPolicy": {"gang": {"minCount": 2}}},
        "status": {"conditions": [cond]},
    }
    assert objects.pod_group(raw).scheduled


def test_device_requests_per_container() -> None:
    raw = {
        "metadata": {"uid": "u", "name": "p"},
        "spec": {
            "containers": [
                {
                    "name": "a",
                    "resources": {
                        "limits": {"aliyun.com/gpu-core": "30", "aliyun.com/gpu-memory": "8"}
                    },
                },
                {"name": "b", "resources": {"limits": {"aliyun.com/gpu": "2"}}},
                {"name": "c"},
            ]
        },
    }
    p = objects.pod(raw)
    assert [(d.container, d.gpus, d.core, d.memory_gib) for d in p.devices] == [
        ("a", 0, 30, 8),
        ("b", 2, 0, 0),
    ]


def test_partitioned_gpus_become_the_partitions_advertised_as_whole_gpus() -> None:
    gib = 2**30

    def dev(i: int, mode: str, parts: list[dict[str, object]]) -> dict[str, object]:
        return {
            "id": f"gpu-{i}", "index": i, "kind": "GPU", "memoryBytes": 80 * gib,
            "healthy": True, "numaNode": 0, "nvlinkIsland": 0,
            "partitionMode": mode, "partitions": parts,
        }  # fmt: skip

    raw = {
        "metadata": {"name": "n"},
        "status": {
            "devices": [
                dev(0, "MIG", [
                    {"id": "gpu-0-mig-0", "memoryBytes": 40 * gib, "healthy": True,
                     "resource": "aliyun.com/gpu"},
                    {"id": "gpu-0-mig-1", "memoryBytes": 40 * gib, "healthy": False,
                     "resource": "aliyun.com/gpu"},
                ]),
                dev(1, "MIG", [
                    {"id": "gpu-1-mig-0", "memoryBytes": 10 * gib, "healthy": True,
                     "resource": "aliyun.com/gpu-mig-1g.10gb"},
                ]),
                dev(2, "TDM", [{"id": "gpu-2-tdm-0", "memoryBytes": 80 * gib, "healthy": True}]),
                dev(3, "NONE", []),
            ]
        },
    }  # fmt: skip
    node, devices = objects.node_devices(raw)
    assert node == "n"
    assert [(d.id, d.memory_gib, d.healthy, d.partition_of) for d in devices] == [
        ("gpu-0-mig-0", 40, True, "gpu-0"),
        ("gpu-0-mig-1", 40, False, "gpu-0"),
        ("gpu-2-tdm-0", 80, True, "gpu-2"),  # no resource field (older plugin): aliyun.com/gpu
        ("gpu-3", 80, True, ""),
    ]


def test_gpus_bound_to_vfio_are_not_placed_as_whole_gpus() -> None:
    # The device plugin advertises them only as aliyun.com/gpu-vfio: a pod the scheduler put on
    # one would be refused by the kubelet (the unit is not in aliyun.com/gpu).
    def dev(i: int, binding: str | None) -> dict[str, object]:
        d: dict[str, object] = {"id": f"gpu-{i}", "index": i, "memoryBytes": 80 << 30}
        if binding is not None:
            d["binding"] = binding
        d["healthy"] = True
        return d

    raw = {
        "metadata": {"name": "n"},
        "status": {"devices": [dev(0, "DRIVER"), dev(1, "VFIO"), dev(2, None), dev(3, "OTHER")]},
    }
    _, devices = objects.node_devices(raw)
    assert [d.id for d in devices] == ["gpu-0", "gpu-2"]


def test_gpus_fenced_for_a_partition_layout_change_get_no_new_pod() -> None:
    # Issue 39: the GPUs a waiting layout change needs are fenced; the others keep serving.
    def dev(i: int, fenced: str | None) -> dict[str, object]:
        d: dict[str, object] = {"id": f"gpu-{i}", "index": i, "memoryBytes": 80 << 30}
        d["healthy"] = True
        if fenced is not None:
            d["fenced"] = fenced
        return d

    raw = {
        "metadata": {"name": "n"},
        "status": {
            "devices": [dev(0, "fenced for partition layout mig-2"), dev(1, ""), dev(2, None)]
        },
    }
    _, devices = objects.node_devices(raw)
    assert [(d.id, d.healthy) for d in devices] == [
        ("gpu-0", False),
        ("gpu-1", True),
        ("gpu-2", True),
    ]
    # a whole GPU for each of two containers: never the fenced one
    chosen = gpu.choose(devices, {}, [DeviceRequest("a", gpus=1), DeviceRequest("b", gpus=1)])
    given_out = {s.device for _, slices in chosen.containers for s in slices}
    assert given_out == {"gpu-1", "gpu-2"}
