"""Partition layouts: what an operator declares for a node's GPUs (docs/partitioning.md). Pure.

A layout is one value of the ConfigMap ``lj-runtimekit-partition-layouts``, named by its key; the
node label ``lj_runtimekit_partition_layout=<name>`` selects it. Its YAML is a list of entries::

    - devices: [0, 1]            # GPU indices on the node, or "all"
      mig: [3g.40gb, 3g.40gb]    # MIG instances by profile
    - devices: [2]
      tdm: [50, 25, 25]          # TDM slices, percent of the GPU's time each
    - devices: [6, 7]
      vfio: true                 # bound to vfio-pci for pass-through
    - devices: [3]
      whole: true                # the default of every GPU no entry names

The controller reads the YAML (:func:`from_yaml`) and hands the agent the layout as canonical JSON
(:meth:`Layout.to_json`, read back by :func:`from_json`), so both judge one text by one set of
rules. Everything here is checked without the hardware; the agent checks what needs it (device
indices, supported modes, memory) against the Runtime before it changes anything.

Shape file (docs/shape.md): carried identical by the controller and the job agent.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import yaml

from . import k8s_names
from .config import _Loader  # the suite's one YAML reading: YAML 1.2 booleans only

MODES: Final = ("whole", "mig", "tdm", "vfio")
MIG_SLICES: Final = 7
"""Compute slices of a MIG-capable GPU (A100, H100, H200)."""
MIG_PROFILE_SLICES: Final = frozenset({1, 2, 3, 4, 7})
"""The compute-slice counts NVIDIA's MIG profiles come in (``<g>g.<memory>gb``)."""
_MIG_PROFILE = re.compile(r"^([0-9])g\.([1-9][0-9]{0,3})gb$")
MAX_ENTRIES: Final = 256
MAX_DEVICE_INDEX: Final = 1023
MAX_TEXT: Final = 64 * 1024


class LayoutError(ValueError):
    """A layout that cannot be applied; the message says which entry and why."""


@dataclass(frozen=True)
class Target:
    """What one GPU is to become."""

    mode: str
    """``whole``, ``mig``, ``tdm`` or ``vfio``."""
    profiles: tuple[str, ...] = ()
    """MIG profiles, in the order given."""
    slices: tuple[int, ...] = ()
    """TDM slice percents, in the order given."""

    def describe(self) -> str:
        if self.mode == "mig":
            return "MIG " + "+".join(self.profiles)
        if self.mode == "tdm":
            return "TDM " + "/".join(f"{p}%" for p in self.slices)
        return {"whole": "whole", "vfio": "vfio-pci"}[self.mode]


WHOLE: Final = Target("whole")


@dataclass(frozen=True)
class Entry:
    devices: tuple[int, ...] | None
    """GPU indices; None for every GPU of the node."""
    target: Target


