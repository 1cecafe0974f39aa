"""What the DRA plugin has prepared, kept across restarts of the plugin and of the kubelet.

The kubelet may call ``NodePrepareResources`` again for a claim already prepared (after either
restarts) and ``NodeUnprepareResources`` for one prepared before a restart. The checkpoint lets the
plugin answer the first with the same CDI ids without a second Runtime ``Allocate``, and the second
with the ``Release`` of exactly the allocations it made.

Prepared state does not survive a reboot (the Runtime's allocations and the CDI specs under /var/run
are gone), so the checkpoint carries the node's boot id and one from another boot is ignored. A
file that cannot be read back (torn write, disk error, hand edit) is reported, moved aside for
inspection and treated as empty: the plugin never crashes on it.

The codec (:func:`encode`, :func:`decode`) is pure; :class:`CheckpointStore` is the small file store
around it (``files.write_atomic``: a reader sees the old or the new file whole).
"""

from __future__ import annotations

import enum
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from ..errors import PermanentError
from ..files import write_atomic

log = structlog.get_logger(__name__)

FORMAT_VERSION = 1
BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
CORRUPT_SUFFIX = ".corrupt"


class CorruptCheckpoint(PermanentError):
    """The checkpoint's bytes are not a checkpoint this code wrote."""


@dataclass(frozen=True)
class ClaimRecord:
    """One prepared claim."""

    namespace: str
    name: str
    devices: tuple[str, ...] = ()
    """The ResourceSlice devices prepared (``<pool>/<device>``)."""
    allocation_ids: tuple[str, ...] = ()
    """The Runtime allocations made for them: what unprepare releases."""
    cdi_device_ids: tuple[str, ...] = ()
    """What the kubelet was answered: a repeated prepare answers the same."""
    partition_ids: tuple[str, ...] = ()
    """Partitions made (or taken over) on demand for the claim: what unprepare removes after
    releasing (``dra_partitions: dynamic``); absent from the file when empty."""


@dataclass(frozen=True)
class Checkpoint:
    """Claim uid → its record, for one boot of the node."""

    boot_id: str
    claims: Mapping[str, ClaimRecord] = field(default_factory=dict)


class LoadOutcome(enum.Enum):
    MISSING = "missing"
    LOADED = "loaded"
    OTHER_BOOT = "other_boot"
    CORRUPT = "corrupt"


def _body(cp: Checkpoint) -> dict[str, Any]:
    return {
        "version": FORMAT_VERSION,
        "bootID": cp.boot_id,
        "claims": {
            uid: {
                "namespace": r.namespace,
                "name": r.name,
                "devices": list(r.devices),
                "allocationIDs": list(r.allocation_ids),
                "cdiDeviceIDs": list(r.cdi_device_ids),
                **({"partitionIDs": list(r.partition_ids)} if r.partition_ids else {}),
            }
            for uid, r in sorted(cp.claims.items())
        },
    }


def _checksum(body: Mapping[str, Any]) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def encode(cp: Checkpoint) -> bytes:
    """The checkpoint as JSON with a checksum over its body (so a torn or edited file is told
    apart from a valid one: JSON alone would accept a file cut after a complete element)."""
    body = _body(cp)
    return json.dumps({"checksum": _checksum(body), "data": body}, indent=1).encode()


