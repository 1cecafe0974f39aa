"""The simulated node's live state: devices (health, partitioning, binding), allocations, features.

Changes are published to watchers as ``(event type, devices)``; features, partitioning, bindings
and allocations are kept in an optional JSON state file so that a restarted simulator comes back
as it was left.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path

import structlog

from lj_runtimekit_testkit.simulator.inventory import (
    Binding,
    Device,
    Health,
    Inventory,
    InventoryError,
    Mode,
    partitions_for,
)
from lj_runtimekit_testkit.simulator.ledger import (
    Allocation,
    Ledger,
    PodRef,
    Refusal,
    Request,
    RuntimeRefusal,
)

log = structlog.get_logger("lj_runtime_sim")


@dataclass(frozen=True)
class DeviceEvent:
    kind: str  # "ADDED", "REMOVED", "HEALTH_CHANGED", "PARTITIONS_CHANGED"; None ends a stream
    devices: tuple[Device, ...]


class NodeState:
    """One node: mutable devices, the allocation ledger, feature switches, watcher queues."""

    def __init__(
        self, inventory: Inventory, node: str | None = None, state_file: Path | None = None
    ) -> None:
        self.inventory = inventory
        self.node = node or inventory.node
        self.devices: dict[str, Device] = {d.id: d for d in inventory.devices}
        self.ledger = Ledger(inventory, self.node)
        self.features: dict[str, bool] = {f: inventory.features_enabled for f in inventory.features}
        self.state_file = state_file
        self._watchers: set[asyncio.Queue[DeviceEvent | None]] = set()
        self._load_state()

    # ---------------------------------------------------------------- watchers
    def subscribe(self) -> asyncio.Queue[DeviceEvent | None]:
        queue: asyncio.Queue[DeviceEvent | None] = asyncio.Queue()
        self._watchers.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[DeviceEvent | None]) -> None:
        self._watchers.discard(queue)

    def end_watches(self) -> None:
        """Tell every open WatchDevices stream to end (with UNAVAILABLE: the Runtime goes away)."""
        for queue in self._watchers:
            queue.put_nowait(None)

    def publish(self, kind: str, devices: tuple[Device, ...]) -> None:
        for queue in self._watchers:
            queue.put_nowait(DeviceEvent(kind, devices))

    # ---------------------------------------------------------------- changes
    def set_health(self, device_id: str, healthy: bool, reason: str = "") -> None:
        """Flip a device or one partition; publishes HEALTH_CHANGED only when it changed."""
        health = Health(healthy, "" if healthy else (reason or "unhealthy (simulated)"))
        for dev in self.devices.values():
            if dev.id == device_id:
                if dev.health == health:
                    return
                new = replace(dev, health=health)
                break
            parts = [replace(p, health=health) if p.id == device_id else p for p in dev.partitions]
            if parts != list(dev.partitions):
                new = replace(dev, partitions=tuple(parts))
                break
            if any(p.id == device_id for p in dev.partitions):
                return
        else:
            raise KeyError(
                f"unknown device or partition {device_id!r}; known: {sorted(self.devices)}"
            )
        self.devices[new.id] = new
        log.info(
            "device_health_changed",
            node=self.node,
            device=device_id,
            healthy=healthy,
            reason=health.reason,
        )
        self.publish("HEALTH_CHANGED", (new,))

    def remove_device(self, device_id: str) -> None:
        dev = self.devices.pop(device_id)
        self.publish("REMOVED", (dev,))

    def add_device(self, device: Device) -> None:
        if device.id in self.devices:
            raise ValueError(f"device {device.id!r} exists already")
        self.devices[device.id] = device
        self.publish("ADDED", (device,))

    def set_features(self, enabled: bool, names: list[str]) -> bool:
        unknown = sorted(set(names) - set(self.features))
        if unknown:
            raise RuntimeRefusal(
                Refusal.INVALID,
                f"unknown features {unknown}; this Runtime has {sorted(self.features)}",
            )
        before = dict(self.features)
        for name in names or list(self.features):
            self.features[name] = enabled
        changed = before != self.features
        if changed:
            log.info("features_changed", node=self.node, features=self.features)
            self._save_state()
        return changed

    @property
    def enabled(self) -> bool:
        return any(self.features.values())

    def set_partitioning(self, device_id: str, mode: Mode, specs: list[str] | list[int]) -> Device:
        """Repartition an idle device; raises RuntimeRefusal with the reason it cannot."""
        dev = self.devices.get(device_id)
        if dev is None:
            raise RuntimeRefusal(
                Refusal.NOT_FOUND, f"unknown device {device_id!r}; known: {sorted(self.devices)}"
            )
        if dev.binding is Binding.VFIO:
            raise RuntimeRefusal(
                Refusal.PRECONDITION,
                f"{device_id} is bound to vfio-pci (passed through whole): "
                "bind it to the driver before partitioning it",
            )
        if mode is not Mode.NONE and mode not in dev.supports:
            raise RuntimeRefusal(
                Refusal.PRECONDITION,
                f"{device_id} does not support "
                f"{mode.value}; it supports {sorted(m.value for m in dev.supports)}",
            )
        busy = self.ledger.on_device(device_id)
        if busy:
            raise RuntimeRefusal(
                Refusal.PRECONDITION,
                f"{device_id} has live allocations {[a.id for a in busy]}; release them first",
            )
        try:
            parts = partitions_for(device_id, dev.memory_bytes, dev.compute_units, mode, specs)
        except InventoryError as e:
            raise RuntimeRefusal(Refusal.INVALID, str(e)) from e
        new = replace(dev, mode=mode, partitions=parts)
        if new != dev:
            self.devices[device_id] = new
            log.info(
                "partitioning_changed",
                node=self.node,
                device=device_id,
                mode=mode.value,
                partitions=[p.id for p in parts],
            )
            self.publish("PARTITIONS_CHANGED", (new,))
            self._save_state()
        return new

    def create_partition(self, device_id: str, mode: Mode, spec: str | int) -> tuple[Device, str]:
        """Add one partition beside a device's others, which stay with their allocations;
        (device, new partition id). Raises RuntimeRefusal with the reason it cannot: unknown or
        vfio-bound device, a mode it does not support or another mode than it is in, the device
        held whole or shared, or a partition that does not fit beside the ones it has."""
        dev = self._device_to_partition(device_id, mode)
        if dev.mode not in (Mode.NONE, mode):
            raise RuntimeRefusal(
                Refusal.PRECONDITION,
                f"{device_id} is in {dev.mode.value} mode with partitions "
                f"{[p.id for p in dev.partitions]}: a {mode.value} partition cannot join them",
            )
        if not dev.partitions:
            whole = [a.id for a in self.ledger.allocations.values() if device_id in a.device_ids]
            if whole:
                raise RuntimeRefusal(
                    Refusal.PRECONDITION,
                    f"{device_id} is allocated whole or shared by {whole}; release them first",
                )
        specs: list[str] | list[int] = (
            [p.profile for p in dev.partitions] + [str(spec)]
            if mode is Mode.MIG
            else [p.time_percent for p in dev.partitions] + [int(spec)]
        )
        try:
            parts = partitions_for(device_id, dev.memory_bytes, dev.compute_units, mode, specs)
        except InventoryError as e:
            raise RuntimeRefusal(Refusal.PRECONDITION, str(e)) from e
        kept = dev.partitions
        taken = {p.id for p in kept}
        added = parts[-1]
        stem = added.id.rsplit("-", 1)[0]
        n = 0
        while f"{stem}-{n}" in taken:
            n += 1
        added = replace(added, id=f"{stem}-{n}")
        new = replace(dev, mode=mode, partitions=(*kept, added))
        self.devices[device_id] = new
        log.info("partition_created", node=self.node, device=device_id, partition=added.id)
        self.publish("PARTITIONS_CHANGED", (new,))
        self._save_state()
        return new, added.id

    def delete_partition(self, partition_id: str) -> tuple[Device, bool]:
        """Remove one partition no allocation holds; the device is whole once its last partition
        goes. (device, deleted); an id no device has is NOT_FOUND."""
        dev = next(
            (d for d in self.devices.values() if any(p.id == partition_id for p in d.partitions)),
            None,
        )
        if dev is None:
            raise RuntimeRefusal(Refusal.NOT_FOUND, f"no device has a partition {partition_id!r}")
        holders = [a.id for a in self.ledger.allocations.values() if partition_id in a.device_ids]
        if holders:
            raise RuntimeRefusal(
                Refusal.PRECONDITION,
                f"{partition_id} is held by {holders}; release them first",
            )
        left = tuple(p for p in dev.partitions if p.id != partition_id)
        new = replace(dev, mode=dev.mode if left else Mode.NONE, partitions=left)
        self.devices[dev.id] = new
        log.info("partition_deleted", node=self.node, device=dev.id, partition=partition_id)
        self.publish("PARTITIONS_CHANGED", (new,))
        self._save_state()
        return new, True

    def _device_to_partition(self, device_id: str, mode: Mode) -> Device:
        dev = self.devices.get(device_id)
        if dev is None:
            raise RuntimeRefusal(
                Refusal.NOT_FOUND, f"unknown device {device_id!r}; known: {sorted(self.devices)}"
            )
        if dev.binding is Binding.VFIO:
            raise RuntimeRefusal(
                Refusal.PRECONDITION,
                f"{device_id} is bound to vfio-pci (passed through whole): "
                "bind it to the driver before partitioning it",
            )
        if mode not in dev.supports:
            raise RuntimeRefusal(
                Refusal.PRECONDITION,
                f"{device_id} does not support "
                f"{mode.value}; it supports {sorted(m.value for m in dev.supports)}",
            )
        return dev

    def set_binding(self, device_id: str, binding: Binding) -> tuple[Device, bool]:
        """Bind a whole, idle device to the driver or to vfio-pci; (device, changed).

        Raises RuntimeRefusal: unknown device, or to vfio while partitioned or allocated (a
        pass-through takes the whole device away from the Runtime)."""
        dev = self.devices.get(device_id)
        if dev is None:
            raise RuntimeRefusal(
                Refusal.NOT_FOUND, f"unknown device {device_id!r}; known: {sorted(self.devices)}"
            )
        if dev.binding is binding:
            return dev, False
        if binding is Binding.VFIO:
            if dev.mode is not Mode.NONE:
                raise RuntimeRefusal(
                    Refusal.PRECONDITION,
                    f"{device_id} is in {dev.mode.value} mode: only a whole device can be bound "
                    "to vfio-pci; set its partitioning to none first",
                )
            busy = self.ledger.on_device(device_id)
            if busy:
                raise RuntimeRefusal(
                    Refusal.PRECONDITION,
                    f"{device_id} has live allocations {[a.id for a in busy]}; release them "
                    "before binding it to vfio-pci",
                )
        new = replace(dev, binding=binding)
        self.devices[device_id] = new
        log.info(
            "binding_changed",
            node=self.node,
            device=device_id,
            binding=binding.value,
            device_nodes=list(new.nodes),
        )
        self.publish("PARTITIONS_CHANGED", (new,))
        self._save_state()
        return new, True

    def allocate(self, req: Request) -> Allocation:
        alloc = self.ledger.allocate(req, self.devices)
        self._save_state()
        return alloc

    def release(self, allocation_id: str, pod_uid: str) -> int:
        released = self.ledger.release(allocation_id, pod_uid)
        if released:
            self._save_state()
        return released

    def reown(self, allocation_id: str, pod: PodRef, container: str) -> Allocation:
        """Record the real owner of an allocation; devices and injection stay as they are."""
        if not (pod.namespace and pod.name and pod.uid and container):
            raise RuntimeRefusal(
                Refusal.INVALID, "update owner: pod namespace, name, uid and container are required"
            )
        old = self.ledger.allocations.get(allocation_id)
        if old is None:
            raise RuntimeRefusal(Refusal.NOT_FOUND, f"unknown allocation {allocation_id!r}")
        new = replace(old, pod=pod, container=container)
        self.ledger.allocations[allocation_id] = new
        self._save_state()
        log.info(
            "allocation_reowned",
            node=self.node,
            allocation=allocation_id,
            pod=f"{pod.namespace}/{pod.name}",
            container=container,
        )
        return new

    # ---------------------------------------------------------------- state file
    def _save_state(self) -> None:
        if self.state_file is None:
            return
        doc = {
            "version": "v1",
            "features": self.features,
            # A Runtime's allocations outlive its process (guide §7.2: an upgrade frees nothing).
            "ledger": self.ledger.to_json(),
            "partitioning": {
                d.id: {
                    "mode": d.mode.value,
                    "specs": [
                        p.profile if d.mode is Mode.MIG else p.time_percent for p in d.partitions
                    ],
                    # partitions made one by one keep their ids across a restart
                    "ids": [p.id for p in d.partitions],
                }
                for d in self.devices.values()
            },
            "binding": {d.id: d.binding.value for d in self.devices.values()},
        }
        tmp = self.state_file.with_suffix(self.state_file.suffix + ".tmp")
        # A Runtime owns its state directory: the first save makes it.
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(doc, indent=2), encoding="utf-8")
        os.replace(tmp, self.state_file)

    def _load_state(self) -> None:
        if self.state_file is None or not self.state_file.exists():
            return
        try:
            doc = json.loads(self.state_file.read_text(encoding="utf-8"))
            if doc.get("version") != "v1":
                raise ValueError(f"version {doc.get('version')!r}, expected 'v1'")
            for name, on in doc["features"].items():
                if name in self.features:
                    self.features[name] = bool(on)
            if "ledger" in doc:
                self.ledger.load_json(doc["ledger"])
            for dev_id, spec in doc["partitioning"].items():
                dev = self.devices.get(dev_id)
                if dev is not None:
                    mode = Mode(spec["mode"])
                    parts = partitions_for(
                        dev_id, dev.memory_bytes, dev.compute_units, mode, spec["specs"]
                    )
                    ids = spec.get("ids", [])
                    if len(ids) == len(parts):
                        parts = tuple(
                            replace(p, id=str(i)) for p, i in zip(parts, ids, strict=True)
                        )
                    self.devices[dev_id] = replace(dev, mode=mode, partitions=parts)
            # absent from a state file written before bindings were modelled
            for dev_id, value in doc.get("binding", {}).items():
                dev = self.devices.get(dev_id)
                if dev is not None:
                    self.devices[dev_id] = replace(dev, binding=Binding(value))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise InventoryError(
                f"state file {self.state_file} is unreadable: {e}; "
                "delete it to start from the inventory"
            ) from e
