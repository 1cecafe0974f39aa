"""The independent checker: what the Kubernetes API says a placement must satisfy.

Pure Python over the objects as the apiserver returns them (JSON), written from the API's
semantics and kube-scheduler's documented filter order — no code shared with
``lj-runtimekit-scheduler``. For a pod and a cluster state it says, per node, the first rule the
node breaks, worded as kube-scheduler words it, so it predicts both whether the pod fits anywhere
and kube-scheduler's ``FailedScheduling`` histogram ("0/N nodes are available: ...").

The rules, in kube-scheduler's filter order (its default profile, v1.37):

- NodeName: ``spec.nodeName``, when set, names the node;
- NodeUnschedulable: a cordoned node only for a pod tolerating
  ``node.kubernetes.io/unschedulable:NoSchedule``;
- TaintToleration: every ``NoSchedule``/``NoExecute`` taint tolerated;
- NodeAffinity: ``nodeSelector`` (every pair) and required node affinity (terms ORed, an empty
  term matches nothing; ``In NotIn Exists DoesNotExist Gt Lt``; ``matchFields`` on
  ``metadata.name``). When every term names nodes with ``metadata.name In``, only those nodes are
  considered at all (PreFilter): the others are "didn't satisfy plugin(s) [NodeAffinity]", and no
  name left at all is "pod affinity terms conflict";
- NodePorts: a (protocol, hostIP, hostPort) of the pod's containers and sidecars once per node,
  ``0.0.0.0`` (or no hostIP) conflicting with every IP;
- NodeResourcesFit: pod count, then cpu, memory, ephemeral-storage and every other resource the
  pod asks: requests as the API computes them (containers and sidecars summed, each regular init
  container with the sidecars before it, the larger of the two; pod-level ``spec.resources``
  requests for cpu/memory/hugepages replace the containers' sum; ``spec.overhead`` added), summed
  exactly and rounded up once per pod, against allocatable minus what the node's pods request.
- SchedulingGates: a pod with ``spec.schedulingGates`` is not tried at all.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from lj_runtimekit_testkit.oracle.quantities import parse, round_up

Json = dict[str, Any]

UNSCHEDULABLE_TAINT = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
NODE_NAME = "node(s) didn't match the requested node name"
UNSCHEDULABLE = "node(s) were unschedulable"
AFFINITY = "node(s) didn't match Pod's node affinity/selector"
AFFINITY_CONFLICT = "pod affinity terms conflict"
PREFILTERED = "node(s) didn't satisfy plugin(s) [NodeAffinity]"
PORTS = "node(s) didn't have free ports for the requested pod ports"
TOO_MANY_PODS = "Too many pods"
POD_LEVEL = ("cpu", "memory")
"""Resources pod-level ``spec.resources`` may set (and ``hugepages-*``)."""


UNTOLERATED = "node(s) had untolerated taint(s)"
"""kube-scheduler names no taint (v1.37; before, ``untolerated taint {key: value}``)."""


# ---------------------------------------------------------------- tolerations and affinity
def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """``v1.Toleration.ToleratesTaint``: effect and key when given, then Equal or Exists."""
    effect, key = toleration.get("effect") or "", toleration.get("key") or ""
    if effect and effect != taint.get("effect"):
        return False
    if key and key != taint.get("key"):
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    return operator == "Equal" and (toleration.get("value") or "") == (taint.get("value") or "")


def _tolerated(pod: Json, taint: Mapping[str, Any]) -> bool:
    return any(tolerates(t, taint) for t in pod["spec"].get("tolerations") or ())


def _integer(text: str) -> int | None:
    try:
        return int(text, 10)
    except ValueError:
        return None


def requirement_holds(req: Mapping[str, Any], value: str | None) -> bool:
    """One ``matchExpressions``/``matchFields`` entry against the label (field) value, None when
    the node has no such label."""
    op, values = req["operator"], list(req.get("values") or ())
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt"):
        if value is None or len(values) != 1:
            return False
        have, bound = _integer(value), _integer(values[0])
        if have is None or bound is None:
            return False
        return have > bound if op == "Gt" else have < bound
    return False


def term_matches(term: Mapping[str, Any], node: Json) -> bool:
    exprs, fields = term.get("matchExpressions") or (), term.get("matchFields") or ()
    if not exprs and not fields:
        return False
    labels = node["metadata"].get("labels") or {}
    name = node["metadata"]["name"]
    return all(requirement_holds(r, labels.get(r["key"])) for r in exprs) and all(
        requirement_holds(r, name if r["key"] == "metadata.name" else None) for r in fields
    )


def _required_terms(pod: Json) -> list[Json] | None:
    aff = ((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    return None if aff is None else list(aff.get("nodeSelectorTerms") or ())


def affinity_matches(pod: Json, node: Json) -> bool:
    labels = node["metadata"].get("labels") or {}
    selector = pod["spec"].get("nodeSelector") or {}
    if any(labels.get(k) != v for k, v in selector.items()):
        return False
    terms = _required_terms(pod)
    return terms is None or any(term_matches(t, node) for t in terms)


def prefiltered_names(pod: Json) -> set[str] | None:
    """The nodes NodeAffinity's PreFilter limits the pod to (None: all of them): when every
    required term has ``metadata.name In`` requirements, the union over terms of each term's
    intersection."""
    terms = _required_terms(pod)
    if not terms:
        return None
    names: set[str] = set()
    for term in terms:
        ins = [
            set(r.get("values") or ())
            for r in term.get("matchFields") or ()
            if r["key"] == "metadata.name" and r["operator"] == "In"
        ]
        if not ins:
            return None
        names |= set.intersection(*ins)
    return names


# ---------------------------------------------------------------- ports and resources
def host_ports(pod: Json) -> list[tuple[str, str, int]]:
    """(protocol, hostIP, hostPort) of the containers and the sidecars (restartable init
    containers run for the whole life of the pod; other init containers do not count)."""
    spec = pod["spec"]
    containers = [c for c in spec.get("initContainers") or () if c.get("restartPolicy") == "Always"]
    containers += list(spec.get("containers") or ())
    return [
        (p.get("protocol") or "TCP", p.get("hostIP") or "0.0.0.0", int(p["hostPort"]))
        for c in containers
        for p in c.get("ports") or ()
        if int(p.get("hostPort") or 0) > 0
    ]


def ports_conflict(
    wanted: Iterable[tuple[str, str, int]], used: Sequence[tuple[str, str, int]]
) -> bool:
    for proto, ip, port in wanted:
        for uproto, uip, uport in used:
            same_port = (proto, port) == (uproto, uport)
            if same_port and (ip == uip or "0.0.0.0" in (ip, uip)):
                return True
    return False


def _add(into: dict[str, Fraction], raw: Mapping[str, Any] | None) -> None:
    for k, v in (raw or {}).items():
        into[k] = into.get(k, Fraction(0)) + parse(v)


def _max(into: dict[str, Fraction], other: Mapping[str, Fraction]) -> None:
    for k, v in other.items():
        into[k] = max(into.get(k, Fraction(0)), v)


def pod_requests(pod: Json) -> dict[str, int]:
    """The pod's requests as the scheduler counts them: cpu in millicores, others in units."""
    spec = pod["spec"]
    total: dict[str, Fraction] = {}
    for c in spec.get("containers") or ():
        _add(total, (c.get("resources") or {}).get("requests"))
    sidecars: dict[str, Fraction] = {}
    init_peak: dict[str, Fraction] = {}
    for c in spec.get("initContainers") or ():
        req: dict[str, Fraction] = {}
        _add(req, (c.get("resources") or {}).get("requests"))
        if c.get("restartPolicy") == "Always":
            for k, v in req.items():
                total[k] = total.get(k, Fraction(0)) + v
                sidecars[k] = sidecars.get(k, Fraction(0)) + v
            _max(init_peak, sidecars)
        else:
            for k, v in sidecars.items():
                req[k] = req.get(k, Fraction(0)) + v
            _max(init_peak, req)
    _max(total, init_peak)
    pod_level = (spec.get("resources") or {}).get("requests") or {}
    for k, v in pod_level.items():
        if k in POD_LEVEL or k.startswith("hugepages-"):
            total[k] = parse(v)
    _add(total, spec.get("overhead"))
    return {k: round_up(v, milli=(k == "cpu")) for k, v in total.items()}


