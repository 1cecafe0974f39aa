"""Which injection annotations reach the ``lj-runtime`` handler. Pure.

containerd passes a pod's or container's annotation to the runtime handler only when a pattern
of the handler's ``container_annotations`` matches its key, with Go's ``path.Match``: ``*``
matches any run of characters except ``/``, ``?`` one character except ``/``, ``[...]`` a
class (``[^...]`` negated, ``a-z`` ranges; a class may match ``/``), ``\\`` escapes. So the
guide's ``xdm.amp.com*`` passes ``xdm.amp.com.devices`` but not ``xdm.amp.com/devices``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache


class BadPattern(ValueError):
    """The pattern is malformed (Go's path.ErrBadPattern)."""


def _class(pattern: str, i: int) -> tuple[str, int]:
    """The regex of the class starting after ``[`` at ``i``, and the index after ``]``."""
    out = "["
    if i < len(pattern) and pattern[i] == "^":
        out += "^"
        i += 1
    first = True
    while True:
        if i >= len(pattern):
            raise BadPattern(f"unterminated [ in {pattern!r}")
        ch = pattern[i]
        if ch == "]":
            if first:
                raise BadPattern(f"empty class in {pattern!r}")
            return out + "]", i + 1
        if ch == "-":
            raise BadPattern(f"bad range in {pattern!r}")
        if ch == "\\":
            i += 1
            if i >= len(pattern):
                raise BadPattern(f"trailing \\ in {pattern!r}")
            ch = pattern[i]
        lo = ch
        i += 1
        if i + 1 < len(pattern) and pattern[i] == "-" and pattern[i + 1] != "]":
            hi = pattern[i + 1]
            i += 2
            if hi == "\\":
                if i >= len(pattern):
                    raise BadPattern(f"trailing \\ in {pattern!r}")
                hi = pattern[i]
                i += 1
            if hi < lo:
                raise BadPattern(f"bad range {lo}-{hi} in {pattern!r}")
            out += re.escape(lo) + "-" + re.escape(hi)
        else:
            out += re.escape(lo)
        first = False


@lru_cache(maxsize=64)
def _compiled(pattern: str) -> re.Pattern[str]:
    out, i = "", 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "*":
            out += "[^/]*"
        elif ch == "?":
            out += "[^/]"
        elif ch == "[":
            cls, i = _class(pattern, i + 1)
            out += cls
            continue
        elif ch == "\\":
            i += 1
            if i >= len(pattern):
                raise BadPattern(f"trailing \\ in {pattern!r}")
            out += re.escape(pattern[i])
        else:
            out += re.escape(ch)
        i += 1
    return re.compile(out, re.DOTALL)


def path_match(pattern: str, name: str) -> bool:
    """Go's ``path.Match(pattern, name)``; :class:`BadPattern` for a malformed pattern."""
    return _compiled(pattern).fullmatch(name) is not None


def not_passed(keys: Iterable[str], patterns: Iterable[str]) -> list[str]:
    """The keys no pattern passes (malformed patterns pass nothing, as in containerd)."""
    pats = tuple(patterns)
    out = []
    for k in keys:
        ok = False
        for p in pats:
            try:
                ok = path_match(p, k)
            except BadPattern:
                continue
            if ok:
                break
        if not ok:
            out.append(k)
    return out
