"""``k8s_names``: each kind of Kubernetes name with the apiserver's limits; no trailing newline."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.shape_tests.canonical import k8s_names as n

CHECKS: dict[str, Callable[[str], bool]] = {
    "dns_label": n.is_dns_label,
    "dns_subdomain": n.is_dns_subdomain,
    "label_value": n.is_label_value,
    "qualified_name": n.is_qualified_name,
}

CASES = [
    # (kind, text, valid)
    ("dns_label", "gpu-0", True),
    ("dns_label", "a" * 63, True),
    ("dns_label", "a" * 64, False),
    ("dns_label", "", False),
    ("dns_label", "Gpu", False),
    ("dns_label", "-gpu", False),
    ("dns_label", "gpu.example", False),
    ("dns_subdomain", "gpu.example.com", True),
    ("dns_subdomain", ".".join(["a" * 63] * 3) + "." + "a" * 61, True),  # 253
    ("dns_subdomain", ".".join(["a" * 63] * 3) + "." + "a" * 62, False),  # 254
    ("dns_subdomain", "gpu..example", False),
    ("dns_subdomain", "", False),
    ("label_value", "", True),
    ("label_value", "A_b.c-1", True),
    ("label_value", "a" * 63, True),
    ("label_value", "a" * 64, False),
    ("label_value", "_a", False),
    ("label_value", "a b", False),
    ("qualified_name", "app", True),
    ("qualified_name", "example.com/gpu.present", True),
    ("qualified_name", "example.com/" + "a" * 63, True),
    ("qualified_name", "example.com/" + "a" * 64, False),
    ("qualified_name", "a" * 254 + "/x", False),
    ("qualified_name", "Example.com/x", False),
    ("qualified_name", "example.com/", False),
    ("qualified_name", "/x", False),
    ("qualified_name", "a/b/c", False),
    ("qualified_name", "", False),
]


@pytest.mark.parametrize(("kind", "text", "valid"), CASES, ids=lambda v: repr(v)[:40])
def test_each_kind_with_its_length_limit(kind: str, text: str, valid: bool) -> None:
    assert CHECKS[kind](text) is valid


@pytest.mark.parametrize("kind", sorted(CHECKS))
@pytest.mark.parametrize("end", ["\n", "\r\n", " ", "\t", "\x00"], ids=repr)
def test_a_name_with_a_trailing_newline_or_space_is_refused(kind: str, end: str) -> None:
    name = "example.com/gpu" if kind == "qualified_name" else "gpu"
    assert CHECKS[kind](name)
    assert not CHECKS[kind](name + end)
    assert not CHECKS[kind](end + name)


@given(st.text(max_size=300))
def test_every_dns_label_is_a_subdomain_a_label_value_and_a_qualified_name(text: str) -> None:
    if n.is_dns_label(text):
        assert n.is_dns_subdomain(text)
        assert n.is_label_value(text)
        assert n.is_qualified_name(text)
    if n.is_qualified_name(text) or n.is_label_value(text):
        assert "\n" not in text
        assert len(text) <= n.MAX_SUBDOMAIN + 1 + n.MAX_LABEL
