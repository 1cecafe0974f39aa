"""The pure half of release: which allocations no live container holds, and when to free them."""

from __future__ import annotations

import pytest

from lj_runtimekit_device_plugin.model import Allocation, Injection
from lj_runtimekit_device_plugin.reconcile import (
    PROVISIONAL_NAMESPACE,
    Holding,
    Memory,
    PodState,
    decide,
    stale_whole,
)

GPU = "aliyun.com/gpu"
CORE = "aliyun.com/gpu-core"
MEM = "aliyun.com/gpu-memory"
SHARED = frozenset({CORE, MEM})


def _alloc(
    id_: str,
    pod: str,
    devices: tuple[str, ...],
    *,
    resource: str = GPU,
    uid: str = "",
    container: str = "main",
    core: int = 0,
) -> Allocation:
    return Allocation(
        id=id_,
        device_ids=devices,
        injection=Injection(),
        core_percent=core,
        pod=("ns", pod, uid or f"uid-{pod}"),
        container=container,
        resource=resource,
    )


def _held(pod: str, devices: tuple[str, ...], resource: str = GPU) -> Holding:
    return Holding("ns", pod, "main", resource, devices)


def _twice(allocs: list[Allocation], holdings: list[Holding], pods: list[PodState] | None = None):  # type: ignore[no-untyped-def]
    """Two passes, the second past the grace period; the second's decision."""
    first = decide(
        allocs, holdings, pods, now=0.0, grace_s=5.0, memory=Memory(), shared_resources=SHARED
    )
    assert first.release == ()
    return decide(
        allocs,
        holdings,
        pods,
        now=10.0,
        grace_s=5.0,
        memory=first.memory,
        shared_resources=SHARED,
    )


def _released(d) -> list[str]:  # type: ignore[no-untyped-def]
    return sorted(v.allocation.id for v in d.release)


def test_held_allocations_stay_and_unheld_ones_go_at_the_second_pass() -> None:
    allocs = [
        _alloc("a1", "live", ("gpu-0", "gpu-1")),
        _alloc("a2", "gone", ("gpu-2",)),
        _alloc("a3", "shared", ("gpu-3",), resource=CORE, core=30),
    ]
    holdings = [
        _held("live", ("gpu-0", "gpu-1")),
        _held("shared", ("gpu-5::core-1", "gpu-5::core-2"), CORE),
    ]
    assert _released(_twice(allocs, holdings)) == ["a2"]


def test_young_allocation_is_kept_however_unheld() -> None:
    allocs = [_alloc("a1", "new", ("gpu-0",))]
    memory = Memory()
    for now in (0.0, 1.0, 2.0):
        d = decide(allocs, [], None, now=now, grace_s=5.0, memory=memory, shared_resources=SHARED)
        assert d.release == ()
        assert [v.allocation.id for v in d.waiting] == ["a1"]
        memory = d.memory
    d = decide(allocs, [], None, now=6.0, grace_s=5.0, memory=memory, shared_resources=SHARED)
    assert _released(d) == ["a1"]


def test_seen_unheld_once_is_kept_until_a_second_pass_confirms() -> None:
    allocs = [_alloc("a1", "p", ("gpu-0",))]
    old = Memory(first_seen={"a1": -100.0})
    d = decide(allocs, [], None, now=0.0, grace_s=5.0, memory=old, shared_resources=SHARED)
    assert d.release == ()
    # held again in between: the count starts over
    d = decide(
        allocs,
        [_held("p", ("gpu-0",))],
        None,
        now=1.0,
        grace_s=5.0,
        memory=d.memory,
        shared_resources=SHARED,
    )
    d = decide(allocs, [], None, now=2.0, grace_s=5.0, memory=d.memory, shared_resources=SHARED)
    assert d.release == ()


