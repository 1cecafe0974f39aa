"""GPUs bound to vfio-pci, without sockets: what is advertised where, what a container gets,
what the labels and NodeDevices say, and how a Runtime's binding is read."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lj_runtimekit_device_plugin.deviceplugin.vfio import VfioUnavailable, env_names, injection
from lj_runtimekit_device_plugin.errors import ConfigError, PermanentError
from lj_runtimekit_device_plugin.model import GIB, Device, RuntimeInfo
from lj_runtimekit_device_plugin.nodedevices import labels, status
from lj_runtimekit_device_plugin.resources import ResourceNames, advertise, capacity, device_of
from lj_runtimekit_device_plugin.runtime import device_from_proto
from lj_runtimekit_device_plugin.settings import load
from lj_runtimekit_interface.runtime.v1 import device_pb2

NAMES = ResourceNames()
PREFIX = "lj-runtimekit.aliyun.com/"
EIGHT = [Device(id=f"gpu-{i}", index=i, memory_bytes=80 * GIB) for i in range(8)]


def _bind(devices: list[Device], ids: set[str], binding: str = "vfio") -> list[Device]:
    """The devices with ``ids`` bound as the Runtime reports a vfio-bound GPU."""
    return [
        dataclasses.replace(
            d,
            binding=binding,
            device_nodes=(f"/dev/vfio/{16 + d.index}",),
            pci_bus_id=f"0000:{d.index:02x}:00.0",
        )
        if d.id in ids
        else dataclasses.replace(d, pci_bus_id=f"0000:{d.index:02x}:00.0")
        for d in devices
    ]


def test_two_vfio_gpus_of_eight_leave_six_gpus_and_their_shares(eight_gpus: list[Device]) -> None:
    adv = advertise(_bind(eight_gpus, {"gpu-6", "gpu-7"}), NAMES)
    assert capacity(adv) == {
        NAMES.gpu: 6,
        NAMES.gpu_core: 600,
        NAMES.gpu_memory: 6 * 80,
        NAMES.gpu_vfio: 2,
    }
    assert [u.id for u in adv[NAMES.gpu_vfio]] == ["gpu-6", "gpu-7"]
    driver_units = {
        device_of(u.id) for n in (NAMES.gpu, NAMES.gpu_core, NAMES.gpu_memory) for u in adv[n]
    }
    assert not driver_units & {"gpu-6", "gpu-7"}


def test_a_node_without_vfio_gpus_advertises_no_vfio_resource(eight_gpus: list[Device]) -> None:
    assert NAMES.gpu_vfio not in advertise(eight_gpus, NAMES)


@pytest.mark.parametrize(
    ("names", "binding", "vfio_resource"),
    [
        (ResourceNames(enabled=frozenset({"gpu", "gpu-core"})), "vfio", None),
        (ResourceNames(gpu_vfio="example.com/passthrough"), "vfio", "example.com/passthrough"),
        (NAMES, "unknown", None),
    ],
    ids=["vfio-kind-off", "renamed", "unknown-binding-advertised-nowhere"],
)
def test_where_a_bound_gpu_goes(
    eight_gpus: list[Device], names: ResourceNames, binding: str, vfio_resource: str | None
) -> None:
    adv = advertise(_bind(eight_gpus, {"gpu-0"}, binding), names)
    driver = {names.gpu, names.gpu_core, names.gpu_memory}
    on_driver = {device_of(u.id) for n in driver for u in adv.get(n, ())}
    assert on_driver == {f"gpu-{i}" for i in range(1, 8)}
    assert set(adv) - driver == ({vfio_resource} if vfio_resource else set())
    if vfio_resource:
        assert [u.id for u in adv[vfio_resource]] == ["gpu-0"]


@settings(max_examples=60, deadline=None)
@given(
    bound=st.sets(st.integers(0, 7)),
    unhealthy=st.sets(st.integers(0, 7)),
)
def test_a_vfio_gpu_is_one_unit_of_its_own_resource_and_nothing_else(
    bound: set[int], unhealthy: set[int]
) -> None:
    devices = [
        dataclasses.replace(d, healthy=d.index not in unhealthy)
        for d in _bind(EIGHT, {f"gpu-{i}" for i in bound})
    ]
    adv = advertise(devices, NAMES)
    vfio_units = adv.get(NAMES.gpu_vfio, ())
    assert sorted(u.id for u in vfio_units) == sorted(f"gpu-{i}" for i in bound)
    assert all(u.healthy == (int(u.id[4:]) not in unhealthy) for u in vfio_units)
    others = {device_of(u.id) for n, units in adv.items() if n != NAMES.gpu_vfio for u in units}
    assert others == {f"gpu-{i}" for i in range(8)} - {f"gpu-{i}" for i in bound}


def test_env_names_follow_kubevirt_and_a_shell_safe_spelling() -> None:
    # KubeVirt's virt-launcher upper-cases and turns only "/" and "." into "_"
    assert env_names("aliyun.com/gpu-vfio") == (
        "PCI_RESOURCE_ALIYUN_COM_GPU-VFIO",
        "PCI_RESOURCE_ALIYUN_COM_GPU_VFIO",
    )
    assert env_names("nvidia.com/GA100_A100") == ("PCI_RESOURCE_NVIDIA_COM_GA100_A100",)


def test_a_container_gets_the_vfio_nodes_and_the_pci_addresses(eight_gpus: list[Device]) -> None:
    devices = _bind(eight_gpus, {"gpu-6", "gpu-7"})
    inj = injection(NAMES.gpu_vfio, devices, ["gpu-7", "gpu-6"])
    assert [h for _, h, _ in inj.device_nodes] == ["/dev/vfio/vfio", "/dev/vfio/23", "/dev/vfio/22"]
    assert all(c == h for c, h, _ in inj.device_nodes)
    assert dict(inj.envs) == {
        "PCI_RESOURCE_ALIYUN_COM_GPU-VFIO": "0000:07:00.0,0000:06:00.0",
        "PCI_RESOURCE_ALIYUN_COM_GPU_VFIO": "0000:07:00.0,0000:06:00.0",
    }
    assert not inj.annotations
    assert not inj.mounts


@pytest.mark.parametrize(
    ("unit", "words"),
    [
        ("gpu-1", "bound to driver"),
        ("gpu-9", "not listed by the Runtime"),
        ("gpu-5", "no /dev/vfio"),
    ],
    ids=["unbound-meanwhile", "gone", "no-group-node"],
)
def test_a_unit_that_is_no_longer_a_vfio_gpu_is_refused(
    eight_gpus: list[Device], unit: str, words: str
) -> None:
    devices = _bind(eight_gpus, {"gpu-6", "gpu-5"})
    devices = [dataclasses.replace(d, device_nodes=()) if d.id == "gpu-5" else d for d in devices]
    with pytest.raises(VfioUnavailable, match=words) as err:
        injection(NAMES.gpu_vfio, devices, ["gpu-6", unit])
    assert isinstance(err.value, PermanentError)  # the kubelet is told FAILED_PRECONDITION


@pytest.mark.parametrize(
    ("number", "binding"),
    [
        (device_pb2.DEVICE_BINDING_UNSPECIFIED, "driver"),
        (device_pb2.DEVICE_BINDING_DRIVER, "driver"),
        (device_pb2.DEVICE_BINDING_VFIO, "vfio"),
        (9, "unknown"),
    ],
    ids=["older-runtime", "driver", "vfio", "newer-value"],
)
def test_the_runtimes_binding_is_read_once_at_the_edge(number: int, binding: str) -> None:
    d = device_from_proto(device_pb2.Device(id="gpu-0", binding=number))  # type: ignore[arg-type]
    assert d.binding == binding


def test_labels_count_the_vfio_gpus(eight_gpus: list[Device]) -> None:
    got = labels(_bind(eight_gpus, {"gpu-6", "gpu-7"}), RuntimeInfo("v1.14.0"))
    assert got[PREFIX + "vfio.count"] == "2"
    assert got[PREFIX + "count"] == "8"
    assert labels(eight_gpus, RuntimeInfo("v1.13.0"))[PREFIX + "vfio.count"] == "0"


def test_nodedevices_shows_each_devices_binding(eight_gpus: list[Device]) -> None:
    devices = _bind(eight_gpus, {"gpu-3"})
    devices[4] = dataclasses.replace(devices[4], binding="unknown")
    got = [d["binding"] for d in status(devices, RuntimeInfo("v1.14.0"))["devices"]]
    assert got == ["DRIVER"] * 3 + ["VFIO", "OTHER"] + ["DRIVER"] * 3


def test_the_vfio_resource_name_is_a_setting_like_the_others(tmp_path: Path) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text("version: v1\nresource_gpu_vfio: example.com/gpu-passthrough\n")
    s = load(["--config", str(cfg)], {"NODE_NAME": "n1"})
    assert s.resource_name("gpu-vfio") == "example.com/gpu-passthrough"
    env = {"NODE_NAME": "n1", "LJ_RUNTIMEKIT_DEVICE_PLUGIN_RESOURCE_GPU_VFIO": "a.com/b"}
    assert load([], env).resource_gpu_vfio == "a.com/b"
    assert load(["--resource-gpu-vfio", "c.com/d"], env).resource_gpu_vfio == "c.com/d"
    with pytest.raises(ConfigError, match="resource names must differ"):
        load(["--resource-gpu-vfio", "aliyun.com/gpu"], {"NODE_NAME": "n1"})