def node_allocatable(node: Json) -> dict[str, int]:
    raw = (node.get("status") or {}).get("allocatable") or {}
    return {k: round_up(parse(v), milli=(k == "cpu")) for k, v in raw.items()}


def resource_reasons(want: Mapping[str, int], node: Json, pods: Sequence[Json]) -> list[str]:
    alloc = node_allocatable(node)
    reasons = []
    if len(pods) + 1 > alloc.get("pods", 0):
        reasons.append(TOO_MANY_PODS)
    if not any(v for v in want.values()):
        return reasons
    used: dict[str, int] = {}
    for p in pods:
        for k, v in pod_requests(p).items():
            used[k] = used.get(k, 0) + v
    order = ["cpu", "memory", "ephemeral-storage"]
    order += sorted(k for k in want if k not in order)
    for k in order:
        amount = want.get(k, 0)
        if amount > 0 and amount > alloc.get(k, 0) - used.get(k, 0):
            reasons.append(f"Insufficient {k}")
    return reasons


# ---------------------------------------------------------------- the verdict
@dataclass(frozen=True)
class Expectation:
    """What the API's rules say of one pod in one cluster state."""

    feasible: frozenset[str]
    """The nodes the pod may go to."""
    reasons: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """node → the reasons it is refused (kube-scheduler's words; several only for resources)."""
    prefilter: str | None = None
    """A pod-level refusal (no node is tried): kube-scheduler's message after "0/N nodes are
    available: "."""
    gated: bool = False

    def histogram(self) -> Counter[str]:
        """kube-scheduler's FailedScheduling counts (reason → nodes)."""
        counts: Counter[str] = Counter()
        for reasons in self.reasons.values():
            counts.update(reasons)
        return counts


