"""GetPreferredAllocation: islands first, least fragmentation, must-include honoured."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lj_runtimekit_device_plugin.model import Device, Link
from lj_runtimekit_device_plugin.topology import (
    first_fit,
    fragmentation,
    preferred,
    topology,
)


def test_two_gpus_come_from_one_nvlink_island_and_one_switch(eight_gpus: list[Device]) -> None:
    topo = topology(eight_gpus)
    ids = [d.id for d in eight_gpus]
    got = preferred(topo, ids, [], 2)
    assert len({topo.island[i] for i in got}) == 1
    assert len({topo.switch[i] for i in got}) == 1


def test_best_fit_island_keeps_the_full_island_free(eight_gpus: list[Device]) -> None:
    topo = topology(eight_gpus)
    # island 0 has 2 free (gpu-0, gpu-1), island 1 has all 4 free
    free = ["gpu-0", "gpu-1", "gpu-4", "gpu-5", "gpu-6", "gpu-7"]
    assert sorted(preferred(topo, free, [], 2)) == ["gpu-0", "gpu-1"]


def test_must_include_pulls_the_choice_into_its_island(eight_gpus: list[Device]) -> None:
    topo = topology(eight_gpus)
    ids = [d.id for d in eight_gpus]
    got = preferred(topo, ids, ["gpu-6"], 2)
    assert "gpu-6" in got
    assert got == ["gpu-6", "gpu-7"]


def test_request_spanning_islands_takes_whole_islands(eight_gpus: list[Device]) -> None:
    topo = topology(eight_gpus)
    got = preferred(topo, [d.id for d in eight_gpus], [], 6)
    islands = [topo.island[i] for i in got]
    assert sorted(islands).count(islands[0]) in (2, 4)
    assert len(got) == 6


@st.composite
def random_nodes(draw: st.DrawFn) -> list[Device]:
    n = draw(st.integers(1, 16))
    island_of = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    switch_of = draw(st.lists(st.integers(0, 7), min_size=n, max_size=n))
    numa_of = draw(st.lists(st.integers(-1, 1), min_size=n, max_size=n))
    devices = []
    for i in range(n):
        links = [
            Link(f"gpu-{j}", "nvlink") for j in range(n) if j != i and island_of[j] == island_of[i]
        ]
        links += [
            Link(f"gpu-{j}", "pcie_switch")
            for j in range(n)
            if j != i and switch_of[j] == switch_of[i]
        ]
        devices.append(Device(id=f"gpu-{i}", index=i, numa_node=numa_of[i], links=tuple(links)))
    return devices


@settings(max_examples=200, deadline=None)
@given(random_nodes(), st.data())
def test_choice_is_available_unique_and_honours_must_include(
    devices: list[Device], data: st.DataObject
) -> None:
    ids = [d.id for d in devices]
    available = data.draw(st.lists(st.sampled_from(ids), unique=True))
    must = data.draw(st.lists(st.sampled_from(available), unique=True)) if available else []
    size = data.draw(st.integers(len(must), max(len(must), len(available))))
    got = preferred(topology(devices), available, must, size)
    assert set(got) <= set(available)
    assert set(must) <= set(got)
    assert len(got) == len(set(got)) == min(size, len(available))


def _run_sequence(devices: list[Device], seed: int, choose: str) -> float:
    """Random allocate/free sequence; the mean fragmentation of the free devices."""
    topo = topology(devices)
    rng = random.Random(seed)
    free = [d.id for d in devices]
    held: list[list[str]] = []
    total = 0.0
    for _ in range(30):
        if held and (rng.random() < 0.4 or not free):
            for i in held.pop(rng.randrange(len(held))):
                free.append(i)
        else:
            size = rng.choice([1, 1, 2, 2, 4])
            if size > len(free):
                continue
            pick = (
                preferred(topo, free, [], size) if choose == "ours" else first_fit(topo, free, size)
            )
            held.append(pick)
            free = [i for i in free if i not in pick]
        total += fragmentation(topo, free)
    return total


@pytest.mark.parametrize("n", [8, 16], ids=["8-gpus", "16-gpus"])
def test_fragmentation_ratio_over_random_sequences(n: int) -> None:
    rng = random.Random(n)
    ours = naive = 0.0
    for seed in range(50):
        islands = [rng.randrange(4) for _ in range(n)]
        devices = [
            Device(
                id=f"gpu-{i}",
                index=i,
                links=tuple(
                    Link(f"gpu-{j}", "nvlink")
                    for j in range(n)
                    if j != i and islands[j] == islands[i]
                ),
            )
            for i in range(n)
        ]
        ours += _run_sequence(devices, seed, "ours")
        naive += _run_sequence(devices, seed, "first")
    print(f"fragmentation ours/first-fit on {n} GPUs: {ours / max(naive, 1e-9):.3f}")
    assert ours <= naive
