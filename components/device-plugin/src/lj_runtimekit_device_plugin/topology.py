"""GetPreferredAllocation for whole devices: topology first, fragmentation second. Pure.

Preference, strongest first: all devices in one NVLink island, then under one PCIe switch, then
on one NUMA node. Among groups that fit, the smallest one that fits wins (best fit), so the free
devices left stay in the largest connected groups. A request that cannot fit in one group takes
whole small groups first and splits as few groups as it can.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from .model import Device


@dataclass(frozen=True)
class Topology:
    """Per device id: its NVLink island, PCIe switch group and NUMA node, plus an order."""

    island: Mapping[str, int]
    switch: Mapping[str, int]
    numa: Mapping[str, int]
    order: Mapping[str, int]


def _components(ids: Sequence[str], edges: Iterable[tuple[str, str]]) -> dict[str, int]:
    parent = {i: i for i in ids}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in edges:
        if a in parent and b in parent:
            parent[find(a)] = find(b)
    roots: dict[str, int] = {}
    return {i: roots.setdefault(find(i), len(roots)) for i in ids}


def topology(devices: Iterable[Device]) -> Topology:
    """The groups of ``devices`` from their links (a link counts from either side)."""
    devs = sorted(devices, key=lambda d: (d.index, d.id))
    ids = [d.id for d in devs]

    def edges(kind: str) -> list[tuple[str, str]]:
        return [(d.id, link.peer_id) for d in devs for link in d.links if link.type == kind]

    return Topology(
        island=_components(ids, edges("nvlink")),
        switch=_components(ids, edges("pcie_switch")),
        numa={d.id: d.numa_node for d in devs},
        order={d.id: n for n, d in enumerate(devs)},
    )


Key = Callable[[str], object]


def _pick(pool: list[str], must: list[str], size: int, keys: Sequence[Key]) -> list[str]:
    """``size`` ids from ``pool`` (which holds ``must``), must first."""
    if len(must) >= size or not keys:
        rest = [i for i in pool if i not in must]
        return (must + rest)[: max(size, len(must))]
    key, finer = keys[0], keys[1:]
    groups: dict[object, list[str]] = {}
    for i in pool:
        groups.setdefault(key(i), []).append(i)
    must_keys = {key(i) for i in must}
    fitting = [
        g for k, g in groups.items() if len(g) >= size and (not must_keys or must_keys == {k})
    ]
    if fitting:
        best = min(fitting, key=lambda g: (len(g), g[0] if g else ""))
        return _pick(best, must, size, finer)
    # Span groups: those holding must-include ids first, then whole groups that fit entirely
    # (smallest first, so no group is split), then the remainder from the best-fitting group.
    chosen = list(must)
    touched = [g for k, g in groups.items() if k in must_keys]
    for g in touched:
        for i in g:
            if len(chosen) < size and i not in chosen:
                chosen.append(i)
    others = sorted((g for k, g in groups.items() if k not in must_keys), key=len)
    for g in list(others):
        if len(chosen) + len(g) <= size:
            chosen.extend(g)
            others.remove(g)
    need = size - len(chosen)
    if need > 0 and others:
        fit = [g for g in others if len(g) >= need]
        g = min(fit, key=len) if fit else max(others, key=len)
        chosen.extend(_pick(g, [], min(need, len(g)), finer))
    return chosen[:size]


def preferred(
    topo: Topology, available: Iterable[str], must_include: Iterable[str], size: int
) -> list[str]:
    """The ``size`` device ids to prefer from ``available``.

    Guarantees: every returned id is in ``available`` (the kubelet passes only healthy, free
    ids) or in ``must_include``; every must-include id is returned (even beyond ``size``, which
    the kubelet never asks); no id twice; fewer than ``size`` only when too few are available.
    """
    order = topo.order
    must = sorted(dict.fromkeys(must_include), key=lambda i: (order.get(i, 1 << 30), i))
    pool = sorted(set(available) | set(must), key=lambda i: (order.get(i, 1 << 30), i))
    if size <= 0:
        return must

    def grouped(m: Mapping[str, int]) -> Key:
        # an id the topology does not know stands alone
        return lambda i: m.get(i, f"unknown:{i}")

    keys = (grouped(topo.island), grouped(topo.switch), grouped(topo.numa))
    return _pick(pool, must, min(size, len(pool)), keys)


def first_fit(topo: Topology, available: Iterable[str], size: int) -> list[str]:
    """The naive choice, the lowest ``size`` ids: the baseline the property test compares to."""
    return sorted(available, key=lambda i: (topo.order.get(i, 1 << 30), i))[:size]


def fragmentation(topo: Topology, free: Iterable[str]) -> float:
    """How scattered the free devices are: 1 - (largest free island share). 0 is best."""
    counts: dict[object, int] = {}
    free = list(free)
    for i in free:
        k = topo.island.get(i, -1 - len(counts))
        counts[k] = counts.get(k, 0) + 1
    if not free:
        return 0.0
    return 1.0 - max(counts.values()) / len(free)
