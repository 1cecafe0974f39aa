"""The kubelet's /pods document: any JSON gives pods or a clear PodsUnavailable, nothing else."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lj_runtimekit_exporter.kubelet import PodsUnavailable, pods_from_podlist
from lj_runtimekit_exporter.snapshot import Pod

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner),
    max_leaves=20,
)
pod_like = st.fixed_dictionaries(
    {},
    optional={
        "metadata": st.fixed_dictionaries(
            {}, optional={"namespace": json_values, "name": json_values, "uid": json_values}
        )
        | json_values,
        "status": st.fixed_dictionaries({}, optional={"phase": json_values}) | json_values,
    },
)


@settings(max_examples=150, deadline=None)
@given(doc=json_values | st.fixed_dictionaries({"items": st.lists(pod_like | json_values)}))
def test_any_json_gives_pods_or_a_clear_error(doc: Any) -> None:
    try:
        pods = pods_from_podlist(doc)
    except PodsUnavailable as e:
        message = str(e)
        pods = ()
    else:
        message = "pod list"
    assert "pod list" in message
    assert all(isinstance(p.name, str) and isinstance(p.namespace, str) for p in pods)


def meta(name: str, uid: str) -> dict[str, str]:
    return {"namespace": "a", "name": name, "uid": uid}


def test_a_kubelet_podlist_gives_the_pods_with_their_phase() -> None:
    doc = {
        "kind": "PodList",
        "items": [
            {"metadata": meta("p", "u1"), "status": {"phase": "Running"}},
            {"metadata": meta("q", "u2"), "status": {"phase": "Failed"}},
            {"metadata": {"name": "no-namespace"}},
            "garbage",
        ],
    }
    pods = pods_from_podlist(doc)
    assert pods == (Pod("a", "p", "u1", "Running"), Pod("a", "q", "u2", "Failed"))
    assert [p.terminated for p in pods] == [False, True]


@pytest.mark.parametrize("doc", [[], {"items": None}, "x"], ids=["list", "no-items", "string"])
def test_a_document_that_is_no_podlist_is_refused(doc: Any) -> None:
    with pytest.raises(PodsUnavailable):
        pods_from_podlist(doc)