@pytest.mark.parametrize(
    ("pod", "why"),
    [
        (PodState("ns", "p", "uid-new", "Running"), "replaced"),
        (PodState("ns", "p", "uid-p", "Succeeded"), "Succeeded"),
        (PodState("ns", "p", "uid-p", "Failed"), "Failed"),
    ],
    ids=["same-name-other-uid", "succeeded", "failed"],
)
def test_a_replaced_or_ended_pod_does_not_hold_even_if_listed(pod: PodState, why: str) -> None:
    allocs = [_alloc("a1", "p", ("gpu-0",))]
    d = _twice(allocs, [_held("p", ("gpu-0",))], [pod])
    assert _released(d) == ["a1"]
    assert why in d.release[0].reason


def test_a_pod_alive_by_its_list_but_not_yet_listed_by_the_kubelet_keeps_it() -> None:
    """After a kubelet restart pod-resources may not list pods yet: never release on that."""
    allocs = [_alloc("a1", "p", ("gpu-0",))]
    d = _twice(allocs, [], [PodState("ns", "p", "uid-p", "Running")])
    assert d.release == ()
    assert d.waiting == ()


def test_a_container_not_holding_the_devices_does_not_hold_the_allocation() -> None:
    """A retried Allocate left a second allocation for the same container: only the one with
    the devices the kubelet recorded is held."""
    allocs = [_alloc("a1", "p", ("gpu-0",)), _alloc("a2", "p", ("gpu-4",))]
    assert _released(_twice(allocs, [_held("p", ("gpu-0",))])) == ["a2"]


def test_provisional_allocation_is_held_by_whoever_holds_its_devices_and_reowned() -> None:
    prov = Allocation(
        id="a1",
        device_ids=("gpu-2",),
        injection=Injection(),
        pod=(PROVISIONAL_NAMESPACE, "whole-gpu-2", "x"),
        container="unknown",
        resource=GPU,
    )
    pods = [PodState("ns", "p", "uid-p", "Running")]
    d = _twice([prov], [_held("p", ("gpu-2",))], pods)
    assert d.release == ()
    assert [(a.id, pod, c) for a, pod, c in d.reown] == [("a1", ("ns", "p", "uid-p"), "main")]
    # without the pods' uids it is held but cannot be re-owned yet
    assert _twice([prov], [_held("p", ("gpu-2",))]).reown == ()
    assert _released(_twice([prov], [])) == ["a1"]


def test_stale_whole_are_the_same_resource_holders_of_the_handed_out_devices() -> None:
    allocs = [
        _alloc("a1", "old", ("gpu-0", "gpu-1")),
        _alloc("a2", "other", ("gpu-2",)),
        _alloc("a3", "shared", ("gpu-0",), resource=CORE, core=30),
        _alloc("a4", "ppu", ("gpu-0",), resource="alibabacloud.com/ppu"),
    ]
    assert [a.id for a in stale_whole(allocs, GPU, ["gpu-1", "gpu-5"])] == ["a1"]
    assert stale_whole(allocs, GPU, ["gpu-7"]) == []


def test_a_kubelet_that_just_restarted_answering_empty_lists_releases_nothing() -> None:
    """Seen on a real kubelet: right after its restart /pods and pod-resources answer nothing for
    a moment, and the plugins' re-registrations wake passes back to back. An allocation held for
    long before is released only once it has been unheld for the grace period."""
    a = _alloc("a1", "p", ("gpu-0",))
    held = decide(
        [a],
        [_held("p", ("gpu-0",))],
        None,
        now=0.0,
        grace_s=5.0,
        memory=Memory(),
        shared_resources=SHARED,
    )
    memory = held.memory
    for now in (100.0, 100.03, 104.9):  # the restart: empty answers, passes 30 ms apart
        d = decide([a], [], [], now=now, grace_s=5.0, memory=memory, shared_resources=SHARED)
        assert d.release == (), now
        memory = d.memory
    back = decide(
        [a],
        [_held("p", ("gpu-0",))],
        None,
        now=106.0,
        grace_s=5.0,
        memory=memory,
        shared_resources=SHARED,
    )
    assert back.release == ()
    assert back.memory.unheld == frozenset()
    gone = decide([a], [], [], now=107.0, grace_s=5.0, memory=back.memory, shared_resources=SHARED)
    later = decide([a], [], [], now=112.5, grace_s=5.0, memory=gone.memory, shared_resources=SHARED)
    assert [v.allocation.id for v in later.release] == ["a1"]
