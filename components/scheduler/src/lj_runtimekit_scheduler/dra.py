"""Our devices on DRA nodes: what the node's ResourceSlices offer, what claims hold, and the
claim a pod of ours gets there. Pure: apiserver JSON in, plain data and JSON out.

A node whose device plugin runs in DRA mode (docs/dra.md) advertises no ``aliyun.com/gpu*``
extended resources; its GPUs are devices of our driver's ResourceSlices, and kube-scheduler
allocates claims on them. A pod that still asks ``gpu-core``/``gpu-memory`` (or ``aliyun.com/gpu``,
``alibabacloud.com/ppu``) is ours to place there the way kube-scheduler serves an
extended-resource mapping (KEP-5004): at PreBind a ResourceClaim carrying the extended-resource
annotation, owned by the pod, with one request per chosen device; its allocation and the pod's
reservation written into the claim's status; the pod's ``status.extendedResourceClaimStatus``
naming which request serves which container's resource. The kubelet prepares that claim through
our DRA plugin and gives each container its request's CDI devices. Unlike KEP-5004's own mapping
(a quantity becomes a count of devices) a share becomes one request for ``cores`` and ``memory``
of one GPU's consumable capacity, so ``gpu-core: 30`` + ``gpu-memory: 10`` is 30 % and 10 GiB of
one GPU, the Runtime enforcing both.

Both schedulers allocate from the same devices, so each counts the other's claims: the
:class:`Ledger` turns every allocated claim of the driver into what it holds on each Runtime
device, keyed by the ``runtimeDeviceID`` attribute of the slice device (``partitionID`` for a
layout's partition). A claim reserved for a pod this scheduler already counts through its own
decision is left out by the caller, so nothing is counted twice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .gpu import Choice, Slice
from .model import CORE_PER_GPU, DeviceUse, Pod, ResourceNames
from .quantity import parse as parse_quantity

Json = dict[str, Any]

DEFAULT_DRIVER = "lj-runtimekit.aliyun.com"
EXTENDED_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
"""kube-scheduler's mark of a claim made for a pod's extended resources (KEP-5004)."""
CORES, MEMORY = "cores", "memory"
GIB = 1 << 30


class NotOffered(Exception):
    """A chosen device has no device in the node's slices: the claim cannot name it."""


def quantity(raw: object) -> int:
    """A quantity of a slice or claim (:func:`.quantity.parse`); not a string or number, or
    not a quantity, is a ValueError."""
    if not isinstance(raw, str | int) or isinstance(raw, bool):
        raise ValueError(f"quantity {raw!r}: expected a string")
    return parse_quantity(raw)


@dataclass(frozen=True)
class Offered:
    """One device of our driver's slices on a node."""

    pool: str
    name: str
    runtime_id: str
    """The Runtime's device (``partitionID`` for a layout's partition, else the GPU/PPU)."""
    type: str = "gpu"
    """The ``type`` attribute: gpu, ppu, mig, tdm."""
    shareable: bool = False
    """``allowMultipleAllocations``: claims take ``cores``/``memory`` of it."""
    memory_bytes: int = 0


def _attr(attrs: Mapping[str, Any], name: str, driver: str) -> str:
    raw = attrs.get(name) or attrs.get(f"{driver}/{name}") or {}
    value = raw.get("string", raw.get("int", "")) if isinstance(raw, dict) else ""
    return str(value)


def offered(raw: Json, driver: str) -> tuple[str, list[Offered]]:
    """(node, devices) of one ResourceSlice of ``driver``; ("", []) for another driver's."""
    spec = raw["spec"]
    if spec.get("driver") != driver or not spec.get("nodeName"):
        return "", []
    pool = _text(spec["pool"]["name"])
    out = []
    for d in spec.get("devices") or ():
        attrs = d.get("attributes") or {}
        if not isinstance(attrs, dict):
            raise TypeError("attributes: expected an object")
        rid = _attr(attrs, "partitionID", driver) or _attr(attrs, "runtimeDeviceID", driver)
        if not rid:
            continue
        memory = ((d.get("capacity") or {}).get(MEMORY) or {}).get("value", "0")
        out.append(
            Offered(
                pool,
                _text(d["name"]),
                rid,
                _attr(attrs, "type", driver) or "gpu",
                bool(d.get("allowMultipleAllocations")),
                quantity(memory),
            )
        )
    return _text(spec["nodeName"]), out


def _text(v: object) -> str:
    """A name from the apiserver; anything but a non-empty string is malformed (TypeError)."""
    if not isinstance(v, str) or not v:
        raise TypeError(f"expected a name, got {v!r}")
    return v


@dataclass(frozen=True)
class Held:
    """What one allocated claim holds of one device."""

    pool: str
    device: str
    core: int = 0
    memory_bytes: int = 0
    whole: bool = True


@dataclass(frozen=True)
class Claim:
    uid: str
    held: tuple[Held, ...]
    reserved_for: tuple[str, ...]
    """Uids of the pods the claim is reserved for."""


