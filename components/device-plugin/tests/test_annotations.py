"""containerd's container_annotations patterns, matched as Go's path.Match does."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lj_runtimekit_device_plugin.deviceplugin.annotations import BadPattern, not_passed, path_match
from lj_runtimekit_device_plugin.metrics import PluginMetrics
from lj_runtimekit_device_plugin.model import Injection
from lj_runtimekit_device_plugin.modes.device_plugin import annotation_check


@pytest.mark.parametrize(
    ("pattern", "name", "ok"),
    [
        ("xdm.amp.com*", "xdm.amp.com", True),
        ("xdm.amp.com*", "xdm.amp.com.devices", True),
        ("xdm.amp.com*", "xdm.amp.com-allocation-id", True),
        ("xdm.amp.com*", "xdm.amp.com/devices", False),
        ("xdm.amp.com*", "io.xdm.amp.com", False),
        ("xdm.amp.com/*", "xdm.amp.com/devices", True),
        ("xdm.amp.com/*", "xdm.amp.com/a/b", False),
        ("xdm.amp.co?", "xdm.amp.com", True),
        ("a?b", "a/b", False),
        ("[a-c]x", "bx", True),
        ("[^a-c]x", "bx", False),
        ("[^a-c]x", "/x", True),
        ("a\\*", "a*", True),
        ("a\\*", "ab", False),
        ("*", "", True),
    ],
    ids=str,
)
def test_path_match_is_gos(pattern: str, name: str, ok: bool) -> None:
    assert path_match(pattern, name) is ok


@pytest.mark.parametrize("pattern", ["[", "[]", "[a-", "a\\", "[z-a]"])
def test_bad_patterns_are_errors_and_pass_nothing(pattern: str) -> None:
    with pytest.raises(BadPattern):
        path_match(pattern, "a")
    assert not_passed(["a"], [pattern]) == ["a"]


def test_keys_the_guides_pattern_drops_are_named() -> None:
    keys = ["xdm.amp.com.allocation-id", "xdm.amp.com/devices", "other"]
    assert not_passed(keys, ["xdm.amp.com*"]) == ["xdm.amp.com/devices", "other"]


@given(st.text(max_size=12), st.text(max_size=12))
def test_path_match_never_raises_but_bad_pattern(pattern: str, name: str) -> None:
    with contextlib.suppress(BadPattern):
        path_match(pattern, name)


def test_the_allocate_check_logs_and_counts_keys_containerd_would_drop() -> None:
    metrics = PluginMetrics()
    check = annotation_check(("xdm.amp.com*",), metrics)
    inj = Injection(annotations=(("xdm.amp.com/devices", "gpu-0"), ("xdm.amp.com.ok", "1")))
    check("aliyun.com/gpu", inj)
    check("aliyun.com/gpu", inj)
    check("aliyun.com/gpu", Injection(annotations=(("xdm.amp.com.ok", "1"),)))
    value = metrics.registry.get_sample_value(
        "lj_device_plugin_injection_annotations_rejected_total", {"resource": "aliyun.com/gpu"}
    )
    assert value == 2
