"""Go's path.Match, as containerd applies it to ``container_annotations``: Go's own table, then
the guide's pattern against the injection keys of docs/contracts.md."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lj_runtimekit_interface import sockets
from lj_runtimekit_job_agent import annotation_patterns as ap
from lj_runtimekit_job_agent.errors import ConfigError

BAD = "bad"
#: Go's src/path/match_test.go (Go 1.16+, where a malformed pattern is always an error).
GO_MATCH_TESTS: list[tuple[str, str, bool | str]] = [
    ("abc", "abc", True),
    ("*", "abc", True),
    ("*c", "abc", True),
    ("a*", "a", True),
    ("a*", "abc", True),
    ("a*", "ab/c", False),
    ("a*/b", "abc/b", True),
    ("a*/b", "a/c/b", False),
    ("a*b*c*d*e*/f", "axbxcxdxe/f", True),
    ("a*b*c*d*e*/f", "axbxcxdxexxx/f", True),
    ("a*b*c*d*e*/f", "axbxcxdxe/xxx/f", False),
    ("a*b*c*d*e*/f", "axbxcxdxexxx/fff", False),
    ("a*b?c*x", "abxbbxdbxebxczzx", True),
    ("a*b?c*x", "abxbbxdbxebxczzy", False),
    ("ab[c]", "abc", True),
    ("ab[b-d]", "abc", True),
    ("ab[e-g]", "abc", False),
    ("ab[^c]", "abc", False),
    ("ab[^b-d]", "abc", False),
    ("ab[^e-g]", "abc", True),
    ("a\\*b", "a*b", True),
    ("a\\*b", "ab", False),
    ("a?b", "a☺b", True),
    ("a[^a]b", "a☺b", True),
    ("a???b", "a☺b", False),
    ("a[^a][^a][^a]b", "a☺b", False),
    ("[a-ζ]*", "α", True),
    ("*[a-ζ]", "A", False),
    ("a?b", "a/b", False),
    ("a*b", "a/b", False),
    ("[\\]a]", "]", True),
    ("[\\-]", "-", True),
    ("[x\\-]", "x", True),
    ("[x\\-]", "-", True),
    ("[x\\-]", "z", False),
    ("[\\-x]", "x", True),
    ("[\\-x]", "-", True),
    ("[\\-x]", "a", False),
    ("[]a]", "]", BAD),
    ("[-]", "-", BAD),
    ("[x-]", "x", BAD),
    ("[x-]", "-", BAD),
    ("[x-]", "z", BAD),
    ("[-x]", "x", BAD),
    ("[-x]", "-", BAD),
    ("[-x]", "a", BAD),
    ("\\", "a", BAD),
    ("[a-b-c]", "a", BAD),
    ("[", "a", BAD),
    ("[^", "a", BAD),
    ("[^bc", "a", BAD),
    ("a[", "a", BAD),
    ("a[", "ab", BAD),
    ("a[", "x", BAD),
    ("a/b[", "x", BAD),
    ("*x", "xxx", True),
]


@pytest.mark.parametrize(
    ("pattern", "name", "want"), GO_MATCH_TESTS, ids=[f"{p!r}~{n!r}" for p, n, _ in GO_MATCH_TESTS]
)
def test_match_agrees_with_gos_path_match(pattern: str, name: str, want: bool | str) -> None:
    if want == BAD:
        with pytest.raises(ap.BadPattern):
            ap.match(pattern, name)
    else:
        assert ap.match(pattern, name) is want


GUIDE = "xdm.amp.com*"


@pytest.mark.parametrize(
    ("key", "passes"),
    [
        ("xdm.amp.com.devices", True),
        ("xdm.amp.com.allocation-id", True),
        ("xdm.amp.com", True),
        ("xdm.amp.com/devices", False),
        ("xdm.amp.com.a/b", False),
        ("xdmXampXcom.devices", False),
        ("other.xdm.amp.com.devices", False),
    ],
    ids=str,
)
def test_the_guides_pattern_stops_at_a_slash(key: str, passes: bool) -> None:
    assert ap.match(GUIDE, key) is passes


def test_every_documented_injection_key_passes_the_guides_pattern() -> None:
    assert sockets.INJECTION_ANNOTATION_KEYS
    for key in sockets.INJECTION_ANNOTATION_KEYS:
        assert "/" not in key
        assert ap.match(GUIDE, key), key
    ap.check([GUIDE])


@pytest.mark.parametrize(
    ("patterns", "error"),
    [
        (["xdm.amp.com/*"], "drop the injection annotations"),
        (["xdm.amp.com.devices"], "drop the injection annotations"),
        (["xdm.amp.com["], "syntax error in pattern"),
        ([], "is empty"),
    ],
    ids=["slash", "one-key-only", "malformed", "empty"],
)
def test_check_refuses_patterns_that_containerd_would_misuse(
    patterns: list[str], error: str
) -> None:
    with pytest.raises(ConfigError, match=error):
        ap.check(patterns)


_alphabet = st.sampled_from(list("ab/.*?[]^-\\x"))


@given(st.text(_alphabet, max_size=8), st.text(st.sampled_from(list("ab/.x-]")), max_size=8))
def test_match_never_fails_other_than_bad_pattern(pattern: str, name: str) -> None:
    try:
        result = ap.match(pattern, name)
    except ap.BadPattern:
        return
    assert isinstance(result, bool)
    # A pattern without metacharacters matches only itself.
    if not any(c in pattern for c in "*?[\\"):
        assert result is (pattern == name)