def claim(raw: Json, driver: str) -> Claim:
    """An allocated claim's devices of ``driver`` (none when unallocated or another driver's)."""
    status = raw.get("status") or {}
    results = (((status.get("allocation") or {}).get("devices") or {}).get("results")) or ()
    held = []
    for r in results:
        if r.get("driver") != driver:
            continue
        used = r.get("consumedCapacity")
        if isinstance(used, dict) and used:
            core = quantity(used.get(CORES, CORE_PER_GPU))
            mem = quantity(used.get(MEMORY, 0))
            held.append(
                Held(_text(r["pool"]), _text(r["device"]), core, mem, whole=core >= CORE_PER_GPU)
            )
        else:
            held.append(Held(_text(r["pool"]), _text(r["device"])))
    reserved = tuple(
        str(x.get("uid", ""))
        for x in status.get("reservedFor") or ()
        if x.get("resource") == "pods"
    )
    return Claim(str(raw["metadata"]["uid"]), tuple(held), reserved)


class Ledger:
    """Our driver's slices and allocated claims, as the informers see them, indexed by node (the
    devices it offers) and by pool (the claims holding its devices): an event touches one node,
    a filter reads one node."""

    def __init__(self, driver: str = DEFAULT_DRIVER) -> None:
        self.driver = driver
        self.slices: dict[str, tuple[str, tuple[Offered, ...]]] = {}
        """slice name → (node, its devices)."""
        self.claims: dict[str, Claim] = {}
        self._by_node: dict[str, set[str]] = {}
        """node → names of its slices."""
        self._nodes: dict[str, dict[str, Offered]] = {}
        """node → runtime id → the device offering it (the whole one where there are several)."""
        self._pools: dict[tuple[str, str], tuple[str, Offered]] = {}
        """(pool, device) → (node, device)."""
        self._claims_in: dict[str, set[str]] = {}
        """pool → uids of the claims holding a device of it."""

    def serves(self, node: str) -> bool:
        """Whether ``node`` publishes our devices as DRA devices."""
        return node in self._nodes

    def offer(self, node: str, runtime_id: str) -> Offered | None:
        return self._nodes.get(node, {}).get(runtime_id)

    def set_slice(self, name: str, raw: Json | None) -> set[str]:
        """Add, replace (``raw``) or remove (None) a slice; the nodes whose offer changed."""
        node, devices = offered(raw, self.driver) if raw is not None else ("", [])
        before, old = self.slices.pop(name, ("", ()))  # only once the new one parsed
        for d in old:
            self._pools.pop((d.pool, d.name), None)
        self._by_node.get(before, set()).discard(name)
        if node:
            self.slices[name] = (node, tuple(devices))
            self._by_node.setdefault(node, set()).add(name)
            self._pools.update({(d.pool, d.name): (node, d) for d in devices})
        changed = {n for n in (before, node) if n}
        for n in changed:
            self._reindex(n)
        return changed

    def _reindex(self, node: str) -> None:
        by_id: dict[str, Offered] = {}
        for name in self._by_node.get(node, ()):
            for d in self.slices[name][1]:
                # a GPU offered whole and as partitions made on demand: the whole one names it
                if d.runtime_id not in by_id or d.type in ("gpu", "ppu"):
                    by_id[d.runtime_id] = d
        if by_id:
            self._nodes[node] = by_id
        else:
            self._nodes.pop(node, None)
            self._by_node.pop(node, None)

    def set_claim(self, raw: Json | None, uid: str = "") -> set[str]:
        """Add, replace (``raw``) or remove (``uid``) a claim; the nodes whose use changed."""
        key = str(raw["metadata"]["uid"]) if raw is not None else uid
        new = claim(raw, self.driver) if raw is not None else None
        old = self.claims.pop(key, None)
        for h in old.held if old is not None else ():
            self._claims_in.get(h.pool, set()).discard(key)
        if new is not None and new.held:
            self.claims[new.uid] = new
            for h in new.held:
                self._claims_in.setdefault(h.pool, set()).add(new.uid)
        return self._nodes_of(old) | self._nodes_of(new)

    def _nodes_of(self, c: Claim | None) -> set[str]:
        if c is None:
            return set()
        return {
            self._pools[(h.pool, h.device)][0] for h in c.held if (h.pool, h.device) in self._pools
        }

    def use(self, node: str, counted: Callable[[str], bool]) -> dict[str, DeviceUse]:
        """Runtime device id → what the claims on ``node`` hold of it, leaving out claims
        reserved for a pod ``counted`` says the caller already holds through its decision."""
        pools = {d.pool for d in self._nodes.get(node, {}).values()}
        uids = set().union(*(self._claims_in.get(p, set()) for p in pools))
        out: dict[str, DeviceUse] = {}
        for c in (self.claims[u] for u in uids):
            if any(counted(uid) for uid in c.reserved_for):
                continue
            for h in c.held:
                at = self._pools.get((h.pool, h.device))
                if at is not None and at[0] == node:
                    gib = -(-h.memory_bytes // GIB)
                    _add(out, at[1].runtime_id, DeviceUse(h.whole, h.core, gib))
        return out


def _add(into: dict[str, DeviceUse], key: str, u: DeviceUse) -> None:
    v = into.get(key, DeviceUse())
    into[key] = DeviceUse(v.whole or u.whole, v.core + u.core, v.memory_gib + u.memory_gib)


def merge(a: Mapping[str, DeviceUse], b: Mapping[str, DeviceUse]) -> dict[str, DeviceUse]:
    out = dict(a)
    for k, u in b.items():
        _add(out, k, u)
    return out


def unmappable(pod: Pod) -> str:
    """Why a pod's requests cannot become a claim on a DRA node ("" when they can): a share is
    ``cores`` and ``memory`` of one GPU, and one that names only one of them would take the
    other whole under the DRA request policy while the device plugin's counts give it none."""
    for d in pod.devices:
        if (d.core > 0) != (d.memory_gib > 0):
            return (
                f"container {d.container} asks only one of gpu-core/gpu-memory; on a DRA node a "
                "share names both"
            )
    return ""


def _class(o: Offered, share: bool, driver: str) -> str:
    return f"gpu-share.{driver}" if share else f"{o.type}.{driver}"


@dataclass(frozen=True)
class Plan:
    """The claim a pod gets on a DRA node, and what its status and the pod's say."""

    claim: Json
    results: list[Json]
    mappings: list[Json]


def plan(
    pod: Pod,
    node: str,
    choice: Choice,
    ledger: Ledger,
    names: ResourceNames,
    *,
    new_id: Callable[[], str],
) -> Plan:
    """The claim for ``choice`` on ``node``; :class:`NotOffered` when a device is not in the
    node's slices (they changed since the choice)."""
    driver = ledger.driver
    kinds = {d.container: d for d in pod.devices}
    requests: list[Json] = []
    results: list[Json] = []
    mappings: list[Json] = []
    for ci, (container, slices) in enumerate(choice.containers):
        asked = kinds.get(container)
        for si, s in enumerate(slices):
            o = ledger.offer(node, s.device)
            if o is None:
                raise NotOffered(f"{s.device} is not among {node}'s ResourceSlice devices")
            share = not s.whole
            req = f"container-{ci}-request-{si}"
            exactly: Json = {
                "deviceClassName": _class(o, share, driver),
                "allocationMode": "ExactCount",
                "count": 1,
            }
            result: Json = {"request": req, "driver": driver, "pool": o.pool, "device": o.name}
            if share:
                exactly["capacity"] = {"requests": _share_capacity(s)}
            if o.shareable:
                result["shareID"] = new_id()
                result["consumedCapacity"] = _consumed(s, o)
            requests.append({"name": req, "exactly": exactly})
            results.append(result)
            mappings.extend(
                {"containerName": container, "resourceName": r, "requestName": req}
                for r in _resources(s, asked, o, names)
            )
    body: Json = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "generateName": f"{pod.name}-extended-resources-",
            "namespace": pod.namespace,
            "annotations": {EXTENDED_CLAIM_ANNOTATION: "true"},
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": pod.name,
                    "uid": pod.uid,
                    "controller": True,
                }
            ],
        },
        "spec": {"devices": {"requests": requests}},
    }
    return Plan(body, results, mappings)


