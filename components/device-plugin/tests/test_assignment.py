"""The handshake's pure half: parsing the scheduler's decision and choosing the pod."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lj_runtimekit_device_plugin.deviceplugin.assignment import (
    ALLOCATION,
    ASSIGNMENT,
    BadAssignment,
    candidates,
    marks,
    parse,
    unique,
    whole_intent,
    with_mark,
)
from lj_runtimekit_device_plugin.podview import PodView

CORE = "aliyun.com/gpu-core"
MEM = "aliyun.com/gpu-memory"


def _pod(name: str, at: str, gpu: str, *, node: str = "n1", marked: bool = False) -> PodView:
    doc = {
        "version": "v1",
        "node": node,
        "assumedAt": at,
        "containers": [{"name": "main", "devices": [{"id": gpu, "core": 30, "memoryGiB": 8}]}],
    }
    ann = {ASSIGNMENT: json.dumps(doc)}
    if marked:
        ann[ALLOCATION] = json.dumps({"containers": {"main": {CORE: ["alloc-1"]}}})
    return PodView("ns", name, f"uid-{name}", "1", ann, {"main": {CORE: 30, MEM: 8}})


def test_two_identical_pending_pods_are_ambiguous_and_a_claimed_one_leaves_the_other() -> None:
    pods = [_pod("b", "2026-12-03T00:00:02Z", "gpu-1"), _pod("a", "2026-12-03T00:00:01Z", "gpu-0")]
    first = candidates(pods, "n1", CORE, "gpu-core", units=30)
    chosen, ambiguous = unique(first)
    assert chosen is None
    assert sorted(c.pod.name for c in ambiguous) == ["a", "b"]
    second = candidates(pods, "n1", CORE, "gpu-core", units=30, claimed=[("uid-a", "main", CORE)])
    chosen, _ = unique(second)
    assert chosen is not None
    assert chosen.shares[0].id == "gpu-1"


def test_the_unique_pending_container_wins_whatever_its_age() -> None:
    """Pods of different shapes: each request has exactly one match, old or new."""
    pods = [
        _pod("old", "2026-12-03T00:00:01Z", "gpu-0"),
        _pod("new", "2026-12-03T00:00:09Z", "gpu-1"),
    ]
    pods[1] = PodView(
        "ns", "new", "uid-new", "1", pods[1].annotations, {"main": {CORE: 30, MEM: 8}}
    )
    pods[0] = PodView(
        "ns",
        "old",
        "uid-old",
        "1",
        {ASSIGNMENT: pods[0].annotations[ASSIGNMENT].replace('"core": 30', '"core": 20')},
        {"main": {CORE: 20, MEM: 8}},
    )
    chosen, _ = unique(candidates(pods, "n1", CORE, "gpu-core", units=30))
    assert chosen is not None
    assert chosen.pod.name == "new"


def test_ended_and_deleted_pods_are_not_pending() -> None:
    a = _pod("a", "t1", "gpu-0")
    ended = PodView(a.namespace, "f", "uid-f", "1", a.annotations, a.requests, phase="Failed")
    gone = PodView(a.namespace, "d", "uid-d", "1", a.annotations, a.requests, deleted=True)
    found = candidates([a, ended, gone], "n1", CORE, "gpu-core", units=30)
    assert [c.pod.name for c in found] == ["a"]


def test_marked_other_node_and_mismatched_pods_are_not_candidates() -> None:
    pods = [
        _pod("a", "t1", "gpu-0", marked=True),
        _pod("b", "t2", "gpu-0", node="n2"),
        _pod("c", "t3", "gpu-0"),
    ]
    assert [c.pod.name for c in candidates(pods, "n1", CORE, "gpu-core", units=30)] == ["c"]
    assert candidates(pods, "n1", CORE, "gpu-core", units=20) == []


def test_a_container_with_core_and_memory_is_answered_once_per_resource() -> None:
    pods = [_pod("a", "t1", "gpu-0", marked=True), _pod("b", "t0", "gpu-1")]
    # a's core call is answered; a is still the (first) candidate for its memory call,
    # carrying the allocation its core call made, ahead of the older untouched b
    found = candidates(pods, "n1", MEM, "gpu-memory", units=8)
    assert [(c.pod.name, c.allocated) for c in found] == [("a", ("alloc-1",)), ("b", ())]
    assert [c.pod.name for c in candidates(pods, "n1", CORE, "gpu-core", units=30)] == ["b"]


def test_this_process_record_stands_in_for_a_stale_pod_view() -> None:
    pods = [_pod("a", "t1", "gpu-0"), _pod("b", "t0", "gpu-1")]
    found = candidates(
        pods,
        "n1",
        MEM,
        "gpu-memory",
        units=8,
        claimed=[("uid-a", "main", CORE)],
        held={("uid-a", "main"): ("alloc-1",)},
    )
    assert [(c.pod.name, c.allocated) for c in found] == [("a", ("alloc-1",)), ("b", ())]


def test_two_shared_containers_of_one_pod_are_candidates_each() -> None:
    doc = {
        "version": "v1",
        "node": "n1",
        "assumedAt": "t",
        "containers": [
            {"name": "train", "devices": [{"id": "gpu-0", "core": 30}]},
            {"name": "eval", "devices": [{"id": "gpu-1", "core": 30}]},
        ],
    }
    ann = {
        ASSIGNMENT: json.dumps(doc),
        ALLOCATION: json.dumps({"containers": {"train": {CORE: ["alloc-1"]}}}),
    }
    pod = PodView("ns", "p", "uid-p", "1", ann, {"train": {CORE: 30}, "eval": {CORE: 30}})
    found = candidates([pod], "n1", CORE, "gpu-core", units=30)
    assert [(c.container, c.shares[0].id) for c in found] == [("eval", "gpu-1")]


def test_the_mark_grows_per_container_and_resource_and_refuses_a_second_claim() -> None:
    first = with_mark({}, "t1", "main", CORE, ["alloc-1"])
    assert first is not None
    both = with_mark(first, "t2", "main", MEM, ["alloc-1"])
    assert both is not None
    assert marks(both) == {"main": {CORE: ("alloc-1",), MEM: ("alloc-1",)}}
    assert with_mark(both, "t3", "main", CORE, ["alloc-2"]) is None
    # another process's allocation for the container: ours must not be recorded beside it
    assert with_mark(first, "t2", "main", MEM, ["alloc-9"]) is None
    eval_too = with_mark(both, "t3", "eval", CORE, ["alloc-2"])
    assert eval_too is not None
    assert set(marks(eval_too)) == {"main", "eval"}


@pytest.mark.parametrize("text", ["not json", "[]", '{"containers": ["x"]}'])
def test_an_unreadable_mark_reads_as_none(text: str) -> None:
    assert marks({ALLOCATION: text}) == {}


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[]",
        '{"version": "v2"}',
        '{"version": "v1", "node": "n1", "assumedAt": "t"}',
        '{"version": "v1", "node": "n1", "assumedAt": "t", "containers": [{"name": "m"}]}',
        '{"version":"v1","node":"n","assumedAt":"t","containers":[{"name":"m","devices":[{}]}]}',
        '{"version":"v1","node":"n","assumedAt":"t","containers":'
        '[{"name":"m","devices":[{"id":"g","core":-1}]}]}',
    ],
    ids=["garbage", "list", "version", "no-containers", "no-devices", "no-id", "negative"],
)
def test_malformed_assignment_is_a_clear_error(text: str) -> None:
    with pytest.raises(BadAssignment, match=ASSIGNMENT.split("/")[0]):
        parse(text)


@given(st.text())
def test_parse_never_raises_anything_but_bad_assignment(text: str) -> None:
    with contextlib.suppress(BadAssignment):
        parse(text)


def _whole(name: str, at: str, devices: list[str], *, node: str = "n1") -> PodView:
    doc = {
        "version": "v1",
        "node": node,
        "assumedAt": at,
        "containers": [{"name": "main", "devices": [{"id": d, "whole": True} for d in devices]}],
    }
    ann = {ASSIGNMENT: json.dumps(doc)}
    return PodView("ns", name, f"uid-{name}", "1", ann, {"main": {GPU: len(devices)}})


GPU = "aliyun.com/gpu"
EIGHT = [f"gpu-{i}" for i in range(8)]


def test_whole_intent_is_the_unique_pending_decision_of_that_size_still_available() -> None:
    pods = [
        _whole("pair", "2026-01-01T00:00:00Z", ["gpu-3", "gpu-5"]),
        _whole("four", "2026-01-01T00:00:00Z", ["gpu-0", "gpu-1", "gpu-2", "gpu-4"]),
        _whole("elsewhere", "2025-01-01T00:00:00Z", ["gpu-0", "gpu-1"], node="n2"),
        _pod("shared", "2026-01-01T00:00:00Z", "gpu-1"),
    ]
    got = whole_intent(pods, "n1", GPU, size=2, available=EIGHT)
    assert got.choice == ("gpu-3", "gpu-5")
    assert got.reserved == {"gpu-1"}
    assert whole_intent(pods, "n1", GPU, size=4, available=EIGHT).choice == (
        "gpu-0",
        "gpu-1",
        "gpu-2",
        "gpu-4",
    )
    # a decision no longer available, or outside must_include, is no decision
    rest = [d for d in EIGHT if d != "gpu-3"]
    assert whole_intent(pods, "n1", GPU, size=2, available=rest).choice is None
    assert (
        whole_intent(pods, "n1", GPU, size=2, available=EIGHT, must_include=["gpu-0"]).choice
        is None
    )
    assert whole_intent(pods, "n1", GPU, size=3, available=EIGHT).choice is None
    assert whole_intent(pods, "n1", "alibabacloud.com/ppu", size=2, available=EIGHT).choice is None


def test_two_pending_whole_decisions_of_one_size_are_ambiguous_not_the_oldest() -> None:
    """The kubelet may admit the newer pod first: taking the oldest decision would give it the
    other pod's GPUs. Two pending same-shaped decisions break the scheduler's contract; the
    plugin falls back to topology and names both pods."""
    pods = [
        _whole("late", "2026-01-02T00:00:00Z", ["gpu-6", "gpu-7"]),
        _whole("early", "2026-01-01T00:00:00Z", ["gpu-3", "gpu-5"]),
    ]
    got = whole_intent(pods, "n1", GPU, size=2, available=EIGHT)
    assert got.choice is None
    assert sorted(p.name for p, _ in got.ambiguous) == ["early", "late"]
