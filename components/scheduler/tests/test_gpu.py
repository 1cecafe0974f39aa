"""GPU choice: table cases for the preferences, hypothesis for the guarantees."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lj_runtimekit_scheduler import gpu
from lj_runtimekit_scheduler.model import Device, DeviceRequest, DeviceUse


def eight(islands: int = 2, mem: int = 80) -> tuple[Device, ...]:
    per = 8 // islands
    return tuple(
        Device(f"gpu-{i}", "GPU", mem, True, numa=i // 4, island=i // per, index=i)
        for i in range(8)
    )


def ids(choice: gpu.Choice) -> list[str]:
    return [s.device for _, slices in choice.containers for s in slices]


def test_four_gpus_land_on_one_nvlink_island() -> None:
    devs = eight()
    uses = {"gpu-0": DeviceUse(whole=True)}  # island 0 has 3 idle, island 1 has 4
    c = gpu.choose(devs, uses, [DeviceRequest("c", gpus=4)])
    assert ids(c) == ["gpu-4", "gpu-5", "gpu-6", "gpu-7"]
    assert gpu.locality(devs, c) == 100


def test_binpack_takes_the_tightest_island_spread_the_roomiest() -> None:
    devs = eight()
    uses = {"gpu-0": DeviceUse(whole=True), "gpu-1": DeviceUse(whole=True)}
    assert ids(gpu.choose(devs, uses, [DeviceRequest("c", gpus=2)], "binpack")) == [
        "gpu-2",
        "gpu-3",
    ]
    assert ids(gpu.choose(devs, uses, [DeviceRequest("c", gpus=2)], "spread")) == ["gpu-4", "gpu-5"]


def test_shared_binpack_fills_a_used_gpu_before_an_idle_one() -> None:
    devs = eight()
    uses = {"gpu-3": DeviceUse(core=50, memory_gib=40)}
    c = gpu.choose(devs, uses, [DeviceRequest("c", core=30, memory_gib=8)], "binpack")
    assert ids(c) == ["gpu-3"]
    c = gpu.choose(devs, uses, [DeviceRequest("c", core=30, memory_gib=8)], "spread")
    assert ids(c) != ["gpu-3"]


def test_shared_slice_never_lands_on_a_whole_gpu_and_names_what_blocked() -> None:
    devs = eight()[:1]
    with pytest.raises(gpu.NoFit, match="gpu-0: 0 core"):
        gpu.choose(devs, {"gpu-0": DeviceUse(whole=True)}, [DeviceRequest("c", core=10)])


def test_unhealthy_gpus_are_never_chosen() -> None:
    devs = tuple(Device(f"gpu-{i}", healthy=i != 1, memory_gib=16, index=i) for i in range(2))
    assert ids(gpu.choose(devs, {}, [DeviceRequest("c", gpus=1)])) == ["gpu-0"]


def test_fragmentation_lowers_the_score() -> None:
    devs = eight()
    packed = {"gpu-0": DeviceUse(core=100, memory_gib=80)}
    scattered = {"gpu-0": DeviceUse(core=50), "gpu-1": DeviceUse(core=50)}
    assert gpu.score(devs, packed, "binpack") > gpu.score(devs, scattered, "binpack")


def test_release_undoes_apply() -> None:
    devs = eight()
    uses = {"gpu-2": DeviceUse(core=20, memory_gib=4)}
    c = gpu.choose(devs, uses, [DeviceRequest("a", gpus=2), DeviceRequest("b", core=30)])
    assert gpu.release(gpu.apply(uses, c), c) == uses


uses_st = st.dictionaries(
    st.sampled_from([f"gpu-{i}" for i in range(8)]),
    st.one_of(
        st.just(DeviceUse(whole=True)),
        st.builds(DeviceUse, st.just(False), st.integers(0, 100), st.integers(0, 80)),
    ),
    max_size=8,
)
req_st = st.lists(
    st.one_of(
        st.builds(DeviceRequest, st.just("c"), gpus=st.integers(1, 8)),
        st.builds(
            DeviceRequest, st.just("c"), core=st.integers(1, 100), memory_gib=st.integers(0, 80)
        ),
    ),
    min_size=1,
    max_size=3,
)


@settings(max_examples=150, deadline=None)
@given(uses_st, req_st, st.sampled_from(["binpack", "spread"]), st.integers(1, 4))
def test_choice_never_overcommits(
    uses: dict[str, DeviceUse], reqs: list[DeviceRequest], strategy: str, islands: int
) -> None:
    devs = eight(islands=[1, 2, 4, 8][islands - 1])
    try:
        c = gpu.choose(devs, uses, reqs, strategy)
    except gpu.NoFit:
        return
    after = gpu.apply(uses, c)
    whole_given = [s.device for _, sl in c.containers for s in sl if s.whole]
    assert len(whole_given) == len(set(whole_given))
    for gid in whole_given:
        before = uses.get(gid, DeviceUse())
        assert not before.whole
        assert (before.core, before.memory_gib) == (0, 0)
    for _, sl in c.containers:
        for s in sl:
            if not s.whole:
                u = after[s.device]
                assert not u.whole
                assert u.core <= 100
                assert u.memory_gib <= 80
    for r, (_, sl) in zip(reqs, c.containers, strict=True):
        assert sum(1 for s in sl if s.whole) == r.gpus
        idle_islands: dict[int, int] = {}
        for d in devs:
            u = uses.get(d.id, DeviceUse())
            if not u.whole and u.core == 0 and u.memory_gib == 0:
                idle_islands[d.island] = idle_islands.get(d.island, 0) + 1
        if r.gpus > 1 and r is reqs[0] and max(idle_islands.values(), default=0) >= r.gpus:
            assert gpu.locality(devs, gpu.Choice((c.containers[0],))) == 100


def mig_node() -> tuple[Device, ...]:
    """As the MIG/TDM sample: gpu-0 in two MIG instances, gpu-1 a TDM slice, gpu-2 whole."""
    return (
        Device("gpu-0-mig-0", "GPU", 40, True, 0, 0, 0, partition_of="gpu-0"),
        Device("gpu-0-mig-1", "GPU", 40, True, 0, 0, 0, partition_of="gpu-0"),
        Device("gpu-1-tdm-0", "GPU", 80, True, 0, 0, 1, partition_of="gpu-1"),
        Device("gpu-2", "GPU", 80, True, 0, 0, 2),
    )


def test_partitions_never_make_up_a_multi_gpu_container() -> None:
    with pytest.raises(gpu.NoFit, match=r"2 whole GPU wanted, 1 idle .*3 idle partitions"):
        gpu.choose(mig_node(), {}, [DeviceRequest("c", gpus=2)])


def test_one_gpu_takes_a_whole_gpu_before_a_partition_then_a_partition() -> None:
    devs = mig_node()
    assert ids(gpu.choose(devs, {}, [DeviceRequest("c", gpus=1)])) == ["gpu-2"]
    held = {"gpu-2": DeviceUse(whole=True)}
    assert ids(gpu.choose(devs, held, [DeviceRequest("c", gpus=1)])) == ["gpu-0-mig-0"]


def test_partitions_are_never_shared() -> None:
    with pytest.raises(gpu.NoFit):
        gpu.choose(mig_node(), {"gpu-2": DeviceUse(whole=True)}, [DeviceRequest("c", core=10)])