def _share_capacity(s: Slice) -> dict[str, str]:
    return {CORES: str(s.core), MEMORY: f"{s.memory_gib}Gi"}


def _bytes(n: int) -> str:
    """Bytes as the apiserver writes a quantity it made itself (80Gi, not 85899345920)."""
    for suffix, unit in (("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if n and n % unit == 0:
            return f"{n // unit}{suffix}"
    return str(n)


def _consumed(s: Slice, o: Offered) -> dict[str, str]:
    if s.whole:  # the request policy's defaults: all of it
        return {CORES: str(CORE_PER_GPU), MEMORY: _bytes(o.memory_bytes)}
    return _share_capacity(s)


def _resources(s: Slice, asked: Any, o: Offered, names: ResourceNames) -> Iterable[str]:
    if not s.whole:
        return (names.of("gpu-core"), names.of("gpu-memory"))
    if o.type == "ppu" or (asked is not None and asked.ppus and not asked.gpus):
        return (names.of("ppu"),)
    return (names.of("gpu"),)


def status(pod: Pod, node: str, p: Plan, now: str) -> Json:
    """The claim's status: allocated on ``node``, reserved for ``pod``."""
    return {
        "status": {
            "allocation": {
                "devices": {"results": p.results},
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [node]}
                            ]
                        }
                    ]
                },
                "allocationTimestamp": now,
            },
            "reservedFor": [{"resource": "pods", "name": pod.name, "uid": pod.uid}],
        }
    }


def pod_status(claim_name: str, p: Plan) -> Json:
    """The pod's status patch naming the claim and which request serves which resource."""
    return {
        "status": {
            "extendedResourceClaimStatus": {
                "resourceClaimName": claim_name,
                "requestMappings": p.mappings,
            }
        }
    }