@dataclass(frozen=True)
class Layout:
    name: str
    entries: tuple[Entry, ...]

    def to_json(self) -> str:
        """Canonical compact JSON: equal layouts give equal text (and :meth:`digest`)."""
        out: list[dict[str, Any]] = []
        for e in self.entries:
            item: dict[str, Any] = {"devices": "all" if e.devices is None else list(e.devices)}
            t = e.target
            item[t.mode] = list(t.profiles) if t.mode == "mig" else list(t.slices) or True
            out.append(item)
        return json.dumps({"name": self.name, "entries": out}, separators=(",", ":"))

    def digest(self) -> str:
        """A short hash of the layout's content: a changed ConfigMap value is a new layout."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:12]

    def targets(self, indices: Iterable[int]) -> dict[int, Target]:
        """The target of every GPU of a node with GPUs ``indices``; the ones no entry names stay
        whole. Raises LayoutError when an entry names a GPU the node does not have."""
        have = sorted(set(indices))
        out = dict.fromkeys(have, WHOLE)
        for n, e in enumerate(self.entries, 1):
            if e.devices is None:
                out.update(dict.fromkeys(have, e.target))
                continue
            missing = [i for i in e.devices if i not in out]
            if missing:
                raise LayoutError(
                    f"layout {self.name!r} entry {n} names GPU {_indices(missing)}, but the "
                    f"node has GPUs {_indices(have) or 'none'}"
                )
            out.update(dict.fromkeys(e.devices, e.target))
        return out


def _indices(values: Iterable[int]) -> str:
    return ", ".join(str(v) for v in values)


def check_name(name: str) -> str:
    if not isinstance(name, str) or not name or not k8s_names.is_label_value(name):
        raise LayoutError(
            f"layout name {name!r} is not a valid label value (1-63 characters: letters, digits, "
            "'-', '_', '.', starting and ending with a letter or digit)"
        )
    return name


def from_yaml(name: str, text: str) -> Layout:
    """The layout ``name`` from its ConfigMap value; raises LayoutError with what is wrong."""
    check_name(name)
    if len(text) > MAX_TEXT:
        raise LayoutError(f"layout {name!r} is {len(text)} characters, at most {MAX_TEXT}")
    try:
        doc = yaml.load(text, Loader=_Loader)
    except (yaml.YAMLError, RecursionError) as e:
        raise LayoutError(f"layout {name!r} is not YAML: {str(e).splitlines()[0]}") from None
    return _layout(name, [] if doc is None else doc)


def from_json(text: str) -> Layout:
    """A layout as :meth:`Layout.to_json` writes it; raises LayoutError."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise LayoutError(f"layout is not JSON: {e}") from None
    if not isinstance(doc, dict) or set(doc) != {"name", "entries"}:
        raise LayoutError('layout JSON must be an object with "name" and "entries" only')
    return _layout(check_name(doc["name"]), doc["entries"])


def _layout(name: str, doc: Any) -> Layout:
    if not isinstance(doc, list):
        raise LayoutError(
            f"layout {name!r} must be a list of entries like "
            "'- {devices: [0, 1], mig: [3g.40gb, 3g.40gb]}', not "
            f"{type(doc).__name__}"
        )
    if len(doc) > MAX_ENTRIES:
        raise LayoutError(f"layout {name!r} has {len(doc)} entries, at most {MAX_ENTRIES}")
    entries = tuple(_entry(name, n, raw) for n, raw in enumerate(doc, 1))
    _no_gpu_twice(name, entries)
    return Layout(name, entries)


def _entry(name: str, n: int, raw: Any) -> Entry:
    where = f"layout {name!r} entry {n}"
    if not isinstance(raw, Mapping):
        raise LayoutError(f"{where} must be a mapping with devices and one of {', '.join(MODES)}")
    unknown = sorted(str(k) for k in raw if k not in ("devices", *MODES))
    if unknown:
        raise LayoutError(f"{where}: unknown keys {unknown}; known: devices, {', '.join(MODES)}")
    modes = [m for m in MODES if m in raw]
    if {"mig", "tdm"} <= set(modes):
        raise LayoutError(
            f"{where} asks for MIG and TDM on the same GPUs: they are exclusive on one GPU "
            "(guide §1.3); give each GPU one of them"
        )
    if len(modes) != 1:
        raise LayoutError(
            f"{where} must have exactly one of {', '.join(MODES)}; it has "
            f"{', '.join(modes) or 'none'}"
        )
    if "devices" not in raw:
        raise LayoutError(f"{where} has no devices: a list of GPU indices, or 'all'")
    return Entry(_devices(where, raw["devices"]), _target(where, modes[0], raw[modes[0]]))


