"""Which concrete devices a pod gets on a node: pure, deterministic.

Guarantees of :func:`choose`: every chosen device is healthy and of the right kind; a whole
device is never shared and never given twice; a shared slice never exceeds the device's free
core (100 per GPU) or free memory; multi-device containers stay on one NVLink island, else one
NUMA node, whenever the node has such a set free. A partition (MIG instance, TDM slice) is given
only to a container asking one GPU, and only when no unpartitioned GPU is idle: CUDA shows a
process one MIG instance, and a GPU asked for whole should be one. Partitions are never shared.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .model import CORE_PER_GPU, Device, DeviceRequest, DeviceUse


@dataclass(frozen=True)
class Slice:
    """One device given to a container: whole, or ``core``/``memory_gib`` of it."""

    device: str
    whole: bool = False
    core: int = 0
    memory_gib: int = 0


@dataclass(frozen=True)
class Choice:
    """The devices of each container of one pod on one node."""

    containers: tuple[tuple[str, tuple[Slice, ...]], ...]


class NoFit(Exception):
    """The node cannot give the pod its devices; the message says which device or domain."""


def _free_core(d: Device, u: DeviceUse) -> int:
    return 0 if u.whole else CORE_PER_GPU - u.core


def _free_mem(d: Device, u: DeviceUse) -> int:
    return 0 if u.whole else d.memory_gib - u.memory_gib


def _idle(u: DeviceUse) -> bool:
    return not u.whole and u.core == 0 and u.memory_gib == 0


def _pick_whole(
    devs: Sequence[Device], uses: Mapping[str, DeviceUse], n: int, kind: str, strategy: str
) -> list[Device]:
    free = [d for d in devs if d.kind == kind and d.healthy and _idle(uses.get(d.id, DeviceUse()))]
    whole = [d for d in free if not d.partition_of]
    if n == 1 and not whole and free:
        return [min(free, key=lambda d: (d.index, d.id))]
    if len(whole) < n:
        healthy = sum(1 for d in devs if d.kind == kind and d.healthy and not d.partition_of)
        parts = len(free) - len(whole)
        raise NoFit(
            f"{n} whole {kind} wanted, {len(whole)} idle of {healthy} healthy"
            + (f" ({parts} idle partitions serve 1-GPU containers only)" if parts else "")
        )
    free = whole
    for domain in ("island", "numa"):
        groups: dict[int, list[Device]] = {}
        for d in free:
            key = getattr(d, domain)
            if key >= 0:
                groups.setdefault(key, []).append(d)
        fitting = [g for g in groups.values() if len(g) >= n]
        if fitting:
            # binpack: the tightest domain keeps larger ones whole; spread: the roomiest
            fitting.sort(key=lambda g: (len(g) if strategy == "binpack" else -len(g), g[0].index))
            return sorted(fitting[0], key=lambda d: d.index)[:n]
    return sorted(free, key=lambda d: (d.island, d.numa, d.index))[:n]


def _pick_shared(
    devs: Sequence[Device], uses: Mapping[str, DeviceUse], core: int, mem: int, strategy: str
) -> Device:
    best: tuple[tuple[int, int, int], Device] | None = None
    for d in devs:
        if d.kind != "GPU" or not d.healthy or d.partition_of:
            continue
        u = uses.get(d.id, DeviceUse())
        fc, fm = _free_core(d, u), _free_mem(d, u)
        if fc < core or fm < mem:
            continue
        left = (fc - core) * 1000 + (fm - mem)
        # binpack: the device left with least, touching an idle one last; spread: the emptiest
        key = (int(_idle(u)), left, d.index) if strategy == "binpack" else (-left, 0, d.index)
        if best is None or key < best[0]:
            best = (key, d)
    if best is None:
        frees = (
            ", ".join(
                f"{d.id}: {_free_core(d, uses.get(d.id, DeviceUse()))} core "
                f"{_free_mem(d, uses.get(d.id, DeviceUse()))} GiB"
                for d in devs
                if d.kind == "GPU" and d.healthy and not d.partition_of
            )
            or "no healthy GPU"
        )
        raise NoFit(f"no GPU has {core} core and {mem} GiB free ({frees})")
    return best[1]


def choose(
    devs: Sequence[Device],
    uses: Mapping[str, DeviceUse],
    requests: Sequence[DeviceRequest],
    strategy: str = "binpack",
) -> Choice:
    """The devices for every container, or :class:`NoFit` naming what blocked it."""
    work = dict(uses)
    out: list[tuple[str, tuple[Slice, ...]]] = []
    for r in requests:
        slices: list[Slice] = []
        for n, kind in ((r.gpus, "GPU"), (r.ppus, "PPU")):
            if n:
                for d in _pick_whole(devs, work, n, kind, strategy):
                    work[d.id] = DeviceUse(whole=True)
                    slices.append(Slice(d.id, whole=True))
        if r.shared:
            core = r.core if r.core else 0
            d = _pick_shared(devs, work, core, r.memory_gib, strategy)
            u = work.get(d.id, DeviceUse())
            work[d.id] = DeviceUse(False, u.core + core, u.memory_gib + r.memory_gib)
            slices.append(Slice(d.id, core=core, memory_gib=r.memory_gib))
        out.append((r.container, tuple(slices)))
    return Choice(tuple(out))


def apply(uses: Mapping[str, DeviceUse], choice: Choice) -> dict[str, DeviceUse]:
    """The device uses after ``choice`` is held."""
    work = dict(uses)
    for _, slices in choice.containers:
        for s in slices:
            u = work.get(s.device, DeviceUse())
            if s.whole:
                work[s.device] = DeviceUse(whole=True)
            else:
                work[s.device] = DeviceUse(False, u.core + s.core, u.memory_gib + s.memory_gib)
    return work


def release(uses: Mapping[str, DeviceUse], choice: Choice) -> dict[str, DeviceUse]:
    """The device uses after ``choice`` is given back (inverse of :func:`apply`)."""
    work = dict(uses)
    for _, slices in choice.containers:
        for s in slices:
            u = work.get(s.device, DeviceUse())
            if s.whole:
                work.pop(s.device, None)
            else:
                nu = DeviceUse(False, max(0, u.core - s.core), max(0, u.memory_gib - s.memory_gib))
                work[s.device] = nu
                if _idle(nu):
                    work.pop(s.device)
    return work


def score(devs: Sequence[Device], uses: Mapping[str, DeviceUse], strategy: str) -> int:
    """0-100 for the node after placement: utilisation (binpack) or idleness (spread), minus
    fragmentation — core stranded on partly used GPUs, which neither whole nor large shared
    requests can use."""
    gpus = [d for d in devs if d.healthy]
    if not gpus:
        return 0
    used = stranded = 0
    for d in gpus:
        u = uses.get(d.id, DeviceUse())
        c = CORE_PER_GPU if u.whole else u.core
        used += c
        if not u.whole and not _idle(u):
            stranded += CORE_PER_GPU - u.core
    total = CORE_PER_GPU * len(gpus)
    util, frag = used / total, stranded / total
    base = util if strategy == "binpack" else 1.0 - util
    return max(0, min(100, round(100 * base - 50 * frag)))


def locality(devs: Sequence[Device], choice: Choice) -> int:
    """0-100: 100 when each multi-device container sits on one NVLink island, 50 one NUMA."""
    by_id = {d.id: d for d in devs}
    worst = 100
    for _, slices in choice.containers:
        whole = [by_id[s.device] for s in slices if s.whole and s.device in by_id]
        if len(whole) < 2:
            continue
        if len({d.island for d in whole}) == 1 and whole[0].island >= 0:
            continue
        worst = min(worst, 50 if len({d.numa for d in whole}) == 1 and whole[0].numa >= 0 else 0)
    return worst
