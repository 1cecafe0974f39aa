"""containerd's ``container_annotations`` patterns, matched as containerd matches them. Pure.

containerd passes a container annotation to a runtime handler only when its key matches one of
the handler's ``container_annotations`` with Go's ``path.Match``. There ``*`` and ``?`` never match
``/``: the guide's ``xdm.amp.com*`` passes ``xdm.amp.com.devices`` but drops
``xdm.amp.com/devices``. :func:`match` follows Go's ``path.Match`` (Go 1.16 and later) byte for
byte in behaviour, so the agent can refuse a configured pattern that is malformed or that would
drop an injection key before containerd silently does.
"""

from __future__ import annotations

from collections.abc import Iterable

from lj_runtimekit_interface import sockets

from .errors import ConfigError


class BadPattern(ConfigError):
    """The pattern is malformed (Go's ``path.ErrBadPattern``)."""

    def __init__(self, pattern: str) -> None:
        super().__init__(f"syntax error in pattern {pattern!r}")
        self.pattern = pattern


def match(pattern: str, name: str) -> bool:
    """Whether ``name`` matches ``pattern`` as Go's ``path.Match`` says; raises :class:`BadPattern`.

    Grammar: ``*`` any run of non-``/`` characters, ``?`` one non-``/`` character,
    ``[`` [``^``] ranges ``]`` a character class (``lo-hi`` ranges, ``\\`` escapes), ``\\c`` the
    character c. As in Go, a malformed pattern is an error even when the name already failed.
    """
    original = pattern
    while pattern:
        star, chunk, pattern = _scan_chunk(pattern)
        if star and not chunk:
            # A trailing * matches the rest of the name unless it holds a /.
            return "/" not in name
        rest = _match_chunk(original, chunk, name)
        # The last chunk must consume the whole name; else a later star may still match.
        if rest is not None and (not rest or pattern):
            name = rest
            continue
        if star:
            found = False
            for i in range(len(name)):
                if name[i] == "/":
                    break
                rest = _match_chunk(original, chunk, name[i + 1 :])
                if rest is not None:
                    if not pattern and rest:
                        continue
                    name = rest
                    found = True
                    break
            if found:
                continue
        # No match: the rest of the pattern must still be well formed.
        while pattern:
            _, chunk, pattern = _scan_chunk(pattern)
            _match_chunk(original, chunk, "")
        return False
    return not name


def _scan_chunk(pattern: str) -> tuple[bool, str, str]:
    """Leading stars, then the chunk up to the next star outside a class, then the rest."""
    stripped = pattern.lstrip("*")
    star = len(stripped) != len(pattern)
    pattern = stripped
    in_range = False
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            if i + 1 < len(pattern):
                i += 1
        elif c == "[":
            in_range = True
        elif c == "]":
            in_range = False
        elif c == "*" and not in_range:
            break
        i += 1
    return star, pattern[:i], pattern[i:]


def _match_chunk(original: str, chunk: str, s: str) -> str | None:
    """What remains of ``s`` after ``chunk`` matched its start, or None; checks the whole chunk."""
    failed = False
    while chunk:
        if not failed and not s:
            failed = True
        c = chunk[0]
        if c == "[":
            r = ""
            if not failed:
                r, s = s[0], s[1:]
            chunk = chunk[1:]
            negated = bool(chunk) and chunk[0] == "^"
            if negated:
                chunk = chunk[1:]
            matched = False
            ranges = 0
            while True:
                if chunk and chunk[0] == "]" and ranges > 0:
                    chunk = chunk[1:]
                    break
                lo, chunk = _get_esc(original, chunk)
                hi = lo
                if chunk[0] == "-":
                    hi, chunk = _get_esc(original, chunk[1:])
                if not failed and lo <= r <= hi:
                    matched = True
                ranges += 1
            if matched == negated:
                failed = True
        elif c == "?":
            if not failed:
                if s[0] == "/":
                    failed = True
                s = s[1:]
            chunk = chunk[1:]
        else:
            if c == "\\":
                chunk = chunk[1:]
                if not chunk:
                    raise BadPattern(original)
            if not failed:
                if chunk[0] != s[0]:
                    failed = True
                s = s[1:]
            chunk = chunk[1:]
    return None if failed else s


def _get_esc(original: str, chunk: str) -> tuple[str, str]:
    """One character of a class (``\\`` escapes it) and the rest; the rest is never empty."""
    if not chunk or chunk[0] in "-]":
        raise BadPattern(original)
    if chunk[0] == "\\":
        chunk = chunk[1:]
        if not chunk:
            raise BadPattern(original)
    r, rest = chunk[0], chunk[1:]
    if not rest:
        raise BadPattern(original)
    return r, rest


def check(patterns: Iterable[str], keys: Iterable[str] = sockets.INJECTION_ANNOTATION_KEYS) -> None:
    """Raise :class:`ConfigError` unless every pattern is well formed and every key passes one.

    ``keys`` are the injection annotation keys the Runtime returns (docs/contracts.md); a key no
    pattern passes would be dropped by containerd before it reaches the lj-runtime handler.
    """
    patterns = list(patterns)
    if not patterns:
        raise ConfigError("container_annotations is empty: no injection annotation would pass")
    for pattern in patterns:
        match(pattern, "")
    dropped = [k for k in keys if not any(match(p, k) for p in patterns)]
    if dropped:
        raise ConfigError(
            f"container_annotations {patterns} drop the injection annotations {dropped}: "
            "containerd matches with Go's path.Match, where * and ? stop at '/'; use a pattern "
            f"such as {sockets.INJECTION_ANNOTATION_PREFIX + '*'!r}"
        )
