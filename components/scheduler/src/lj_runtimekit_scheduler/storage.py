"""The scheduler's cache of storage objects, with assumed PVs and claims. No I/O.

Fed by the storage informers (``feed.py``). As kube-scheduler's assume cache, a PV or claim the
scheduler decided on is *assumed* in its new shape (a PV's claimRef set, a claim's
selected-node annotation) from Reserve until the watch shows a newer version of the object, or
until Unreserve restores the apiserver's: so the next cycle sees that PV taken, and two pods in
flight never get one PV.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from . import volumes
from .volumes import Capacity, Claim, CsiDriver, CsiNode, StorageClass, Volume

Json = dict[str, Any]

KINDS = (
    "persistentvolumeclaims",
    "persistentvolumes",
    "storageclasses",
    "csinodes",
    "csidrivers",
    "csistoragecapacities",
)
"""The storage kinds the scheduler lists and watches, in its feed's order."""


class OutOfSync(Exception):
    """An object assumed from a version older than the one the cache holds (kube-scheduler's
    assume cache refuses it the same way): the cycle's view is stale, try again."""


def _version(v: str) -> int:
    """An etcd resourceVersion as a number (its versioner's reading); unparsable: 0."""
    try:
        return int(v)
    except ValueError:
        return 0


def _key(kind: str, raw: Json) -> str:
    meta = raw["metadata"]
    if kind in ("persistentvolumeclaims", "csistoragecapacities"):
        return f"{meta.get('namespace', 'default')}/{meta['name']}"
    return str(meta["name"])


