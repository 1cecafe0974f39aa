"""The Runtime's allocation rules, pure: which requests fit the node, and what they inject.

No I/O here; the servicers turn a ``RuntimeRefusal`` into its gRPC status at the edge.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from lj_runtimekit_testkit.simulator.inventory import Binding, Device, Inventory, Kind, Partition

ANNOTATION_PREFIX = "xdm.amp.com"
#: Extended resource → the device kind it draws from, and whether it is a shared (fractional) one.
RESOURCES: dict[str, tuple[Kind, bool]] = {
    "aliyun.com/gpu": (Kind.GPU, False),
    "aliyun.com/gpu-core": (Kind.GPU, True),
    "aliyun.com/gpu-memory": (Kind.GPU, True),
    "alibabacloud.com/ppu": (Kind.PPU, False),
}
DRIVER_MOUNT = ("/usr/local/harp/kitC/lib", "/usr/local/harp/kitC/lib")


class Refusal(Enum):
    INVALID = "invalid"
    EXHAUSTED = "exhausted"
    PRECONDITION = "precondition"
    NOT_FOUND = "not_found"


class RuntimeRefusal(Exception):
    """A request the Runtime refuses; ``kind`` maps to a gRPC status code at the edge."""

    def __init__(self, kind: Refusal, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class Injection:
    envs: dict[str, str]
    annotations: dict[str, str]
    device_nodes: tuple[tuple[str, str, str], ...]
    mounts: tuple[tuple[str, str, bool], ...]


@dataclass(frozen=True)
class Allocation:
    id: str
    pod: PodRef
    container: str
    resource_name: str
    device_ids: tuple[str, ...]
    core_percent: int
    memory_bytes: int
    injection: Injection

    @property
    def shared(self) -> bool:
        return self.core_percent > 0 or self.memory_bytes > 0


@dataclass(frozen=True)
class Request:
    pod: PodRef
    container: str
    resource_name: str
    device_ids: tuple[str, ...]
    core_percent: int = 0
    memory_bytes: int = 0


@dataclass
class Ledger:
    """Live allocations of one node; ``allocate`` guarantees nothing is overcommitted.

    Rules: a whole device (or partition) belongs to one allocation; shared allocations on one
    device sum to at most 100 % of its compute and at most its memory; a partitioned GPU is
    allocated only through its partitions; unhealthy devices and devices bound to vfio-pci take no
    new allocations.
    """

    inventory: Inventory
    node: str
    allocations: dict[str, Allocation] = field(default_factory=dict)
    issued: int = 0
    """Allocation ids given out so far (ids are never reused, also across restarts)."""

    def allocate(self, req: Request, devices: dict[str, Device]) -> Allocation:
        self._check_request(req)
        kind, shared_resource = RESOURCES[req.resource_name]
        shared = req.core_percent > 0 or req.memory_bytes > 0
        if shared_resource and not shared:
            raise RuntimeRefusal(
                Refusal.INVALID,
                f"{req.resource_name} is a shared resource: give core_percent and/or memory_bytes",
            )
        targets = [self._target(dev_id, devices, kind) for dev_id in req.device_ids]
        for target in targets:
            self._check_capacity(target, req, shared)
        self.issued += 1
        alloc_id = f"alloc-{self.issued:06d}"
        alloc = Allocation(
            alloc_id,
            req.pod,
            req.container,
            req.resource_name,
            req.device_ids,
            req.core_percent,
            req.memory_bytes,
            self._injection(alloc_id, req, targets),
        )
        self.allocations[alloc_id] = alloc
        return alloc

    def to_json(self) -> dict[str, Any]:
        """The allocations and the id counter, for the Runtime's state file."""
        return {
            "issued": self.issued,
            "allocations": [
                {
                    "id": a.id,
                    "pod": [a.pod.namespace, a.pod.name, a.pod.uid],
                    "container": a.container,
                    "resource_name": a.resource_name,
                    "device_ids": list(a.device_ids),
                    "core_percent": a.core_percent,
                    "memory_bytes": a.memory_bytes,
                    "injection": {
                        "envs": a.injection.envs,
                        "annotations": a.injection.annotations,
                        "device_nodes": [list(d) for d in a.injection.device_nodes],
                        "mounts": [list(m) for m in a.injection.mounts],
                    },
                }
                for a in self.allocations.values()
            ],
        }

    def load_json(self, doc: dict[str, Any]) -> None:
        """Restore what :meth:`to_json` wrote (KeyError/TypeError/ValueError when malformed)."""
        restored: dict[str, Allocation] = {}
        for item in doc["allocations"]:
            inj = item["injection"]
            restored[str(item["id"])] = Allocation(
                str(item["id"]),
                PodRef(*(str(x) for x in item["pod"])),
                str(item["container"]),
                str(item["resource_name"]),
                tuple(str(d) for d in item["device_ids"]),
                int(item["core_percent"]),
                int(item["memory_bytes"]),
                Injection(
                    {str(k): str(v) for k, v in inj["envs"].items()},
                    {str(k): str(v) for k, v in inj["annotations"].items()},
                    tuple((str(a), str(b), str(c)) for a, b, c in inj["device_nodes"]),
                    tuple((str(a), str(b), bool(c)) for a, b, c in inj["mounts"]),
                ),
            )
        self.allocations = restored
        self.issued = int(doc["issued"])

    def release(self, allocation_id: str, pod_uid: str) -> int:
        """Free one allocation, or all of a pod's; unknown ones are not an error."""
        if allocation_id:
            return 1 if self.allocations.pop(allocation_id, None) else 0
        mine = [a for a in self.allocations.values() if pod_uid and a.pod.uid == pod_uid]
        for a in mine:
            del self.allocations[a.id]
        return len(mine)

    def on_device(self, device_id: str) -> list[Allocation]:
        """Allocations that hold the device or one of its partitions."""
        prefix = f"{device_id}-"
        return [
            a
            for a in self.allocations.values()
            if any(d == device_id or d.startswith(prefix) for d in a.device_ids)
        ]

    def _check_request(self, req: Request) -> None:
        missing = [
            n
            for n, v in (
                ("pod.namespace", req.pod.namespace),
                ("pod.name", req.pod.name),
                ("pod.uid", req.pod.uid),
                ("container", req.container),
            )
            if not v
        ]
        if missing:
            raise RuntimeRefusal(Refusal.INVALID, f"allocate: missing {', '.join(missing)}")
        if req.resource_name not in RESOURCES:
            raise RuntimeRefusal(
                Refusal.INVALID,
                f"unknown resource {req.resource_name!r}; this Runtime serves {sorted(RESOURCES)}",
            )
        if not req.device_ids:
            raise RuntimeRefusal(Refusal.INVALID, "allocate: no device ids given")
        if len(set(req.device_ids)) != len(req.device_ids):
            raise RuntimeRefusal(Refusal.INVALID, f"allocate: device ids repeat: {req.device_ids}")
        if req.core_percent > 100:
            raise RuntimeRefusal(
                Refusal.INVALID, f"core_percent {req.core_percent} is over 100 (one whole device)"
            )

    def _target(
        self, dev_id: str, devices: dict[str, Device], kind: Kind
    ) -> tuple[Device, Partition | None]:
        for device in devices.values():
            if device.id == dev_id:
                target: tuple[Device, Partition | None] = (device, None)
                break
            part = next((p for p in device.partitions if p.id == dev_id), None)
            if part is not None:
                target = (device, part)
                break
        else:
            raise RuntimeRefusal(
                Refusal.INVALID,
                f"unknown device id {dev_id!r} on node {self.node}; known: {sorted(devices)}",
            )
        device, part = target
        if device.binding is Binding.VFIO:
            raise RuntimeRefusal(
                Refusal.PRECONDITION,
                f"{dev_id} is bound to vfio-pci (passed through to a VM): the Runtime allocates "
                "nothing on it; bind it to the driver first",
            )
        if device.kind is not kind:
            raise RuntimeRefusal(
                Refusal.INVALID,
                f"{dev_id} is a {device.kind.value}, the resource asks for a {kind.value}",
            )
        health = part.health if part else device.health
        if not device.health.healthy or not health.healthy:
            raise RuntimeRefusal(
                Refusal.PRECONDITION,
                f"{dev_id} is unhealthy: {health.reason or device.health.reason}",
            )
        if part is None and device.partitions:
            raise RuntimeRefusal(
                Refusal.PRECONDITION,
                f"{dev_id} is partitioned "
                f"({device.mode.value}); allocate its partitions "
                f"{[p.id for p in device.partitions]}",
            )
        return target

    def _check_capacity(
        self, target: tuple[Device, Partition | None], req: Request, shared: bool
    ) -> None:
        device, part = target
        unit_id = part.id if part else device.id
        memory = part.memory_bytes if part else device.memory_bytes
        holders = [a for a in self.allocations.values() if unit_id in a.device_ids]
        whole = [a.id for a in holders if not a.shared]
        if whole:
            raise RuntimeRefusal(Refusal.EXHAUSTED, f"{unit_id} is held whole by {whole[0]}")
        if not shared:
            if holders:
                raise RuntimeRefusal(
                    Refusal.EXHAUSTED,
                    f"{unit_id} is shared by "
                    f"{[a.id for a in holders]}; it cannot be allocated whole",
                )
            return
        used_core = sum(a.core_percent for a in holders)
        used_mem = sum(a.memory_bytes for a in holders)
        if req.memory_bytes > memory:
            raise RuntimeRefusal(
                Refusal.INVALID,
                f"{unit_id}: {req.memory_bytes} bytes asked, the device has {memory}",
            )
        if used_core + req.core_percent > 100:
            raise RuntimeRefusal(
                Refusal.EXHAUSTED,
                f"{unit_id}: {req.core_percent}% core asked, {100 - used_core}% of 100% free",
            )
        if used_mem + req.memory_bytes > memory:
            raise RuntimeRefusal(
                Refusal.EXHAUSTED,
                f"{unit_id}: {req.memory_bytes} bytes asked, {memory - used_mem} of {memory} free",
            )

    def _injection(
        self, alloc_id: str, req: Request, targets: list[tuple[Device, Partition | None]]
    ) -> Injection:
        uuids = [f"MIG-{d.uuid[4:]}/{p.id}" if p else d.uuid for d, p in targets]
        kinds = {d.kind for d, _ in targets}
        envs = {"LJ_VISIBLE_DEVICES": ",".join(req.device_ids), "LJ_ALLOCATION_ID": alloc_id}
        if Kind.GPU in kinds:
            envs["NVIDIA_VISIBLE_DEVICES"] = ",".join(uuids)
        if Kind.PPU in kinds:
            envs["ALIXPU_VISIBLE_DEVICES"] = ",".join(str(d.index) for d, _ in targets)
        # "xdm.amp.com.<name>", never "xdm.amp.com/<name>": containerd passes only keys that
        # the handler's ["xdm.amp.com*"] matches with Go's path.Match, whose * stops at "/".
        p = f"{ANNOTATION_PREFIX}."
        annotations = {
            f"{p}allocation-id": alloc_id,
            f"{p}devices": ",".join(req.device_ids),
            f"{p}device-uuids": ",".join(uuids),
            f"{p}node": self.node,
            f"{p}pod-uid": req.pod.uid,
        }
        if req.core_percent or req.memory_bytes:
            envs["LJ_GPU_CORE_PERCENT"] = str(req.core_percent)
            envs["LJ_GPU_MEMORY_LIMIT_BYTES"] = str(req.memory_bytes)
            annotations[f"{p}core-percent"] = str(req.core_percent)
            annotations[f"{p}memory-bytes"] = str(req.memory_bytes)
        paths = [n for d, _ in targets for n in d.device_nodes] + list(
            self.inventory.control_device_nodes
        )
        nodes = tuple((n, n, "rwm") for n in dict.fromkeys(paths))
        return Injection(envs, annotations, nodes, ((DRIVER_MOUNT[0], DRIVER_MOUNT[1], True),))
