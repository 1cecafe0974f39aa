"""The shared-GPU handshake of docs/contracts.md, the pure half: parse and choose. No I/O.

The scheduler writes ``lj-runtimekit-scheduler/gpu-assignment`` on the pod; at Allocate for
``gpu-core``/``gpu-memory`` the plugin picks, among the pods on its node, the oldest unclaimed
assignment whose container asks exactly the units the kubelet passed. The claim itself (a pod
patch with a resourceVersion precondition) is the adapter's; this module only decides.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import PermanentError

ASSIGNMENT = "lj-runtimekit-scheduler/gpu-assignment"
ALLOCATED = "lj-runtimekit-device-plugin/allocated"
ALLOCATION = "lj-runtimekit-device-plugin/allocation"
VERSION = "v1"


class BadAssignment(PermanentError):
    """The assignment annotation is missing, malformed or for another node."""


@dataclass(frozen=True)
class Share:
    """One device of a container's assignment."""

    id: str
    core: int = 0
    memory_gib: int = 0
    whole: bool = False


@dataclass(frozen=True)
class Assignment:
    node: str
    assumed_at: str
    containers: Mapping[str, tuple[Share, ...]]


@dataclass(frozen=True)
class PodView:
    """What the handshake needs of a pod."""

    namespace: str
    name: str
    uid: str
    resource_version: str
    annotations: Mapping[str, str]
    requests: Mapping[str, Mapping[str, int]]
    """Per container, per extended resource: units requested."""


def _int(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise BadAssignment(f"{ASSIGNMENT}: {what}={v!r} is not a non-negative integer")
    return v


def parse(text: str) -> Assignment:
    """The annotation's JSON as data; :class:`BadAssignment` says what is wrong with it."""
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise BadAssignment(f"{ASSIGNMENT} is not JSON: {e}") from e
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        raise BadAssignment(f"{ASSIGNMENT}: expected an object with version {VERSION!r}")
    node, at, containers = doc.get("node"), doc.get("assumedAt"), doc.get("containers")
    if not isinstance(node, str) or not isinstance(at, str) or not isinstance(containers, list):
        raise BadAssignment(f"{ASSIGNMENT}: node, assumedAt and containers are required")
    out: dict[str, tuple[Share, ...]] = {}
    for c in containers:
        if not isinstance(c, dict) or not isinstance(c.get("name"), str):
            raise BadAssignment(f"{ASSIGNMENT}: each container needs a name")
        devices = c.get("devices")
        if not isinstance(devices, list) or not devices:
            raise BadAssignment(f"{ASSIGNMENT}: container {c['name']} has no devices")
        shares = []
        for d in devices:
            if not isinstance(d, dict) or not isinstance(d.get("id"), str) or not d["id"]:
                raise BadAssignment(f"{ASSIGNMENT}: container {c['name']}: device without id")
            shares.append(
                Share(
                    id=d["id"],
                    core=_int(d.get("core", 0), "core"),
                    memory_gib=_int(d.get("memoryGiB", 0), "memoryGiB"),
                    whole=d.get("whole") is True,
                )
            )
        out[c["name"]] = tuple(shares)
    return Assignment(node=node, assumed_at=at, containers=out)


def units_asked(shares: Iterable[Share], kind: str) -> int:
    """Units of ``kind`` (gpu-core or gpu-memory) an assigned container gets."""
    return sum(s.core if kind == "gpu-core" else s.memory_gib for s in shares)


@dataclass(frozen=True)
class Candidate:
    pod: PodView
    container: str
    shares: tuple[Share, ...]
    assumed_at: str


def candidates(
    pods: Iterable[PodView],
    node: str,
    resource: str,
    kind: str,
    *,
    units: int,
    claimed: Iterable[tuple[str, str]] = (),
) -> list[Candidate]:
    """Unclaimed (pod uid, container) pairs on ``node`` asking exactly ``units`` of ``resource``.

    Oldest ``assumedAt`` first, then by namespace/name so the order is total. Pods already
    marked allocated, pods whose assignment is malformed, and pairs in ``claimed`` (this
    process's in-flight claims) are left out.
    """
    taken = set(claimed)
    out = []
    for pod in pods:
        text = pod.annotations.get(ASSIGNMENT)
        if text is None or ALLOCATED in pod.annotations:
            continue
        try:
            a = parse(text)
        except BadAssignment:
            continue
        if a.node != node:
            continue
        for name, shares in a.containers.items():
            if (pod.uid, name) in taken:
                continue
            if pod.requests.get(name, {}).get(resource) != units:
                continue
            if units_asked(shares, kind) != units:
                continue
            out.append(Candidate(pod, name, shares, a.assumed_at))
    out.sort(key=lambda c: (c.assumed_at, c.pod.namespace, c.pod.name, c.container))
    return out


def allocation_mark(at: str, container: str, allocation_ids: Iterable[str]) -> dict[str, str]:
    """The annotations that mark a pod allocated (contracts.md)."""
    return {
        ALLOCATED: at,
        ALLOCATION: json.dumps({"containers": {container: list(allocation_ids)}}),
    }
