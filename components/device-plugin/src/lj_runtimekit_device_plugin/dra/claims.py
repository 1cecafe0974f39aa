"""What a ResourceClaim's allocation asks of this node. Pure: the apiserver's JSON in, data out.

The scheduler writes the allocation into ``status.allocation.devices.results`` (one entry per
allocated device: request, driver, pool, device; for a device that allows multiple allocations
also ``shareID`` and ``consumedCapacity``, capacity name → quantity) and the pods that may use the
claim into ``status.reservedFor``. The kubelet calls ``NodePrepareResources`` with the claim's
namespace, name and uid only; the driver reads the rest from the apiserver.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from typing import Any

from ..errors import PermanentError


class ClaimNotPreparable(PermanentError):
    """The claim cannot be prepared as it stands (no allocation, no pod, another uid)."""


# A Kubernetes quantity: a signed decimal number, then a binary suffix, a decimal suffix or a
# decimal exponent (k8s.io/apimachinery/pkg/api/resource).
_QUANTITY = re.compile(
    r"(?P<number>[+-]?(\d+\.?\d*|\.\d+))(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?\Z"
)
_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_MAX_QUANTITY = Decimal(2) ** 63


def quantity(text: str) -> int | None:
    """A Kubernetes quantity as a whole number (a fraction rounded up, as the allocator rounds a
    request up), or None when ``text`` is not a quantity or not one of 0..2^63."""
    m = _QUANTITY.match(text.strip()) if len(text) <= 64 else None
    if not m:
        return None
    try:
        number = Decimal(m["number"])
    except InvalidOperation:
        return None
    suffix = m["suffix"] or ""
    if suffix in _BINARY:
        number *= 2 ** _BINARY[suffix]
    elif suffix:
        number = number.scaleb(_DECIMAL[suffix] if suffix in _DECIMAL else int(suffix[1:]))
    if not 0 <= number < _MAX_QUANTITY:
        return None
    return int(number.to_integral_value(ROUND_CEILING))


@dataclass(frozen=True)
class Result:
    """One allocated device of a claim."""

    request: str
    driver: str
    pool: str
    device: str
    share_id: str = ""
    """Set by the scheduler on each allocation of a device that allows multiple allocations."""
    consumed: Mapping[str, int] = field(default_factory=dict)
    """What the allocation consumed of the device's capacities (name → whole units); a quantity
    that could not be read is left out."""


@dataclass(frozen=True)
class ClaimAllocation:
    namespace: str
    name: str
    uid: str
    results: tuple[Result, ...]
    pods: tuple[tuple[str, str], ...]
    """(name, uid) of each pod the claim is reserved for, in the claim's order."""


def _dict(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _result(r: Mapping[str, Any]) -> Result:
    consumed = {}
    for name, value in _dict(r.get("consumedCapacity")).items():
        if (n := quantity(str(value))) is not None:
            consumed[str(name)] = n
    return Result(
        request=str(r.get("request") or ""),
        driver=str(r.get("driver") or ""),
        pool=str(r.get("pool") or ""),
        device=str(r.get("device") or ""),
        share_id=str(r.get("shareID") or ""),
        consumed=consumed,
    )


def claim_allocation(claim: Mapping[str, Any]) -> ClaimAllocation:
    """The allocation of ``claim`` (a ResourceClaim as the apiserver returns it)."""
    meta = _dict(claim.get("metadata"))
    ns, name, uid = (str(meta.get(k) or "") for k in ("namespace", "name", "uid"))
    status = _dict(claim.get("status"))
    allocation = status.get("allocation")
    if not isinstance(allocation, Mapping):
        raise ClaimNotPreparable(f"claim {ns}/{name} has no allocation: the scheduler made none")
    results = tuple(
        _result(r)
        for r in _list(_dict(allocation.get("devices")).get("results"))
        if isinstance(r, Mapping)
    )
    pods = tuple(
        (str(ref.get("name") or ""), str(ref.get("uid") or ""))
        for ref in _list(status.get("reservedFor"))
        if isinstance(ref, Mapping) and ref.get("resource") == "pods" and not ref.get("apiGroup")
    )
    return ClaimAllocation(ns, name, uid, results, pods)


def ours(claim: ClaimAllocation, driver: str, pool: str) -> tuple[Result, ...]:
    """The results this node's driver prepares: its driver, its pool."""
    return tuple(r for r in claim.results if r.driver == driver and r.pool == pool)


def container_of(pod: Mapping[str, Any], claim_name: str) -> str:
    """The first container of ``pod`` that uses the ResourceClaim named ``claim_name`` (directly,
    through the claim a template made for the pod, or as the claim a scheduler made for the pod's
    extended resources: ``status.extendedResourceClaimStatus``); "" when none does."""
    spec, status = _dict(pod.get("spec")), _dict(pod.get("status"))
    extended = _dict(status.get("extendedResourceClaimStatus"))
    if extended.get("resourceClaimName") == claim_name:
        for m in _list(extended.get("requestMappings")):
            if isinstance(m, Mapping) and m.get("containerName"):
                return str(m["containerName"])
    pod_claims = {
        str(c.get("name"))
        for c in _list(spec.get("resourceClaims"))
        if isinstance(c, Mapping) and c.get("resourceClaimName") == claim_name
    }
    pod_claims |= {
        str(s.get("name"))
        for s in _list(status.get("resourceClaimStatuses"))
        if isinstance(s, Mapping) and s.get("resourceClaimName") == claim_name
    }
    for container in [*_list(spec.get("initContainers")), *_list(spec.get("containers"))]:
        if not isinstance(container, Mapping):
            continue
        used = _list(_dict(container.get("resources")).get("claims"))
        if any(isinstance(u, Mapping) and u.get("name") in pod_claims for u in used):
            return str(container.get("name") or "")
    return ""
