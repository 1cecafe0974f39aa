"""A pod's rules about other pods: inter-pod (anti-)affinity terms and topology spread
constraints, as plain data parsed from the pod's JSON. Pure.

As kube-scheduler reads them (``framework.PodInfo``, ``podtopologyspread/common.go``):

- an affinity term's namespaces are its ``namespaces`` or, when both ``namespaces`` and
  ``namespaceSelector`` are absent, the pod's own; a nil ``namespaceSelector`` selects no
  namespace, ``{}`` every namespace;
- ``matchLabelKeys``/``mismatchLabelKeys`` of an affinity term are merged into its
  ``labelSelector`` by the kube-apiserver when the pod is created (KEP-3633); kube-scheduler,
  and so this scheduler, reads only the merged selector;
- a spread constraint's ``matchLabelKeys`` are merged here, with the pod's labels, as
  kube-scheduler merges them; ``minDomains`` defaults to 1, ``nodeAffinityPolicy`` to Honor,
  ``nodeTaintsPolicy`` to Ignore.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import labels as sel
from .labels import Selector

DO_NOT_SCHEDULE, SCHEDULE_ANYWAY = "DoNotSchedule", "ScheduleAnyway"
HONOR, IGNORE = "Honor", "Ignore"
HOSTNAME = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"


@dataclass(frozen=True)
class AffinityTerm:
    """A ``PodAffinityTerm`` of one pod (its namespaces resolved against the pod's own)."""

    selector: Selector
    namespaces: frozenset[str]
    namespace_selector: Selector
    topology_key: str

    def matches(
        self, namespace: str, pod_labels: Mapping[str, str], ns_labels: Mapping[str, str] | None
    ) -> bool:
        """Whether a pod of ``namespace`` (whose labels are ``ns_labels``) with ``pod_labels``
        is one this term selects (``AffinityTerm.Matches``)."""
        if namespace in self.namespaces or self.namespace_selector.matches(ns_labels):
            return self.selector.matches(pod_labels)
        return False


@dataclass(frozen=True)
class WeightedTerm:
    weight: int
    term: AffinityTerm


@dataclass(frozen=True)
class PodAffinity:
    """``spec.affinity.podAffinity`` and ``podAntiAffinity`` of one pod."""

    required: tuple[AffinityTerm, ...] = ()
    required_anti: tuple[AffinityTerm, ...] = ()
    preferred: tuple[WeightedTerm, ...] = ()
    preferred_anti: tuple[WeightedTerm, ...] = ()

    @property
    def any(self) -> bool:
        return bool(self.required or self.required_anti or self.preferred or self.preferred_anti)


NO_AFFINITY = PodAffinity()


@dataclass(frozen=True)
class SpreadConstraint:
    """One ``topologySpreadConstraints`` entry (``matchLabelKeys`` already merged)."""

    max_skew: int
    topology_key: str
    hard: bool
    """whenUnsatisfiable DoNotSchedule (a Filter); False: ScheduleAnyway (a Score)."""
    selector: Selector
    min_domains: int = 1
    honor_affinity: bool = True
    """nodeAffinityPolicy Honor: only nodes matching the pod's nodeSelector and required node
    affinity count as domains."""
    honor_taints: bool = False
    """nodeTaintsPolicy Honor: nodes with a NoSchedule/NoExecute taint the pod does not
    tolerate do not count."""


@dataclass(frozen=True)
class ControllerRef:
    """The pod's controller (``ownerReferences`` entry with ``controller: true``)."""

    api_version: str
    kind: str
    name: str


def _terms_list(raw: Any, what: str) -> list[Any]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ValueError(f"{what}: expected a list")
    return raw


def _strings(raw: Any, what: str) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
        raise ValueError(f"{what}: expected a list of strings")
    return tuple(raw)


def _term(raw: Any, namespace: str, what: str) -> AffinityTerm:
    if not isinstance(raw, dict):
        raise ValueError(f"{what}: expected an object")
    key = raw.get("topologyKey")
    if not isinstance(key, str) or not key:
        raise ValueError(f"{what}.topologyKey: required, a label key")
    names = _strings(raw.get("namespaces"), f"{what}.namespaces")
    ns_raw = raw.get("namespaceSelector")
    ns_sel = sel.parse(ns_raw, f"{what}.namespaceSelector")
    if not names and ns_raw is None:
        names = (namespace,)
    return AffinityTerm(
        sel.parse(raw.get("labelSelector"), f"{what}.labelSelector"), frozenset(names), ns_sel, key
    )


def _weighted(raw: Any, namespace: str, what: str) -> WeightedTerm:
    if not isinstance(raw, dict):
        raise ValueError(f"{what}: expected an object")
    weight = raw.get("weight")
    if type(weight) is not int or not 1 <= weight <= 100:
        raise ValueError(f"{what}.weight: {weight!r:.20} is not an integer from 1 to 100")
    return WeightedTerm(
        weight, _term(raw.get("podAffinityTerm"), namespace, f"{what}.podAffinityTerm")
    )


_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
_PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


def pod_affinity(affinity: Any, namespace: str) -> PodAffinity:
    """The inter-pod terms of ``spec.affinity``; raises ValueError naming the field."""
    if not isinstance(affinity, dict):
        return NO_AFFINITY
    out: dict[str, tuple[Any, ...]] = {}
    for field, suffix in (("podAffinity", ""), ("podAntiAffinity", "_anti")):
        part = affinity.get(field) or {}
        if not isinstance(part, dict):
            raise ValueError(f"spec.affinity.{field}: expected an object")
        req = f"spec.affinity.{field}.{_REQUIRED}"
        pref = f"spec.affinity.{field}.{_PREFERRED}"
        out["required" + suffix] = tuple(
            _term(t, namespace, f"{req}[{i}]")
            for i, t in enumerate(_terms_list(part.get(_REQUIRED), req))
        )
        out["preferred" + suffix] = tuple(
            _weighted(t, namespace, f"{pref}[{i}]")
            for i, t in enumerate(_terms_list(part.get(_PREFERRED), pref))
        )
    found = PodAffinity(**out)
    return found if found.any else NO_AFFINITY


def _policy(raw: Any, what: str, default: str) -> bool:
    value = default if raw is None else raw
    if value not in (HONOR, IGNORE):
        raise ValueError(f"{what}: {value!r:.40} is not Honor or Ignore")
    return value == HONOR


def constraint(raw: Any, pod_labels: Mapping[str, str], what: str) -> SpreadConstraint:
    """One spread constraint (of a pod, or a default one of the config when ``pod_labels`` is
    empty and it has no selector); raises ValueError naming ``what``."""
    if not isinstance(raw, dict):
        raise ValueError(f"{what}: expected an object")
    skew = raw.get("maxSkew")
    if type(skew) is not int or skew < 1:
        raise ValueError(f"{what}.maxSkew: {skew!r:.20} is not a positive integer")
    key = raw.get("topologyKey")
    if not isinstance(key, str) or not key:
        raise ValueError(f"{what}.topologyKey: required, a node label key")
    when = raw.get("whenUnsatisfiable")
    if when not in (DO_NOT_SCHEDULE, SCHEDULE_ANYWAY):
        raise ValueError(
            f"{what}.whenUnsatisfiable: {when!r:.40} is not DoNotSchedule or ScheduleAnyway"
        )
    min_domains = raw.get("minDomains")
    if min_domains is not None and (type(min_domains) is not int or min_domains < 1):
        raise ValueError(f"{what}.minDomains: {min_domains!r:.20} is not a positive integer")
    if min_domains is not None and when != DO_NOT_SCHEDULE:
        raise ValueError(f"{what}.minDomains: only with whenUnsatisfiable DoNotSchedule")
    keys = _strings(raw.get("matchLabelKeys"), f"{what}.matchLabelKeys")
    selector = sel.parse(raw.get("labelSelector"), f"{what}.labelSelector")
    return SpreadConstraint(
        max_skew=skew,
        topology_key=key,
        hard=when == DO_NOT_SCHEDULE,
        selector=selector.adding(sel.equal_to(pod_labels, keys)),
        min_domains=min_domains or 1,
        honor_affinity=_policy(raw.get("nodeAffinityPolicy"), f"{what}.nodeAffinityPolicy", HONOR),
        honor_taints=_policy(raw.get("nodeTaintsPolicy"), f"{what}.nodeTaintsPolicy", IGNORE),
    )


def spread(raw: Any, pod_labels: Mapping[str, str]) -> tuple[SpreadConstraint, ...]:
    """``spec.topologySpreadConstraints``; raises ValueError naming the entry."""
    what = "spec.topologySpreadConstraints"
    return tuple(
        constraint(c, pod_labels, f"{what}[{i}]") for i, c in enumerate(_terms_list(raw, what))
    )


def controller(meta: Mapping[str, Any]) -> ControllerRef | None:
    """The controller among ``metadata.ownerReferences`` (None: none, or not readable)."""
    refs = meta.get("ownerReferences")
    if not isinstance(refs, list):
        return None
    for ref in refs:
        if isinstance(ref, dict) and ref.get("controller") is True:
            parts = (ref.get("apiVersion"), ref.get("kind"), ref.get("name"))
            if all(isinstance(p, str) for p in parts):
                return ControllerRef(*(str(p) for p in parts))
    return None
