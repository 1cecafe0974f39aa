"""How the kubelet's device manager picks unit IDs for a container: pure, no I/O."""

from __future__ import annotations

import re
from collections.abc import Iterable

_QUALIFIED = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def resource_name_error(name: str) -> str | None:
    """Why the kubelet would refuse ``name`` as a device plugin resource, or None.

    The kubelet accepts extended resource names only: ``<domain>/<name>`` outside the
    ``kubernetes.io`` namespace and without the ``requests.`` prefix, each part a valid name.
    """
    domain, sep, short = name.partition("/")
    if not sep:
        return f"resource name {name!r} has no domain prefix (want e.g. aliyun.com/gpu)"
    if domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
        return f"resource name {name!r} is in the kubernetes.io namespace"
    if name.startswith("requests."):
        return f"resource name {name!r} may not start with 'requests.'"
    if len(domain) > 253 or not _DNS_SUBDOMAIN.match(domain):
        return f"resource name {name!r}: prefix {domain!r} is not a DNS subdomain"
    if len(short) > 63 or not _QUALIFIED.match(short):
        return f"resource name {name!r}: {short!r} is not a qualified name"
    return None


def available_ids(healthy: Iterable[str], in_use: Iterable[str]) -> list[str]:
    """Healthy units not allocated to another container, in a stable order."""
    used = set(in_use)
    return sorted(d for d in healthy if d not in used)


def choose(available: list[str], needed: int, preferred: list[str] | None = None) -> list[str]:
    """The IDs the kubelet allocates: all when exactly enough, else the plugin's preference
    (kept only if it names ``needed`` available IDs), filled up from ``available``.

    Raises ValueError when fewer than ``needed`` units are available (the kubelet then refuses
    to admit the pod with UnexpectedAdmissionError).
    """
    if needed > len(available):
        raise ValueError(f"requested {needed} units, only {len(available)} healthy and free")
    if needed == len(available):
        return list(available)
    chosen: list[str] = []
    for device in preferred or []:
        if device in available and device not in chosen and len(chosen) < needed:
            chosen.append(device)
    for device in available:
        if len(chosen) == needed:
            break
        if device not in chosen:
            chosen.append(device)
    return chosen
