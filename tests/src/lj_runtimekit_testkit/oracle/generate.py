"""Seeded cases: case ``i`` of seed ``s`` is the same on every machine, alone or in a run.

Each *family* of scheduling features is a switch (:data:`FAMILIES`); a case draws each enabled
family with some probability, so families meet each other. Families our scheduler does not
implement yet are listed in :data:`PENDING` with the branch that brings them, refused until they
are turned on (``enabled(...)`` raises), so a run never quietly tests less than it says.
Values are small on purpose: few label values, few taint keys, capacities near the requests,
so that a probe fits on some nodes and not on others, for reasons that compete.

A new family: its name and what it covers in :data:`FAMILIES` (out of :data:`PENDING`), its
objects drawn in :class:`_Gen` under ``if "<family>" in self.on`` (values that define topology
domains as ``@name``, node names as ``#n0``, so that each copy gets its own), its rules in
:mod:`.checker` in kube-scheduler's filter order, its reasons' words in :mod:`.messages`; objects
of new kinds (PVs, PriorityClasses, PDBs) created and deleted by the runner with the batch.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping
from typing import Any

from lj_runtimekit_testkit.oracle import checker
from lj_runtimekit_testkit.oracle.cases import Case, NodeSpec, PodSpec
from lj_runtimekit_testkit.oracle.quantities import parse

Json = dict[str, Any]

FAMILIES: dict[str, str] = {
    "node_selector": "spec.nodeSelector on generic and topology labels",
    "node_affinity": "required node affinity: In NotIn Exists DoesNotExist Gt Lt, ORed terms",
    "match_fields": "node affinity on metadata.name (kube-scheduler's PreFilter narrowing)",
    "preferred": "preferred node affinity (scores only)",
    "taints": "node taints (NoSchedule, PreferNoSchedule, NoExecute) and tolerations",
    "unschedulable": "cordoned nodes and the unschedulable toleration",
    "resources": "cpu, memory, ephemeral-storage and an extended resource; limits only",
    "init_containers": "init containers and sidecars (restartPolicy Always) in the requests",
    "pod_resources": "pod-level spec.resources requests",
    "pod_count": "allocatable pods and the pods already on the node",
    "node_ports": "hostPort, hostIP, protocol, on containers and sidecars",
    "scheduling_gates": "spec.schedulingGates",
    "node_name": "a probe created with spec.nodeName (neither scheduler may touch it)",
    "gpu": "aliyun.com/gpu, gpu-core, gpu-memory on NodeDevices inventories (ours only)",
}
PENDING: dict[str, str] = {
    "inter_pod_affinity": "inter-pod affinity and anti-affinity (branch h35a)",
    "topology_spread": "topology spread constraints (branch h35a)",
    "volumes": "PVs, PVCs, StorageClasses, volume limits (branch h35b)",
    "priority": "PriorityClasses, preemption, PDBs (branch h35c)",
}
COMPARED = tuple(f for f in FAMILIES if f != "gpu")
"""The families both schedulers run (the default)."""

GENERIC_LABELS: dict[str, tuple[str, ...]] = {
    "disk": ("ssd", "hdd"),
    "pool": ("a", "b", "c"),
    "tier": ("1", "2", "3", "5", "8"),
    "example.com/accel": ("x", "y"),
}
TOPOLOGY_LABELS: dict[str, tuple[str, ...]] = {
    "topology.kubernetes.io/zone": ("@z0", "@z1", "@z2"),
    "network.topology/rack": ("@r0", "@r1"),
}
TAINT_KEYS = ("dedicated", "example.com/maint", "spot")
TAINT_VALUES = ("", "a", "b")
EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
WIDGET = "example.com/widget"
CPUS = ("50m", "100m", "250m", "500m", "0.3", "1", "1500m", "2")
MEMORIES = ("64Mi", "256Mi", "500M", "1Gi", "1536Mi", "2Gi")
NODE_CPUS = ("1", "2", "2500m", "4")
NODE_MEMORIES = ("1Gi", "2Gi", "3Gi", "4Gi")
PORTS = (8080, 9090)
HOST_IPS = ("", "", "127.0.0.1", "10.0.0.7")
PROTOCOLS = ("TCP", "TCP", "UDP")


def enabled(names: Iterable[str]) -> tuple[str, ...]:
    """The families named, checked: unknown or pending names are refused with the reason."""
    out = []
    for n in names:
        if n in PENDING:
            raise ValueError(f"family {n!r} is not implemented by the scheduler yet: {PENDING[n]}")
        if n not in FAMILIES:
            raise ValueError(f"unknown family {n!r}; known: {', '.join(FAMILIES)}")
        out.append(n)
    return tuple(out)


class _Gen:
    def __init__(self, seed: int, index: int, families: tuple[str, ...]) -> None:
        self.rng = random.Random(f"lj-oracle/{seed}/{index}")
        self.seed, self.index = seed, index
        self.on = {f for f in families if self.rng.random() < 0.4}
        self.target: NodeSpec | None = None
        """The node the probe's constraints are mostly drawn to allow (so that about half of
        the probes fit somewhere)."""
        if not self.on and families:
            self.on.add(self.rng.choice(families))

    def p(self, chance: float) -> bool:
        return self.rng.random() < chance

    def pick(self, seq: tuple[Any, ...] | list[Any]) -> Any:
        return self.rng.choice(seq)

    # ------------------------------------------------------------ nodes
    def node(self, i: int) -> NodeSpec:
        labels: dict[str, str] = {}
        for key, values in {**GENERIC_LABELS, **TOPOLOGY_LABELS}.items():
            if self.p(0.7):
                labels[key] = self.pick(values)
        alloc = {"cpu": self.pick(NODE_CPUS), "memory": self.pick(NODE_MEMORIES), "pods": "110"}
        if "pod_count" in self.on:
            alloc["pods"] = self.pick(("1", "2", "3", "110"))
        if "resources" in self.on:
            if self.p(0.6):
                alloc[WIDGET] = self.pick(("0", "1", "2", "4"))
            if self.p(0.4):
                alloc["ephemeral-storage"] = self.pick(("1Gi", "10Gi"))
        taints: list[dict[str, str]] = []
        if "taints" in self.on:
            for _ in range(self.rng.randint(0, 2)):
                t = {"key": self.pick(TAINT_KEYS), "effect": self.pick(EFFECTS)}
                if value := self.pick(TAINT_VALUES):
                    t["value"] = value
                if all((o["key"], o["effect"]) != (t["key"], t["effect"]) for o in taints):
                    taints.append(t)
        cordoned = "unschedulable" in self.on and self.p(0.2)
        return NodeSpec(f"n{i}", labels, alloc, tuple(taints), cordoned)

    # ------------------------------------------------------------ pod parts
    def requests(self, scale: float = 1.0) -> dict[str, str]:
        req: dict[str, str] = {}
        if self.p(0.8 * scale):
            req["cpu"] = self.pick(CPUS)
        if self.p(0.7 * scale):
            req["memory"] = self.pick(MEMORIES)
        if "resources" in self.on:
            if self.p(0.15):
                req[WIDGET] = self.pick(("1", "2"))
            if self.p(0.2):
                req["ephemeral-storage"] = self.pick(("512Mi", "2Gi"))
        return req

    def container(self, name: str, req: Mapping[str, str]) -> Json:
        c: Json = {"name": name, "image": "busybox"}
        if req:
            if WIDGET in req or ("resources" in self.on and self.p(0.25)):
                # extended resources need limits equal to requests; limits alone default requests
                limits_only = "resources" in self.on and self.p(0.5)
                c["resources"] = (
                    {"limits": dict(req)}
                    if limits_only
                    else {
                        "requests": dict(req),
                        "limits": {k: v for k, v in req.items() if k == WIDGET},
                    }
                )
            else:
                c["resources"] = {"requests": dict(req)}
        return c

    def ports(self) -> list[Json]:
        out = []
        for port in sorted({self.pick(PORTS) for _ in range(self.rng.randint(1, 2))}):
            p: Json = {"containerPort": port, "hostPort": port, "protocol": self.pick(PROTOCOLS)}
            if ip := self.pick(HOST_IPS):
                p["hostIP"] = ip
            out.append(p)
        return out

    def tolerations(self, nodes: tuple[NodeSpec, ...]) -> list[Json]:
        out: list[Json] = []
        seen = [t for n in nodes for t in n.taints]
        if self.target is not None and self.p(0.7):
            seen = list(self.target.taints) or seen
        for _ in range(self.rng.randint(0, 3) if seen else self.rng.randint(0, 1)):
            if seen and self.p(0.8):
                t = self.pick(seen)
                tol: Json = {"key": t["key"]}
                if self.p(0.5) or not t.get("value"):
                    tol["operator"] = "Exists"
                else:
                    tol["operator"] = "Equal"
                    tol["value"] = t["value"] if self.p(0.8) else "other"
                if self.p(0.6):
                    tol["effect"] = t["effect"] if self.p(0.8) else self.pick(EFFECTS)
            else:
                tol = {"key": self.pick(TAINT_KEYS), "operator": "Exists"}
            if tol.get("effect") == "NoExecute" and self.p(0.3):
                tol["tolerationSeconds"] = 3600
            out.append(tol)
        if self.p(0.06):
            out.append({"operator": "Exists"})
        if "unschedulable" in self.on and self.p(0.3):
            out.append(
                {
                    "key": "node.kubernetes.io/unschedulable",
                    "operator": "Exists",
                    "effect": "NoSchedule",
                }
            )
        return out

    def value_of(self, key: str, nodes: tuple[NodeSpec, ...]) -> str:
        """A value some node has for ``key`` (mostly), else any value of the vocabulary."""
        target = self.target
        if target is not None and key in target.labels and self.p(0.85):
            return target.labels[key]
        have = [n.labels[key] for n in nodes if key in n.labels]
        if have and self.p(0.75):
            return str(self.pick(have))
        vocab = {**GENERIC_LABELS, **TOPOLOGY_LABELS}.get(key, ("none",))
        return str(self.pick(vocab))

    def expression(self, nodes: tuple[NodeSpec, ...]) -> Json:
        target = self.target
        if target is not None and target.labels and self.p(0.8):
            key = self.pick(sorted(target.labels))  # one the target node passes
            if self.p(0.5):
                return {"key": key, "operator": "Exists"}
            return {"key": key, "operator": "In", "values": [target.labels[key]]}
        key = self.pick([*GENERIC_LABELS, *TOPOLOGY_LABELS, "kubernetes.io/hostname"])
        op = self.pick(("In", "In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"))
        if key == "kubernetes.io/hostname":
            names = [f"#{n.name}" for n in nodes] + ["#nx"]
            return {
                "key": key,
                "operator": self.pick(("In", "NotIn")),
                "values": sorted(set(self.rng.sample(names, self.rng.randint(1, 2)))),
            }
        if op in ("Gt", "Lt"):
            key = "tier"
            return {"key": key, "operator": op, "values": [self.pick(("0", "2", "3", "6"))]}
        if op in ("Exists", "DoesNotExist"):
            return {"key": key, "operator": op}
        values = sorted({self.value_of(key, nodes) for _ in range(self.rng.randint(1, 2))})
        return {"key": key, "operator": op, "values": values}

    def node_affinity(self, nodes: tuple[NodeSpec, ...]) -> Json:
        aff: Json = {}
        terms: list[Json] = []
        if "node_affinity" in self.on or "match_fields" in self.on:
            for _ in range(self.rng.randint(1, 2)):
                term: Json = {}
                if "node_affinity" in self.on and self.p(0.9):
                    term["matchExpressions"] = [
                        self.expression(nodes) for _ in range(self.rng.randint(1, 2))
                    ]
                if "match_fields" in self.on and self.p(0.7):
                    names = [f"#{n.name}" for n in nodes] + ["#nx"]
                    fields = []
                    for _ in range(self.rng.randint(1, 2)):
                        if self.target is not None and self.p(0.6):
                            fields.append(
                                {
                                    "key": "metadata.name",
                                    "operator": "In",
                                    "values": [f"#{self.target.name}"],
                                }
                            )
                        else:
                            fields.append(
                                {
                                    "key": "metadata.name",
                                    "operator": self.pick(("In", "NotIn")),
                                    "values": [self.pick(names)],
                                }
                            )
                    term["matchFields"] = fields
                terms.append(term)  # an empty term matches no node
            aff["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": terms}
        if "preferred" in self.on:
            aff["preferredDuringSchedulingIgnoredDuringExecution"] = [
                {
                    "weight": self.rng.randint(1, 100),
                    "preference": {"matchExpressions": [self.expression(nodes)]},
                }
            ]
        return aff

    # ------------------------------------------------------------ pods
    def existing(self, nodes: tuple[NodeSpec, ...]) -> list[PodSpec]:
        """Pods bound to the nodes with ``nodeName`` that fit there (an overcommitted node is
        no case either scheduler should meet); they tolerate their node's NoExecute taints, or
        the taint manager would evict them while the case runs."""
        out: list[PodSpec] = []
        for node in nodes:
            placed: list[Json] = []
            want = self.rng.randint(0, 3 if "pod_count" in self.on else 2)
            for j in range(want):
                spec: Json = {"containers": [self.container("main", self.requests(0.9))]}
                if "node_ports" in self.on and self.p(0.4):
                    spec["containers"][0]["ports"] = self.ports()
                noexec = [t for t in node.taints if t["effect"] == "NoExecute"]
                if noexec:
                    spec["tolerations"] = [
                        {"key": t["key"], "operator": "Exists", "effect": "NoExecute"}
                        for t in noexec
                    ]
                if _fits(spec, node, placed):
                    placed.append(
                        {"spec": {**_defaulted(spec), "nodeName": node.name}, "metadata": {}}
                    )
                    out.append(PodSpec(f"{node.name}-e{j}", spec, {"app": f"e{j}"}, node.name))
        return out

    def probe(self, nodes: tuple[NodeSpec, ...]) -> PodSpec:
        self.target = self.pick(nodes)
        containers = [self.container("main", self.requests())]
        if self.p(0.3):
            containers.append(self.container("helper", self.requests(0.5)))
        spec: Json = {"containers": containers}
        if "init_containers" in self.on:
            inits = []
            for k in range(self.rng.randint(1, 3)):
                c = self.container(f"init{k}", self.requests())
                if self.p(0.5):
                    c["restartPolicy"] = "Always"
                inits.append(c)
            spec["initContainers"] = inits
        if "pod_resources" in self.on:
            level = _pod_level_floor(spec)
            for r, options in (("cpu", CPUS), ("memory", MEMORIES)):
                pick = self.pick(options)
                if parse(pick) >= level.get(r, 0) and self.p(0.8):
                    level[r] = parse(pick)
            spec["resources"] = {"requests": {k: _quantity(k, v) for k, v in level.items()}}
        if "node_ports" in self.on:
            # a regular init container's ports count for neither scheduler; a sidecar's do
            target = self.pick([*containers, *spec.get("initContainers", [])])
            target["ports"] = self.ports()
        if "node_selector" in self.on:
            selector = {}
            keys = [*GENERIC_LABELS, *TOPOLOGY_LABELS]
            if self.p(0.7) and self.target.labels:
                keys = sorted(self.target.labels)
            for key in self.rng.sample(keys, min(len(keys), self.rng.randint(1, 2))):
                selector[key] = self.value_of(key, nodes)
            spec["nodeSelector"] = selector
        if aff := self.node_affinity(nodes):
            spec["affinity"] = {"nodeAffinity": aff}
        if ("taints" in self.on or "unschedulable" in self.on) and (
            tols := self.tolerations(nodes)
        ):
            spec["tolerations"] = tols
        if "scheduling_gates" in self.on and self.p(0.2):
            spec["schedulingGates"] = [{"name": "example.com/wait"}]
        if "node_name" in self.on and "schedulingGates" not in spec and self.p(0.15):
            spec["nodeName"] = f"#{self.pick(nodes).name}"
        return PodSpec("probe", spec, {"app": "probe"})

    def case(self) -> Case:
        nodes = tuple(self.node(i) for i in range(self.rng.randint(1, 4)))
        existing = tuple(self.existing(nodes))
        return Case(
            self.seed, self.index, tuple(sorted(self.on)), nodes, existing, (self.probe(nodes),)
        )


def _defaulted(spec: Json) -> Json:
    """``spec`` with each container's requests defaulted from its limits, as the apiserver
    stores it."""

    def one(c: Json) -> Json:
        res = c.get("resources") or {}
        both = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        return {**c, "resources": {"requests": both}}

    out = {**spec, "containers": [one(c) for c in spec.get("containers") or ()]}
    if spec.get("initContainers"):
        out["initContainers"] = [one(c) for c in spec["initContainers"]]
    return out


def _fits(spec: Json, node: NodeSpec, placed: list[Json]) -> bool:
    pod = {"spec": _defaulted(spec), "metadata": {}}
    fake = {
        "metadata": {"name": node.name, "labels": {}},
        "spec": {},
        "status": {"allocatable": dict(node.allocatable)},
    }
    used = [p for other in placed for p in checker.host_ports(other)]
    if checker.ports_conflict(checker.host_ports(pod), used):
        return False
    return not checker.resource_reasons(checker.pod_requests(pod), fake, placed)


def _pod_level_floor(spec: Json) -> dict[str, Any]:
    """The containers' own cpu/memory requests, summed exactly: pod-level requests may not be
    less (the apiserver refuses the pod)."""
    total = checker.pod_requests({"spec": _defaulted(spec), "metadata": {}})
    out: dict[str, Any] = {}
    if "cpu" in total:
        out["cpu"] = parse(f"{total['cpu']}m")
    if "memory" in total:
        out["memory"] = parse(str(total["memory"]))
    return out


def _quantity(resource: str, value: Any) -> str:
    if resource == "cpu":
        return f"{math.ceil(value * 1000)}m"
    return str(math.ceil(value))


def generate(seed: int, index: int, families: tuple[str, ...] = COMPARED) -> Case:
    """Case ``index`` of ``seed`` with the families drawn from ``families``."""
    if "gpu" in families:
        from lj_runtimekit_testkit.oracle.gpu import gpu_case

        return gpu_case(seed, index)
    return _Gen(seed, index, enabled(families)).case()


def generate_many(
    seed: int, count: int, families: tuple[str, ...] = COMPARED, start: int = 0
) -> list[Case]:
    return [generate(seed, i, families) for i in range(start, start + count)]
