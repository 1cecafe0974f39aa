"""Device.pcie_root of the simulator: the root complex above each device, one per NUMA node of
its PCI domain unless the inventory names it; empty without a bus id or NUMA node."""

from __future__ import annotations

from lj_runtimekit_interface.runtime.v1 import device_pb2 as pb
from lj_runtimekit_testkit.simulator.clients import RuntimeClients
from lj_runtimekit_testkit.simulator.inventory_file import pcie_root_of


async def test_each_gpu_names_the_root_complex_of_its_numa_node(clients: RuntimeClients) -> None:
    devices = (await clients.device.ListDevices(pb.ListDevicesRequest())).devices
    roots = {d.id: d.pcie_root for d in devices}
    assert {roots[f"gpu-{i}"] for i in range(4)} == {"pci0000:00"}
    assert {roots[f"gpu-{i}"] for i in range(4, 8)} == {"pci0000:80"}


def test_the_derived_root_needs_a_bus_id_and_a_numa_node() -> None:
    assert pcie_root_of("0001:3a:00.0", 1) == "pci0001:80"
    assert pcie_root_of("", 0) == ""
    assert pcie_root_of("0000:3a:00.0", -1) == ""
    assert pcie_root_of(None, 0) == ""
