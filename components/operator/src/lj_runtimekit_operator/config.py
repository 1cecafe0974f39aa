"""The settings loader every LJ RuntimeKit daemon shares: flag > environment > ConfigMap > default.

Shape file (docs/shape.md): every component with settings carries this file as ``config.py``,
byte for byte; ``tests/shape_tests/test_drift.py`` fails when a copy differs from
``tests/shape_tests/canonical/config.py``. Change the reference and copy it in the same commit.

One rule for every source. Flags and environment variables are text; the ConfigMap file is YAML
(``version: v1``, snake_case keys; unknown versions and keys refused), read with YAML 1.2's
booleans only (``yes``/``on`` stay text). A ``bool`` takes a YAML boolean or Go's ParseBool
spellings (true/false/1/0/t/f); an ``int`` or ``float`` takes a YAML number (not a boolean) or
its text; a ``str`` takes text or a YAML number's text; nothing takes a list, a map or null. A
bad value is a :class:`SettingsError` naming the source, key and value; the daemon exits 2 on
it. :func:`validate` then checks what every settings tree promises: choices, no NUL in text,
finite numbers, ``host:port`` addresses.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from .cli import RENAMED_VALUES, Deprecated, bind_address, env_name, flag_name, parse_bool

CONFIG_VERSION = "v1"


class _Loader(yaml.SafeLoader):
    """YAML 1.2's booleans only: ``yes``/``no``/``on``/``off`` stay text, as they are in a flag
    or an environment variable, so one spelling means one thing in every source."""


_BOOL = "tag:yaml.org,2002:bool"
_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != _BOOL]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    _BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


class SettingsError(ValueError):
    """A setting the daemon cannot start with; the message names where, which key and value."""


def _kind(f: dataclasses.Field[Any]) -> str:
    return str(f.metadata.get("kind") or f.type)


def coerce(key: str, kind: str, raw: Any, where: str) -> Any:
    """``raw`` from ``where`` as a value of ``kind`` (str, int, float, bool or yaml), by the one
    rule; a ``yaml`` value is a list or a map (YAML text from a flag or the environment), which
    the component's settings check themselves."""
    bad = SettingsError(f"{where}: {key}={raw!r} is not a valid {kind}")
    try:
        if kind == "yaml":
            doc = yaml.load(raw, Loader=_Loader) if isinstance(raw, str) else raw
            if not isinstance(doc, list | dict):
                raise bad
            return doc
        if kind == "bool":
            if isinstance(raw, bool):
                return raw
            if isinstance(raw, str):
                return parse_bool(raw.strip())
            raise bad
        if isinstance(raw, bool) or not isinstance(raw, str | int | float):
            raise bad
        if kind == "int":
            return int(raw) if isinstance(raw, int) else int(str(raw).strip())
        if kind == "float":
            return float(raw)
        return raw if isinstance(raw, str) else str(raw)
    except (TypeError, ValueError, OverflowError, yaml.YAMLError, RecursionError) as e:
        if isinstance(e, SettingsError):
            raise
        raise bad from e


def read_file(path: str, known: Sequence[str]) -> dict[Any, Any]:
    """The ConfigMap file's settings (without ``version``); unknown keys are refused."""
    try:
        doc = yaml.load(
            Path(path).read_text(encoding="utf-8"), Loader=_Loader
        )  # the safe loader, booleans narrowed
    except OSError as e:
        raise SettingsError(f"config file {path}: {e.strerror}") from e
    except UnicodeDecodeError as e:
        raise SettingsError(f"config file {path} is not UTF-8: byte {e.start}: {e.reason}") from e
    except (yaml.YAMLError, RecursionError) as e:
        raise SettingsError(f"config file {path} is not valid YAML: {e}") from e
    if not isinstance(doc, dict):
        raise SettingsError(f"config file {path}: expected a mapping with version: v1")
    version = doc.pop("version", None)
    if version != CONFIG_VERSION:
        raise SettingsError(
            f"config file {path}: version {version!r} unknown, expected {CONFIG_VERSION!r}"
        )
    unknown = sorted(str(k) for k in doc if k not in known)  # YAML keys need not be strings
    if unknown:
        raise SettingsError(f"config file {path}: unknown keys {unknown}; known: {sorted(known)}")
    return doc


def _where(source: str, where: str, key: str, env_prefix: str) -> str:
    """How an error or a note names ``key`` in ``source`` (flag, environment or file)."""
    if source == "flag":
        return f"flag {flag_name(key)}"
    if source == "environment":
        return f"environment {env_name(env_prefix, key)}"
    return where


def load(
    cls: type[Any],
    *,
    flags: Mapping[str, str | None],
    environ: Mapping[str, str],
    env_prefix: str,
    deprecated: Sequence[Deprecated] = (),
) -> tuple[dict[str, Any], list[str]]:
    """The values of ``cls``'s fields that some source sets, and a note per deprecated spelling.

    ``flags`` are the parsed command line by key (None: not given), ``config`` the file's path.
    """
    fields = {f.name: f for f in dataclasses.fields(cls)}
    old = {d.old: d for d in deprecated}
    notes: list[str] = []
    values: dict[str, Any] = {}
    layers: list[tuple[str, str, Mapping[Any, Any]]] = []
    path = flags.get("config") or environ.get(env_name(env_prefix, "config"))
    if path:
        layers.append(("file", f"config file {path}", read_file(path, [*fields, *old])))
    env = {k: environ[e] for k in [*fields, *old] if (e := env_name(env_prefix, k)) in environ}
    layers.append(("environment", "environment", env))
    given = {k: v for k, v in flags.items() if v is not None and k != "config"}
    layers.append(("flag", "flag", given))
    for source, where, layer in layers:
        for key in (k for k in fields if k in layer):
            at = _where(source, where, key, env_prefix)
            value = coerce(key, _kind(fields[key]), layer[key], at)
            renamed = RENAMED_VALUES.get(key, {}).get(value) if isinstance(value, str) else None
            if renamed is not None:
                notes.append(f"{key}={value} is deprecated: use {key}={renamed}")
                value = renamed
            values[key] = value
        for key in (k for k in old if k in layer):
            d = old[key]
            value = coerce(key, d.kind, layer[key], _where(source, where, key, env_prefix))
            values[d.new] = d.apply(values.get(d.new, fields[d.new].default), value)
            old_name = _where(source, f"{where}: key {d.old}", d.old, env_prefix)
            new_name = {"flag": flag_name(d.new), "environment": env_name(env_prefix, d.new)}.get(
                source, f"key {d.new}"
            )
            until = f" (the old spelling goes in {d.until})" if d.until else ""
            notes.append(f"{old_name} is deprecated: use {new_name}{until}")
    return values, notes


def validate(settings: Any) -> None:
    """What every settings tree promises, checked however it was built (loader or a test)."""
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        choices = f.metadata.get("choices", ())
        if choices and value not in choices:
            raise SettingsError(f"{f.name} {value!r}: expected one of {list(choices)}")
        if isinstance(value, str) and "\x00" in value:
            raise SettingsError(f"{f.name} {value!r}: a NUL character is not allowed")
        if isinstance(value, float) and not math.isfinite(value):
            # inf would make a wait unbounded, nan compares false with every bound
            raise SettingsError(f"{f.name} {value}: expected a finite number")
        if f.metadata.get("address") and value:
            try:
                bind_address(value)
            except ValueError as e:
                raise SettingsError(f"{f.name} {e}") from e
