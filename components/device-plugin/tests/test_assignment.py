"""The handshake's pure half: parsing the scheduler's decision and choosing the pod."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lj_runtimekit_device_plugin.assignment import (
    ALLOCATED,
    ASSIGNMENT,
    BadAssignment,
    PodView,
    candidates,
    parse,
)

CORE = "aliyun.com/gpu-core"


def _pod(name: str, at: str, gpu: str, *, node: str = "n1", marked: bool = False) -> PodView:
    doc = {
        "version": "v1",
        "node": node,
        "assumedAt": at,
        "containers": [{"name": "main", "devices": [{"id": gpu, "core": 30, "memoryGiB": 8}]}],
    }
    ann = {ASSIGNMENT: json.dumps(doc)}
    if marked:
        ann[ALLOCATED] = "2026-12-03T00:00:00Z"
    return PodView("ns", name, f"uid-{name}", "1", ann, {"main": {CORE: 30}})


def test_two_identical_pods_get_their_own_decisions_oldest_first() -> None:
    pods = [_pod("b", "2026-12-03T00:00:02Z", "gpu-1"), _pod("a", "2026-12-03T00:00:01Z", "gpu-0")]
    first = candidates(pods, "n1", CORE, "gpu-core", units=30)
    assert [c.pod.name for c in first] == ["a", "b"]
    second = candidates(pods, "n1", CORE, "gpu-core", units=30, claimed=[("uid-a", "main")])
    assert [c.shares[0].id for c in second] == ["gpu-1"]


def test_marked_other_node_and_mismatched_pods_are_not_candidates() -> None:
    pods = [
        _pod("a", "t1", "gpu-0", marked=True),
        _pod("b", "t2", "gpu-0", node="n2"),
        _pod("c", "t3", "gpu-0"),
    ]
    assert [c.pod.name for c in candidates(pods, "n1", CORE, "gpu-core", units=30)] == ["c"]
    assert candidates(pods, "n1", CORE, "gpu-core", units=20) == []


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
