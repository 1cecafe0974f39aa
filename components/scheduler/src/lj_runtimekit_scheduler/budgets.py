"""PodDisruptionBudgets (``policy/v1``) as preemption reads them. Pure: JSON in, data out.

kube-scheduler's preemption does not refuse to break a budget: it prefers victims and nodes
that break fewer (``filterPodsWithPDBViolation``). A budget allows ``status.disruptionsAllowed``
more disruptions; a pod already in ``status.disruptedPods`` has been counted by the apiserver
and costs nothing again; a budget with an empty or invalid selector matches no pod there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .model import Pod

Json = dict[str, Any]
_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


@dataclass(frozen=True)
class Requirement:
    """One ``matchExpressions`` entry of a label selector."""

    key: str
    operator: str
    values: tuple[str, ...] = ()

    def holds(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "In":
            return labels.get(self.key) in self.values
        if self.operator == "NotIn":
            return labels.get(self.key) not in self.values
        if self.operator == "Exists":
            return self.key in labels
        return self.key not in labels  # DoesNotExist


@dataclass(frozen=True)
class Budget:
    namespace: str
    name: str
    requirements: tuple[Requirement, ...] | None
    """The selector as requirements (matchLabels become ``In``); None: matches no pod (empty,
    absent or invalid, as kube-scheduler's preemption treats it)."""
    allowed: int
    """``status.disruptionsAllowed``."""
    disrupted: frozenset[str] = frozenset()
    """Names of the pods in ``status.disruptedPods``."""

    def matches(self, pod: Pod) -> bool:
        if self.requirements is None or pod.namespace != self.namespace or not pod.labels:
            return False
        labels = dict(pod.labels)
        return all(r.holds(labels) for r in self.requirements)


def _requirements(selector: Any) -> tuple[Requirement, ...] | None:
    if not isinstance(selector, dict):
        return None
    out: list[Requirement] = []
    labels = selector.get("matchLabels") or {}
    if not isinstance(labels, dict):
        return None
    out.extend(Requirement(str(k), "In", (str(v),)) for k, v in sorted(labels.items()))
    for e in selector.get("matchExpressions") or ():
        if not isinstance(e, dict) or e.get("operator") not in _OPERATORS:
            return None
        values = tuple(str(v) for v in e.get("values") or ())
        if (e["operator"] in ("In", "NotIn")) != bool(values):
            return None  # In/NotIn need values, Exists/DoesNotExist take none
        out.append(Requirement(str(e["key"]), e["operator"], values))
    return tuple(out) or None


def budget(raw: Json) -> Budget:
    """A PodDisruptionBudget object; raises KeyError/ValueError/TypeError when malformed."""
    meta, spec, status = raw["metadata"], raw.get("spec") or {}, raw.get("status") or {}
    return Budget(
        namespace=str(meta.get("namespace", "default")),
        name=str(meta["name"]),
        requirements=_requirements(spec.get("selector")),
        allowed=int(status.get("disruptionsAllowed") or 0),
        disrupted=frozenset(str(k) for k in (status.get("disruptedPods") or {})),
    )


def violating(
    units: Sequence[Sequence[Pod]], budgets: Iterable[Budget]
) -> tuple[list[int], list[int]]:
    """Indices of the ``units`` (each evicted as one: a pod, or a gang's members) whose eviction
    breaks a budget, and of the others — both in the order given (kube-scheduler passes them
    most important first, so the budget is spent on the most important ones first)."""
    found = [b for b in budgets if b.requirements is not None]
    left = {(b.namespace, b.name): b.allowed for b in found}
    bad: list[int] = []
    good: list[int] = []
    for i, unit in enumerate(units):
        broken = False
        for pod in unit:
            for b in found:
                if pod.name in b.disrupted or not b.matches(pod):
                    continue
                key = (b.namespace, b.name)
                left[key] -= 1
                broken = broken or left[key] < 0
        (bad if broken else good).append(i)
    return bad, good
