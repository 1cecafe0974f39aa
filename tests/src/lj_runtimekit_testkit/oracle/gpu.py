"""GPU cases: our scheduler only (kube-scheduler counts ``aliyun.com/gpu*`` as plain extended
resources and chooses no device; GPU choice and gangs are intended differences), judged by the
checker from the contract of docs/contracts.md:

- every bound pod went to a node labelled ``lj_runtimekit_enable=true`` with a NodeDevices
  inventory, satisfies every other rule (:mod:`.checker`, which also counts the extended
  resources against what the node advertises), and carries a ``gpu-assignment`` for that node
  naming, per container, exactly what it asks: ``n`` whole healthy devices, or one device with
  the core and GiB of its share;
- no device is given whole twice, or whole and shared; shares of one device sum to at most 100
  core and its memory;
- a refused pod had no room: on no eligible node (with the final placements) are there enough
  idle healthy devices, or one device with the share free — else our scheduler refused a pod
  it could place.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lj_runtimekit_testkit.oracle import checker
from lj_runtimekit_testkit.oracle.cases import OURS, Case, NodeSpec, PodSpec

Json = dict[str, Any]
GPU, CORE, MEMORY = "aliyun.com/gpu", "aliyun.com/gpu-core", "aliyun.com/gpu-memory"
FEATURE_LABEL = "lj_runtimekit_enable"
ASSIGNMENT = "lj-runtimekit-scheduler/gpu-assignment"


def gpu_case(seed: int, index: int) -> Case:
    rng = random.Random(f"lj-oracle-gpu/{seed}/{index}")
    nodes = []
    for i in range(rng.randint(1, 3)):
        count = rng.randint(1, 4)
        memory = rng.choice((16, 40, 80))
        devices = tuple(
            {
                "id": f"gpu-{d}",
                "kind": "GPU",
                "index": d,
                "memoryBytes": memory * 2**30,
                "healthy": rng.random() > 0.1,
                "numaNode": d // 2,
                "nvlinkIsland": d // 2,
            }
            for d in range(count)
        )
        labels = {FEATURE_LABEL: "true"} if rng.random() > 0.1 else {}
        alloc = {
            "cpu": "8",
            "memory": "32Gi",
            "pods": "110",
            GPU: str(count),
            CORE: str(100 * count),
            MEMORY: str(memory * count),
        }
        nodes.append(NodeSpec(f"n{i}", labels, alloc, devices=devices))
    probes = []
    for j in range(rng.randint(1, 4)):
        if rng.random() < 0.5:
            ask = {GPU: str(rng.randint(1, 3))}
        else:
            ask = {
                CORE: str(rng.choice((10, 25, 50, 60, 100))),
                MEMORY: str(rng.choice((1, 8, 20, 40))),
            }
        ask["cpu"] = "100m"
        container = {
            "name": "main",
            "image": "busybox",
            "resources": {
                "requests": dict(ask),
                "limits": {k: v for k, v in ask.items() if k != "cpu"},
            },
        }
        probes.append(PodSpec(f"g{j}", {"containers": [container]}, {"app": "gpu"}))
    return Case(seed, index, ("gpu",), tuple(nodes), (), tuple(probes), gpu=True)


@dataclass
class _Use:
    whole: int = 0
    core: int = 0
    memory: int = 0
    holders: list[str] = field(default_factory=list)


def _asks(pod: Json) -> list[tuple[str, int, int, int]]:
    """(container, whole GPUs, core, GiB) of each container asking our GPUs."""
    out = []
    for c in pod["spec"].get("containers") or ():
        lim = {
            **((c.get("resources") or {}).get("requests") or {}),
            **((c.get("resources") or {}).get("limits") or {}),
        }
        g, core, mem = (int(lim.get(k, 0)) for k in (GPU, CORE, MEMORY))
        if g or core or mem:
            out.append((c["name"], g, core, mem))
    return out


def _inventory(devices: Mapping[str, Json], node: str) -> dict[str, Json]:
    obj = devices.get(node)
    return {d["id"]: d for d in ((obj or {}).get("status") or {}).get("devices") or ()}


def judge(
    case: Case, observed: Sequence[Any], final: Any, devices: Mapping[str, Json]
) -> list[Any]:
    from lj_runtimekit_testkit.oracle.judge import BOUND, REFUSED, Finding

    found: list[Finding] = []

    def add(what: str, detail: str) -> None:
        found.append(Finding(case, what, detail, list(observed)))

    uses: dict[tuple[str, str], _Use] = {}
    pods = {p["metadata"]["uid"]: p for p in final.pods}
    for o in observed:
        if o.verdict not in (BOUND, REFUSED):
            add("undecided", f"{o.copy.who} {o.pod['metadata']['name']}: {o.verdict}")
            continue
        if o.verdict != BOUND:
            continue
        pod = pods.get(o.pod["metadata"]["uid"], o.pod)
        node = next((n for n in final.nodes if n["metadata"]["name"] == o.node), None)
        labels = (node or {}).get("metadata", {}).get("labels") or {}
        if labels.get(FEATURE_LABEL) != "true":
            add("placement", f"{o.node} is not labelled {FEATURE_LABEL}=true")
        bad = checker.placement_violations(pod, o.node, final.nodes, final.pods)
        if bad:
            add("placement", f"on {o.node}: {'; '.join(bad)}")
        raw = (pod["metadata"].get("annotations") or {}).get(ASSIGNMENT)
        if not raw:
            add("placement", f"no {ASSIGNMENT} on a bound GPU pod")
            continue
        doc = json.loads(raw)
        if doc.get("node") != o.node:
            add("placement", f"the assignment names {doc.get('node')}, the pod is on {o.node}")
        inv = _inventory(devices, o.node or "")
        given = {c["name"]: c.get("devices") or [] for c in doc.get("containers") or ()}
        for name, g, core, mem in _asks(pod):
            got = given.get(name, [])
            if g and (len(got) != g or not all(d.get("whole") for d in got)):
                add("placement", f"container {name} asks {g} GPUs, got {got}")
            if (core or mem) and (
                len(got) != 1 or got[0].get("core") != core or got[0].get("memoryGiB") != mem
            ):
                add("placement", f"container {name} asks {core} core {mem} GiB, got {got}")
            for d in got:
                dev = inv.get(d["id"])
                if dev is None or dev.get("healthy") is not True:
                    add("placement", f"device {d['id']} on {o.node}: missing or unhealthy")
                    continue
                use = uses.setdefault((o.node or "", d["id"]), _Use())
                use.holders.append(pod["metadata"]["name"])
                use.whole += 1 if d.get("whole") else 0
                use.core += int(d.get("core") or 0)
                use.memory += int(d.get("memoryGiB") or 0)
    for (node, dev_id), use in uses.items():
        memory = _inventory(devices, node)[dev_id]["memoryBytes"] // 2**30
        if use.whole > 1 or (use.whole and (use.core or use.memory)):
            add("placement", f"{node}/{dev_id} given whole and more: {use.holders}")
        if use.core > 100 or use.memory > memory:
            add(
                "placement",
                f"{node}/{dev_id} over-shared ({use.core} core, {use.memory} GiB): {use.holders}",
            )
    for o in observed:
        if o.verdict == REFUSED and (room := _room(o.pod, final, devices, uses)):
            add("verdict", f"{o.pod['metadata']['name']} refused, but {room} had room for it")
    return found


def _room(
    pod: Json, final: Any, devices: Mapping[str, Json], uses: Mapping[tuple[str, str], _Use]
) -> str | None:
    """A node where ``pod`` would fit now by the contract's rules, or None."""
    for node in final.nodes:
        name = node["metadata"]["name"]
        if (node["metadata"].get("labels") or {}).get(
            FEATURE_LABEL
        ) != "true" or name not in devices:
            continue
        if checker.placement_violations(pod, name, final.nodes, final.pods):
            continue
        free = {i: d for i, d in _inventory(devices, name).items() if d.get("healthy") is True}
        ok = True
        for _, g, core, mem in _asks(pod):
            idle = [i for i in free if (name, i) not in uses]
            if g and len(idle) < g:
                ok = False
            if core or mem:
                fits = [
                    i
                    for i, d in free.items()
                    if not (u := uses.get((name, i), _Use())).whole
                    and 100 - u.core >= core
                    and d["memoryBytes"] // 2**30 - u.memory >= mem
                ]
                ok = ok and bool(fits)
        if ok:
            return str(name)
    return None


__all__ = ["OURS", "gpu_case", "judge"]