def _strings(value: object, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CorruptCheckpoint(f"{what} is not a list of strings")
    return tuple(value)


def _record(uid: str, raw: object) -> ClaimRecord:
    if not isinstance(raw, dict):
        raise CorruptCheckpoint(f"claim {uid} is not an object")
    ns, name = raw.get("namespace"), raw.get("name")
    if not isinstance(ns, str) or not isinstance(name, str):
        raise CorruptCheckpoint(f"claim {uid} has no namespace and name")
    return ClaimRecord(
        namespace=ns,
        name=name,
        devices=_strings(raw.get("devices"), f"claim {uid} devices"),
        allocation_ids=_strings(raw.get("allocationIDs"), f"claim {uid} allocationIDs"),
        cdi_device_ids=_strings(raw.get("cdiDeviceIDs"), f"claim {uid} cdiDeviceIDs"),
        partition_ids=_strings(raw.get("partitionIDs", []), f"claim {uid} partitionIDs"),
    )


def decode(data: bytes) -> Checkpoint:
    """The checkpoint in ``data``; :class:`CorruptCheckpoint` for anything else."""
    try:
        outer = json.loads(data)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError
        raise CorruptCheckpoint(f"not JSON: {e}") from e
    if not isinstance(outer, dict) or not isinstance(outer.get("data"), dict):
        raise CorruptCheckpoint("no checkpoint data")
    body = outer["data"]
    if outer.get("checksum") != _checksum(body):
        raise CorruptCheckpoint("checksum mismatch: the file was cut short or edited")
    if body.get("version") != FORMAT_VERSION:
        raise CorruptCheckpoint(f"format version {body.get('version')!r} is not {FORMAT_VERSION}")
    boot_id, claims = body.get("bootID"), body.get("claims")
    if not isinstance(boot_id, str) or not isinstance(claims, dict):
        raise CorruptCheckpoint("no boot id or claims")
    return Checkpoint(boot_id, {uid: _record(uid, raw) for uid, raw in claims.items()})


def current(data: bytes | None, boot_id: str) -> tuple[Checkpoint, LoadOutcome]:
    """What to start from given the file's bytes (None: no file) on the boot ``boot_id``.

    A checkpoint from another boot, or none, is an empty one for this boot. Corrupt bytes raise
    :class:`CorruptCheckpoint` so that the store can set the file aside.
    """
    if data is None:
        return Checkpoint(boot_id), LoadOutcome.MISSING
    cp = decode(data)
    if cp.boot_id != boot_id:
        return Checkpoint(boot_id), LoadOutcome.OTHER_BOOT
    return cp, LoadOutcome.LOADED


def claimed_ids(checkpoint: Checkpoint) -> frozenset[str]:
    """The Runtime allocation ids of every claim the checkpoint holds."""
    return frozenset(i for r in checkpoint.claims.values() for i in r.allocation_ids)


def read_boot_id(path: Path = BOOT_ID_PATH) -> str:
    """The node's boot id, which the kernel renews on every boot."""
    return path.read_text().strip()


class CheckpointStore:
    """The checkpoint in one file, replaced atomically on every save."""

    def __init__(self, path: Path, boot_id: str) -> None:
        self.path = path
        self.boot_id = boot_id

    def load(self) -> tuple[Checkpoint, LoadOutcome]:
        """The checkpoint to start from; never raises for the file's content."""
        try:
            data: bytes | None = self.path.read_bytes()
        except FileNotFoundError:
            data = None
        try:
            cp, outcome = current(data, self.boot_id)
        except CorruptCheckpoint as e:
            aside = self.path.with_name(self.path.name + CORRUPT_SUFFIX)
            try:
                os.replace(self.path, aside)
            except OSError as moved:
                aside = Path(f"(not moved: {moved})")
            log.error(
                "dra_checkpoint_corrupt",
                path=str(self.path),
                moved_to=str(aside),
                error=str(e),
                hint="claims prepared before are unknown to the plugin: check the Runtime's "
                "allocations for ones no pod holds",
            )
            return Checkpoint(self.boot_id), LoadOutcome.CORRUPT
        if outcome is LoadOutcome.OTHER_BOOT:
            log.info("dra_checkpoint_from_other_boot_ignored", path=str(self.path))
        return cp, outcome

    def save(self, cp: Checkpoint) -> None:
        """Write ``cp`` so that a crash at any point leaves the old or the new file whole."""
        write_atomic(self.path, encode(cp))  # and the directory, so the rename survives too
