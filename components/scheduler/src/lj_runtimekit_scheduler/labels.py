"""Label selectors (``metav1.LabelSelector``) as plain data: of pods in inter-pod terms and
spread constraints, of namespaces, of workloads. Pure.

Matching follows ``k8s.io/apimachinery/pkg/labels``: a nil selector matches nothing, an empty
one (``{}``) everything; ``matchLabels`` entries are ``key In (value)`` requirements, all of a
selector's requirements must hold.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


@dataclass(frozen=True, order=True)
class LabelRequirement:
    """One requirement: ``key`` ``operator`` ``values`` (values sorted, empty for Exists and
    DoesNotExist)."""

    key: str
    operator: str
    values: tuple[str, ...] = ()

    def holds(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        op = self.operator
        if op == "In":
            return value is not None and value in self.values
        if op == "NotIn":
            return value is None or value not in self.values
        if op == "Exists":
            return value is not None
        return value is None  # DoesNotExist


@dataclass(frozen=True)
class Selector:
    """A parsed selector; equal selectors compare (and hash) equal whatever the order of their
    requirements in the object."""

    requirements: tuple[LabelRequirement, ...] = ()
    nothing: bool = False
    """A nil selector (``labels.Nothing()``): matches no object."""

    @property
    def empty(self) -> bool:
        """Selects everything (``labels.Everything()``, whose ``Empty()`` is true)."""
        return not self.nothing and not self.requirements

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        if self.nothing:
            return False
        got = labels or {}
        return all(r.holds(got) for r in self.requirements)

    def adding(self, extra: tuple[LabelRequirement, ...]) -> Selector:
        """This selector with ``extra`` requirements too; a nil selector stays nil (as
        kube-scheduler's merge of ``matchLabelKeys``: a selector without requirements to list
        is returned as it is)."""
        if self.nothing or not extra:
            return self
        return Selector(tuple(sorted(set(self.requirements) | set(extra))))


NOTHING = Selector(nothing=True)
EVERYTHING = Selector()


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what}: expected a string, got {value!r:.60}")
    return value


def parse(raw: Any, what: str) -> Selector:
    """The selector of ``raw`` (a LabelSelector object, None for nil); raises ValueError naming
    ``what`` on anything the apiserver would not have accepted."""
    if raw is None:
        return NOTHING
    if not isinstance(raw, dict):
        raise ValueError(f"{what}: expected a label selector object, got {raw!r:.60}")
    reqs: set[LabelRequirement] = set()
    match_labels = raw.get("matchLabels") or {}
    if not isinstance(match_labels, dict):
        raise ValueError(f"{what}.matchLabels: expected a map of strings")
    for k, v in match_labels.items():
        reqs.add(LabelRequirement(_text(k, f"{what}.matchLabels"), "In", (_text(v, f"{what}"),)))
    exprs = raw.get("matchExpressions") or []
    if not isinstance(exprs, list):
        raise ValueError(f"{what}.matchExpressions: expected a list")
    for i, e in enumerate(exprs):
        where = f"{what}.matchExpressions[{i}]"
        if not isinstance(e, dict):
            raise ValueError(f"{where}: expected an object")
        key = _text(e.get("key"), f"{where}.key")
        op = e.get("operator")
        if op not in OPERATORS:
            raise ValueError(f"{where}.operator: {op!r:.40} is not one of {', '.join(OPERATORS)}")
        values = e.get("values") or []
        if not isinstance(values, list):
            raise ValueError(f"{where}.values: expected a list of strings")
        vals = tuple(sorted({_text(v, f"{where}.values") for v in values}))
        if op in ("In", "NotIn") and not vals:
            raise ValueError(f"{where}: {op} needs at least one value")
        if op in ("Exists", "DoesNotExist") and vals:
            raise ValueError(f"{where}: {op} takes no values")
        reqs.add(LabelRequirement(key, op, vals))
    return Selector(tuple(sorted(reqs)))


def from_map(raw: Any, what: str) -> Selector | None:
    """A map selector (a Service's or ReplicationController's ``spec.selector``) as a selector;
    None for a nil map (such a Service selects no pod, not every pod)."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ValueError(f"{what}: expected a map of strings, got {raw!r:.60}")
    return Selector(
        tuple(
            sorted(
                LabelRequirement(_text(k, what), "In", (_text(v, what),)) for k, v in raw.items()
            )
        )
    )


def equal_to(labels: Mapping[str, str], keys: tuple[str, ...]) -> tuple[LabelRequirement, ...]:
    """``key In (value)`` for each of ``keys`` that ``labels`` has (``matchLabelKeys``)."""
    return tuple(LabelRequirement(k, "In", (labels[k],)) for k in keys if k in labels)
