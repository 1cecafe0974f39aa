"""Partition layouts as the controller reads them from the ConfigMap and the agent from its Job."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.shape_tests.canonical.partition_layout import (
    WHOLE,
    Layout,
    LayoutError,
    Target,
    from_json,
    from_yaml,
    parse_configmap,
)

MIXED = """
- devices: [0, 1]
  mig: [3g.40gb, 3g.40gb]
- devices: [2]
  tdm: [50, 25, 25]
- devices: [6, 7]
  vfio: true
- devices: 3
  whole: true
"""


def test_a_layout_gives_each_gpu_its_target_and_the_unnamed_ones_stay_whole() -> None:
    layout = from_yaml("mixed", MIXED)
    targets = layout.targets(range(8))
    assert targets[0] == targets[1] == Target("mig", profiles=("3g.40gb", "3g.40gb"))
    assert targets[2] == Target("tdm", slices=(50, 25, 25))
    assert targets[6] == targets[7] == Target("vfio")
    assert targets[3] == targets[4] == targets[5] == WHOLE
    assert from_yaml("all-whole", "").targets(range(2)) == {0: WHOLE, 1: WHOLE}
    every = from_yaml("all-mig", "- {devices: all, mig: [7g.80gb]}").targets([0, 1])
    assert set(every.values()) == {Target("mig", profiles=("7g.80gb",))}


def test_the_json_the_agent_gets_reads_back_as_the_same_layout() -> None:
    layout = from_yaml("mixed", MIXED)
    assert from_json(layout.to_json()) == layout
    assert from_yaml("mixed", MIXED + "\n# a comment\n").digest() == layout.digest()
    assert from_yaml("mixed", MIXED.replace("50, 25, 25", "50, 50")).digest() != layout.digest()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- {devices: [0], mig: [3g.40gb], tdm: [50]}", "MIG and TDM on the same GPUs"),
        (
            "- {devices: [0], mig: [3g.40gb]}\n- {devices: [0], tdm: [50]}",
            r"names GPU 0 in entry 1 and entry 2: MIG and TDM are exclusive",
        ),
        ("- {devices: [0], mig: [5g.40gb]}", "unknown MIG profile '5g.40gb'"),
        ("- {devices: [0], mig: [big]}", "unknown MIG profile 'big'"),
        ("- {devices: [0], mig: [4g.40gb, 4g.40gb]}", "need 8 compute slices; a GPU has 7"),
        ("- {devices: [0], tdm: [60, 50]}", "add up to 110 %"),
        ("- {devices: [0], tdm: [0, 50]}", "must be 1..100"),
        ("- {devices: [0], vfio: yes}", "vfio must be true"),
        ("- {devices: [0], whole: false}", "whole must be true"),
        ("- {devices: [0]}", "exactly one of whole, mig, tdm, vfio; it has none"),
        ("- {mig: [1g.10gb]}", "has no devices"),
        ("- {devices: [], mig: [1g.10gb]}", "non-empty list of GPU indices"),
        ("- {devices: [true], mig: [1g.10gb]}", "non-empty list of GPU indices"),
        ("- {devices: [-1], whole: true}", "GPU index -1"),
        ("- {devices: [1, 1], whole: true}", "names GPU 1 more than once"),
        ("- {devices: all, whole: true}\n- {devices: [1], vfio: true}", "names all GPUs"),
        ("- {devices: [0], mg: [1g.10gb]}", r"unknown keys \['mg'\]"),
        ("devices: [0]", "must be a list of entries"),
        ("- [0]", "must be a mapping"),
        ("- {devices: [0], mig: [1g.10gb", "is not YAML"),
    ],
)
def test_a_layout_that_cannot_be_applied_is_refused_with_what_is_wrong(
    text: str, message: str
) -> None:
    with pytest.raises(LayoutError, match=message):
        from_yaml("bad", text)


def test_a_gpu_the_node_lacks_is_refused_when_the_node_is_known() -> None:
    layout = from_yaml("big", "- {devices: [6, 7], vfio: true}")
    with pytest.raises(LayoutError, match=r"names GPU 6, 7, but the node has GPUs 0, 1, 2, 3"):
        layout.targets(range(4))


@pytest.mark.parametrize("name", ["", "-a", "a" * 64, "a b", "é"])
def test_a_layout_name_that_cannot_be_a_label_value_is_refused(name: str) -> None:
    with pytest.raises(LayoutError, match="not a valid label value"):
        from_yaml(name, "")


def test_one_broken_layout_of_the_configmap_leaves_the_others() -> None:
    parsed = parse_configmap({"good": MIXED, "bad": "- {devices: [0], tdm: [101]}"})
    assert isinstance(parsed["good"], Layout)
    assert isinstance(parsed["bad"], LayoutError)


@pytest.mark.parametrize(
    "text",
    ["", "[", "{}", '{"name": "a"}', '{"name": "a", "entries": 1}', '{"name": 1, "entries": []}'],
)
def test_json_that_is_not_a_layout_is_refused(text: str) -> None:
    with pytest.raises(LayoutError):
        from_json(text)


yaml_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 12), st.text(max_size=8), st.just("all")
)
yaml_values = st.recursive(
    yaml_scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(["devices", "mig", "tdm", "vfio", "whole", "x"]), inner, max_size=4
        )
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(st.lists(yaml_values, max_size=4))
def test_any_document_is_a_layout_that_round_trips_or_a_layout_error(doc: list[object]) -> None:
    text = json.dumps(doc)  # JSON is YAML
    try:
        layout = from_yaml("fuzz", text)
    except LayoutError:
        return
    assert from_json(layout.to_json()) == layout
    try:
        targets = layout.targets(range(8))
    except LayoutError:
        return
    assert set(targets) == set(range(8))