def _devices(where: str, raw: Any) -> tuple[int, ...] | None:
    if raw == "all":
        return None
    items = [raw] if isinstance(raw, int) and not isinstance(raw, bool) else raw
    if (
        not isinstance(items, list)
        or not items
        or not all(isinstance(i, int) and not isinstance(i, bool) for i in items)
    ):
        raise LayoutError(f"{where}: devices must be 'all' or a non-empty list of GPU indices")
    bad = [i for i in items if not 0 <= i <= MAX_DEVICE_INDEX]
    if bad:
        raise LayoutError(f"{where}: GPU index {bad[0]} is not in 0..{MAX_DEVICE_INDEX}")
    twice = sorted({i for i in items if items.count(i) > 1})
    if twice:
        raise LayoutError(f"{where} names GPU {_indices(twice)} more than once")
    return tuple(sorted(items))


def _target(where: str, mode: str, raw: Any) -> Target:
    if mode in ("whole", "vfio"):
        if raw is not True:
            raise LayoutError(f"{where}: {mode} must be true (to leave a GPU whole, omit it)")
        return Target(mode)
    if mode == "mig":
        return Target("mig", profiles=_profiles(where, raw))
    return Target("tdm", slices=_slices(where, raw))


def _profiles(where: str, raw: Any) -> tuple[str, ...]:
    if not isinstance(raw, list) or not raw or not all(isinstance(p, str) for p in raw):
        raise LayoutError(f"{where}: mig must be a non-empty list of profiles like 3g.40gb")
    used = 0
    for p in raw:
        m = _MIG_PROFILE.match(p)
        if m is None or int(m[1]) not in MIG_PROFILE_SLICES:
            raise LayoutError(
                f"{where}: unknown MIG profile {p!r}; profiles are <g>g.<memory>gb with g one "
                f"of {sorted(MIG_PROFILE_SLICES)}, e.g. 1g.10gb, 3g.40gb, 7g.80gb"
            )
        used += int(m[1])
    if used > MIG_SLICES:
        raise LayoutError(
            f"{where}: MIG profiles {'+'.join(raw)} need {used} compute slices; a GPU has "
            f"{MIG_SLICES}"
        )
    return tuple(raw)


def _slices(where: str, raw: Any) -> tuple[int, ...]:
    if (
        not isinstance(raw, list)
        or not raw
        or not all(isinstance(p, int) and not isinstance(p, bool) for p in raw)
    ):
        raise LayoutError(f"{where}: tdm must be a non-empty list of slice percents like [50, 50]")
    if not all(1 <= p <= 100 for p in raw):
        raise LayoutError(f"{where}: TDM slice percents must be 1..100, not {raw}")
    if sum(raw) > 100:
        raise LayoutError(f"{where}: TDM slices {raw} add up to {sum(raw)} %, more than 100 %")
    return tuple(raw)


def _no_gpu_twice(name: str, entries: tuple[Entry, ...]) -> None:
    seen: dict[int, int] = {}
    every = [n for n, e in enumerate(entries, 1) if e.devices is None]
    if every and len(entries) > 1:
        other = next(n for n in range(1, len(entries) + 1) if n != every[0])
        raise LayoutError(
            f"layout {name!r} entry {every[0]} names all GPUs and entry {other} names some "
            "again: give each GPU one entry"
        )
    for n, e in enumerate(entries, 1):
        for i in e.devices or ():
            if i in seen:
                first = entries[seen[i] - 1].target.mode
                mixed = {first, e.target.mode} == {"mig", "tdm"}
                raise LayoutError(
                    f"layout {name!r} names GPU {i} in entry {seen[i]} and entry {n}"
                    + (
                        ": MIG and TDM are exclusive on one GPU (guide §1.3)"
                        if mixed
                        else ": give each GPU one entry"
                    )
                )
            seen[i] = n


def parse_configmap(data: Mapping[str, str] | None) -> dict[str, Layout | LayoutError]:
    """Every layout of the ConfigMap's data, each parsed on its own: a broken one refuses only
    the nodes that select it."""
    out: dict[str, Layout | LayoutError] = {}
    for name, text in (data or {}).items():
        try:
            out[name] = from_yaml(name, text if isinstance(text, str) else "")
        except LayoutError as e:
            out[name] = e
    return out