def node_reasons(pod: Json, node: Json, pods_on_node: Sequence[Json]) -> tuple[str, ...]:
    """The first rule ``node`` breaks for ``pod`` (empty: it fits), kube-scheduler's order."""
    spec = pod["spec"]
    name = node["metadata"]["name"]
    if spec.get("nodeName") and spec["nodeName"] != name:
        return (NODE_NAME,)
    if (node.get("spec") or {}).get("unschedulable") and not _tolerated(pod, UNSCHEDULABLE_TAINT):
        return (UNSCHEDULABLE,)
    for taint in (node.get("spec") or {}).get("taints") or ():
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerated(pod, taint):
            return (UNTOLERATED,)
    if not affinity_matches(pod, node):
        return (AFFINITY,)
    used_ports = [p for other in pods_on_node for p in host_ports(other)]
    if ports_conflict(host_ports(pod), used_ports):
        return (PORTS,)
    return tuple(resource_reasons(pod_requests(pod), node, pods_on_node))


def holds(pod: Json) -> bool:
    """Whether a pod holds room on its node: bound, not ended (a deleted pod is gone)."""
    phase = (pod.get("status") or {}).get("phase")
    return bool(pod["spec"].get("nodeName")) and phase not in ("Succeeded", "Failed")


def expect(pod: Json, nodes: Sequence[Json], pods: Sequence[Json]) -> Expectation:
    """Where ``pod`` may go among ``nodes``, given the ``pods`` that hold room (the pod itself
    excluded by uid)."""
    if pod["spec"].get("schedulingGates"):
        return Expectation(frozenset(), gated=True)
    uid = pod["metadata"].get("uid")
    on: dict[str, list[Json]] = {}
    for p in pods:
        if holds(p) and p["metadata"].get("uid") != uid:
            on.setdefault(p["spec"]["nodeName"], []).append(p)
    allowed = prefiltered_names(pod)
    if allowed is not None and not allowed:
        return Expectation(frozenset(), prefilter=AFFINITY_CONFLICT)
    feasible: set[str] = set()
    reasons: dict[str, tuple[str, ...]] = {}
    for node in nodes:
        name = node["metadata"]["name"]
        if allowed is not None and name not in allowed:
            reasons[name] = (PREFILTERED,)
            continue
        why = node_reasons(pod, node, on.get(name, ()))
        if why:
            reasons[name] = why
        else:
            feasible.add(name)
    return Expectation(frozenset(feasible), reasons)


def placement_violations(
    pod: Json, node_name: str, nodes: Sequence[Json], pods: Sequence[Json]
) -> tuple[str, ...]:
    """Why binding ``pod`` to ``node_name`` breaks the rules, with ``pods`` the others holding
    room there (empty: a valid placement)."""
    node = next((n for n in nodes if n["metadata"]["name"] == node_name), None)
    if node is None:
        return (f"node {node_name} does not exist",)
    allowed = prefiltered_names(pod)
    if allowed is not None and node_name not in allowed:
        return (PREFILTERED,)
    uid = pod["metadata"].get("uid")
    others = [
        p
        for p in pods
        if holds(p) and p["spec"]["nodeName"] == node_name and p["metadata"].get("uid") != uid
    ]
    unbound = {**pod, "spec": {**pod["spec"], "nodeName": ""}}
    return node_reasons(unbound, node, others)
