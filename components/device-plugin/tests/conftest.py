"""Shared test data of the device plugin: small inventories built in code."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from lj_runtimekit_device_plugin.model import GIB, Device, Link, Partition


def nvlink_node(n: int = 8, island: int = 4, memory_gib: int = 80) -> list[Device]:
    """``n`` GPUs in NVLink islands of ``island``, two per PCIe switch, half per NUMA node."""
    devices = []
    for i in range(n):
        base = i - i % island
        links = [Link(f"gpu-{j}", "nvlink", 300.0) for j in range(base, base + island) if j != i]
        links.append(Link(f"gpu-{i ^ 1}", "pcie_switch", 32.0))
        devices.append(
            Device(
                id=f"gpu-{i}",
                uuid=f"GPU-{i:04d}",
                index=i,
                model="A100",
                memory_bytes=memory_gib * GIB,
                numa_node=0 if i < n // 2 else 1,
                links=tuple(links),
            )
        )
    return devices


def mig_tdm_node() -> list[Device]:
    """gpu-0 MIG (two 1g.10gb, one 3g.40gb), gpu-1 TDM (two slices), gpu-2 plain."""
    mig = Device(
        id="gpu-0",
        index=0,
        memory_bytes=80 * GIB,
        partition_mode="mig",
        partitions=(
            Partition("gpu-0-mig-1g.10gb-0", "1g.10gb", 10 * GIB),
            Partition("gpu-0-mig-1g.10gb-1", "1g.10gb", 10 * GIB),
            Partition("gpu-0-mig-3g.40gb-0", "3g.40gb", 40 * GIB),
        ),
    )
    tdm = Device(
        id="gpu-1",
        index=1,
        memory_bytes=80 * GIB,
        partition_mode="tdm",
        partitions=(
            Partition("gpu-1-tdm-50-0", "tdm-50", time_percent=50),
            Partition("gpu-1-tdm-50-1", "tdm-50", time_percent=50),
        ),
    )
    return [mig, tdm, Device(id="gpu-2", index=2, memory_bytes=80 * GIB)]


@pytest.fixture
def eight_gpus() -> list[Device]:
    return nvlink_node(8)


@pytest.fixture
def sixteen_gpus() -> list[Device]:
    return nvlink_node(16, island=8)


@pytest.fixture
def mig_tdm() -> list[Device]:
    return mig_tdm_node()


@pytest.fixture
def kubelet_dir() -> Iterator[Path]:
    """A short directory for the plugin's and a kubelet's unix sockets (pytest's tmp_path can be
    longer than a socket path may be), removed afterwards."""
    made = Path(tempfile.mkdtemp(prefix="ljkub-"))
    try:
        yield made
    finally:
        shutil.rmtree(made, ignore_errors=True)
