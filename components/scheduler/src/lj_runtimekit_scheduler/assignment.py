"""What a bound pod holds, read off its annotations: the scheduler's decision, corrected by the
devices the device plugin reports it actually allocated. Pure; hand-edited values never raise.

docs/contracts.md: the decision is ``lj-runtimekit-scheduler/gpu-assignment``; the device
plugin marks the pod ``lj-runtimekit-device-plugin/allocated`` once the kubelet allocated it and
writes ``lj-runtimekit-device-plugin/allocation``, which may carry
``"devices": {"<container>": {"<resource>": ["gpu-3", ...]}}``: the Runtime device ids each
container got (also read inside a container's entry, ``"containers": {"<c>": {"devices": ...}}``).
"""

from __future__ import annotations

import json
from typing import Any

from .gpu import Choice, Slice
from .model import (
    ALLOCATED_ANNOTATION,
    ALLOCATION_ANNOTATION,
    ASSIGNMENT_ANNOTATION,
    CORE_PER_GPU,
    DEFAULT_NAMES,
    Pod,
    ResourceNames,
)

#: No device has more memory than this (1 PiB); a larger share in a decision is not ours.
MAX_MEMORY_GIB = 2**20


def decision(pod: Pod) -> Choice | None:
    """The GPU decision written on a bound pod, or None (absent or hand-edited beyond use)."""
    raw = pod.annotation(ASSIGNMENT_ANNOTATION)
    if not raw:
        return None
    try:
        doc = json.loads(raw)
        choice = Choice(
            tuple(
                (
                    str(c["name"]),
                    tuple(
                        Slice(
                            d["id"],
                            d.get("whole", False),
                            d.get("core", 0),
                            d.get("memoryGiB", 0),
                        )
                        for d in c["devices"]
                    ),
                )
                for c in doc["containers"]
            )
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    # Users can write this annotation on their own pods: a negative or absurd share would make
    # room on a full GPU, so anything the scheduler itself never writes is not a decision.
    for _, slices in choice.containers:
        for s in slices:
            if not (
                isinstance(s.device, str)
                and isinstance(s.whole, bool)
                and type(s.core) is int
                and type(s.memory_gib) is int
                and 0 <= s.core <= CORE_PER_GPU
                and 0 <= s.memory_gib <= MAX_MEMORY_GIB
            ):
                return None
    return choice


def confirmed(pod: Pod) -> bool:
    """The device plugin has answered the kubelet's Allocate for this pod."""
    return bool(pod.annotation(ALLOCATED_ANNOTATION))


def _ids(per_resource: Any) -> dict[str, tuple[str, ...]]:
    if not isinstance(per_resource, dict):
        return {}
    return {
        str(r): tuple(str(i) for i in ids)
        for r, ids in per_resource.items()
        if isinstance(ids, list) and ids
    }


def actual_devices(pod: Pod) -> dict[str, dict[str, tuple[str, ...]]]:
    """container → resource name → the device ids it got, as the device plugin reports them
    (empty where it reports none, or the annotation is malformed)."""
    raw = pod.annotation(ALLOCATION_ANNOTATION)
    if not raw:
        return {}
    try:
        doc: Any = json.loads(raw)
        out: dict[str, dict[str, tuple[str, ...]]] = {}
        for name, entry in (doc.get("containers") or {}).items():
            if isinstance(entry, dict) and (got := _ids(entry.get("devices"))):
                out[str(name)] = got
        for name, per_resource in (doc.get("devices") or {}).items():
            if got := _ids(per_resource):
                out.setdefault(str(name), {}).update(got)
        return out
    except (ValueError, AttributeError, TypeError):
        return {}


def report_believed(pod: Pod) -> bool:
    """Whether the ``allocation`` report is the device plugin's: it writes the report and its
    ``allocated`` mark in one patch, so a client that edited the report alone owns it apart."""
    return pod.writers(ALLOCATION_ANNOTATION) <= pod.writers(ALLOCATED_ANNOTATION)


def left_by_binding(pod: Pod) -> bool:
    """No client set ``gpu-assignment`` since the Binding did (managedFields name none)."""
    return not pod.writers(ASSIGNMENT_ANNOTATION)


def fit_requests(pod: Pod, ids: Choice | None) -> Choice | None:
    """The devices ``ids`` names, at the sizes ``pod``'s containers request: as many whole
    devices as each asks (``gpu`` + ``ppu``), its share (``gpu-core``, ``gpu-memory``) on the
    first shared device named for it. The sizes are the pod's spec, which nobody can edit on a
    bound pod; a container ``ids`` names no device for holds nothing here."""
    given = dict(ids.containers) if ids is not None else {}
    out = []
    for r in pod.devices:
        slices = given.get(r.container, ())
        whole = list(dict.fromkeys(s.device for s in slices if s.whole))[: r.gpus + r.ppus]
        new = [Slice(d, whole=True) for d in whole]
        if r.shared and (shared := next((s.device for s in slices if not s.whole), None)):
            new.append(Slice(shared, False, r.core, r.memory_gib))
        if new:
            out.append((r.container, tuple(new)))
    return Choice(tuple(out)) if out else None


def reported(pod: Pod, names: ResourceNames) -> Choice | None:
    """The devices the device plugin reports each container got, sized by the pod's requests
    (None: no report it wrote)."""
    actual = actual_devices(pod) if report_believed(pod) else {}
    ids = Choice(
        tuple(
            (
                name,
                (
                    *(Slice(i, whole=True) for r in (names.gpu, names.ppu) for i in got.get(r, ())),
                    *(Slice(i) for r in (names.gpu_core, names.gpu_memory) for i in got.get(r, ())),
                ),
            )
            for name, got in actual.items()
        )
    )
    return fit_requests(pod, ids) if actual else None


def believed(pod: Pod, annotated: Choice | None) -> bool:
    """Whether a bound pod's ``gpu-assignment``, seen for the first time (a restart, a new
    leader), is the decision its scheduler wrote: left as the Binding set it, and giving each
    container exactly what it requests (what the scheduler always writes)."""
    if annotated is None or not left_by_binding(pod):
        return False
    return _unordered(fit_requests(pod, annotated)) == _unordered(annotated)


def rebuilt(
    pod: Pod, annotated: Choice | None, names: ResourceNames = DEFAULT_NAMES
) -> Choice | None:
    """What a bound pod whose decision is not :func:`believed` holds: the sizes it requests, on
    the devices the device plugin reports each container got, else on those the annotation
    names (the device plugin allocates at admission what the annotation says then, and refuses
    it where it does not fit). Never a size the annotation gives."""
    base = held(pod, fit_requests(pod, annotated), names)
    have = base.containers if base is not None else ()
    report = reported(pod, names)
    named = {name for name, _ in have}
    extra = [c for c in (report.containers if report else ()) if c[0] not in named]
    return Choice((*have, *extra)) if extra else base


def held(pod: Pod, choice: Choice | None, names: ResourceNames = DEFAULT_NAMES) -> Choice | None:
    """What ``pod`` holds: ``choice`` (its decision), with each container's devices replaced by
    the ones the device plugin reports where they differ. Whole devices (``gpu``, ``ppu``) are
    replaced as a set; a share keeps its core and memory and moves to the reported GPU. So a
    container is counted once, on the devices it really has, never on both."""
    if choice is None:
        return None
    actual = actual_devices(pod) if report_believed(pod) else {}
    if not actual:
        return choice
    whole_names, shared_names = (names.gpu, names.ppu), (names.gpu_core, names.gpu_memory)
    out = []
    for name, slices in choice.containers:
        got = actual.get(name)
        if not got:
            out.append((name, slices))
            continue
        whole_ids = [i for r in whole_names for i in got.get(r, ())]
        shared_id = next((ids[0] for r in shared_names if (ids := got.get(r))), None)
        new: list[Slice] = []
        if whole_ids:
            new += [Slice(i, whole=True) for i in dict.fromkeys(whole_ids)]
        else:
            new += [s for s in slices if s.whole]
        for s in slices:
            if not s.whole:
                new.append(Slice(shared_id, False, s.core, s.memory_gib) if shared_id else s)
        out.append((name, tuple(new)))
    return Choice(tuple(out))


def _canonical(choice: Choice | None) -> tuple[tuple[str, tuple[Slice, ...]], ...]:
    """``choice`` as its annotation carries it: a whole device has no share, an empty
    container is absent."""
    if choice is None:
        return ()
    return tuple(
        (name, tuple(Slice(s.device, True) if s.whole else s for s in slices))
        for name, slices in choice.containers
        if slices
    )


def _slice_key(s: Slice) -> tuple[bool, str, int, int]:
    return (s.whole, str(s.device), s.core, s.memory_gib)


def _unordered(choice: Choice | None) -> list[tuple[str, list[tuple[bool, str, int, int]]]]:
    """``choice`` as its annotation carries it, in no particular order of containers or devices."""
    return sorted((name, sorted(map(_slice_key, slices))) for name, slices in _canonical(choice))


def same(a: Choice | None, b: Choice | None) -> bool:
    """Whether two decisions give the same devices (what the annotation can tell apart)."""
    return _canonical(a) == _canonical(b)


def describe(choice: Choice) -> str:
    """A decision for an operator: ``main: gpu-0 (core 60, 8 GiB); eval: gpu-1, gpu-2``."""
    parts = []
    for name, slices in _canonical(choice):
        shown = ", ".join(
            s.device if s.whole else f"{s.device} (core {s.core}, {s.memory_gib} GiB)"
            for s in slices
        )
        parts.append(f"{name}: {shown}")
    return "; ".join(parts) or "no devices"