class Storage:
    """Claims, volumes, classes, CSI nodes, drivers and capacities; assumed PVs and claims."""

    def __init__(self) -> None:
        self.claims: dict[str, Claim] = {}
        """namespace/name → the apiserver's claim."""
        self.volumes: dict[str, Volume] = {}
        """name → the apiserver's PV."""
        self.classes: dict[str, StorageClass] = {}
        self.csi_nodes: dict[str, CsiNode] = {}
        self.drivers: dict[str, CsiDriver] = {}
        self.capacities: dict[str, Capacity] = {}
        self._assumed_claims: dict[str, Claim] = {}
        self._assumed_volumes: dict[str, Volume] = {}
        self._by_class: dict[str, set[str]] = {}
        """storage class → names of the PVs of that class (the PV cache's class index)."""
        self.listed: set[str] = set()
        """Kinds listed at least once: until then nothing is known of them."""
        self.generation = 0
        self.stopping = False
        """Set when the scheduler stops: a PreBind waiting for its volumes gives up."""
        self._listeners: list[Callable[[], None]] = []

    # -- the informers
    def apply(self, kind: str, ev_type: str, raw: Json) -> None:
        """An event of the ``kind`` informer (ADDED, MODIFIED, DELETED)."""
        key = _key(kind, raw)
        if ev_type == "DELETED":
            self._drop(kind, key)
        else:
            self._put(kind, key, raw)
        self._changed()

    def relist(self, kind: str, items: Iterable[Json]) -> None:
        """Before a list is replayed: drop what it no longer holds."""
        keep = {_key(kind, i) for i in items if isinstance(i.get("metadata"), dict)}
        for key in [k for k in self._table(kind) if k not in keep]:
            self._drop(kind, key)
        self.listed.add(kind)
        self._changed()

    def _table(self, kind: str) -> dict[str, Any]:
        tables: dict[str, dict[str, Any]] = {
            "persistentvolumeclaims": self.claims,
            "persistentvolumes": self.volumes,
            "storageclasses": self.classes,
            "csinodes": self.csi_nodes,
            "csidrivers": self.drivers,
            "csistoragecapacities": self.capacities,
        }
        return tables[kind]

    def _put(self, kind: str, key: str, raw: Json) -> None:
        if kind == "persistentvolumeclaims":
            c = volumes.claim(raw)
            self.claims[key] = c
            self._supersede(self._assumed_claims, key, c.version)
        elif kind == "persistentvolumes":
            v = volumes.volume(raw)
            old = self.volumes.get(key)
            if old is not None:
                self._by_class.get(old.storage_class, set()).discard(key)
            self.volumes[key] = v
            self._by_class.setdefault(v.storage_class, set()).add(key)
            self._supersede(self._assumed_volumes, key, v.version)
        elif kind == "storageclasses":
            self.classes[key] = volumes.storage_class(raw)
        elif kind == "csinodes":
            self.csi_nodes[key] = volumes.csi_node(raw)
        elif kind == "csidrivers":
            self.drivers[key] = volumes.csi_driver(raw)
        else:
            self.capacities[key] = volumes.capacity(raw)

    @staticmethod
    def _supersede(assumed: dict[str, Any], key: str, version: str) -> None:
        # a newer version from the apiserver replaces the assumed one (the assume cache's rule)
        held = assumed.get(key)
        if held is not None and _version(version) > _version(held.version):
            del assumed[key]

    def _drop(self, kind: str, key: str) -> None:
        old = self._table(kind).pop(key, None)
        if kind == "persistentvolumes":
            self._assumed_volumes.pop(key, None)
            if old is not None:
                self._by_class.get(old.storage_class, set()).discard(key)
        elif kind == "persistentvolumeclaims":
            self._assumed_claims.pop(key, None)

    # -- what the plugins read
    def claim(self, namespace: str, name: str) -> Claim | None:
        """The claim as the scheduler sees it: assumed if it is, else the apiserver's."""
        key = f"{namespace}/{name}"
        return self._assumed_claims.get(key) or self.claims.get(key)

    def volume(self, name: str) -> Volume | None:
        """The PV as the scheduler sees it: assumed if it is, else the apiserver's."""
        return self._assumed_volumes.get(name) or self.volumes.get(name)

    def volumes_of_class(self, storage_class: str) -> list[Volume]:
        """Every PV of the class, as the scheduler sees it (assumed ones assumed)."""
        out = [self.volume(n) for n in sorted(self._by_class.get(storage_class, ()))]
        return [v for v in out if v is not None]

    # -- Reserve / Unreserve
    def assume_volume(self, v: Volume) -> None:
        held = self.volume(v.name)
        if held is None:
            raise OutOfSync(f"PersistentVolume {v.name!r} is not in the cache")
        if _version(v.version) < _version(held.version):
            raise OutOfSync(
                f"PersistentVolume {v.name!r} is out of sync (stored: {held.version}, "
                f"assume: {v.version})"
            )
        self._assumed_volumes[v.name] = v
        self._changed()

    def assume_claim(self, c: Claim) -> None:
        held = self.claim(c.namespace, c.name)
        if held is None:
            raise OutOfSync(f"PersistentVolumeClaim {c.key!r} is not in the cache")
        if _version(c.version) < _version(held.version):
            raise OutOfSync(
                f"PersistentVolumeClaim {c.key!r} is out of sync (stored: {held.version}, "
                f"assume: {c.version})"
            )
        self._assumed_claims[c.key] = c
        self._changed()

    def restore_volume(self, name: str) -> None:
        if self._assumed_volumes.pop(name, None) is not None:
            self._changed()

    def restore_claim(self, key: str) -> None:
        if self._assumed_claims.pop(key, None) is not None:
            self._changed()

    def is_assumed(self, kind: str, key: str) -> bool:
        table = self._assumed_volumes if kind == "persistentvolumes" else self._assumed_claims
        return key in table

    # -- waiting for the PV controller
    def subscribe(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after every change (a PreBind waiting for its claims to bind)."""
        self._listeners.append(listener)

    def unsubscribe(self, listener: Callable[[], None]) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def stop(self) -> None:
        self.stopping = True
        self._changed()

    def _changed(self) -> None:
        self.generation += 1
        for listener in list(self._listeners):
            listener()
