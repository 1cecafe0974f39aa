"""The DRA checkpoint: what was prepared survives restarts, not reboots, and never crashes us."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lj_runtimekit_device_plugin.dra.checkpoint import (
    Checkpoint,
    CheckpointStore,
    ClaimRecord,
    CorruptCheckpoint,
    LoadOutcome,
    _checksum,
    current,
    decode,
    encode,
    read_boot_id,
)

BOOT = "0b5a2c4e-1111-4a5b-8c9d-000000000001"
OTHER_BOOT = "0b5a2c4e-2222-4a5b-8c9d-000000000002"
RECORD = ClaimRecord(
    namespace="team-a",
    name="train-gpu",
    devices=("node-a/gpu-0", "node-a/gpu-1"),
    allocation_ids=("alloc-1",),
    cdi_device_ids=("aliyun.com/gpu=x-1", "aliyun.com/gpu=x-2"),
)
CP = Checkpoint(BOOT, {"uid-1": RECORD})

names = st.text(max_size=12)
records = st.builds(
    ClaimRecord,
    namespace=names,
    name=names,
    devices=st.lists(names, max_size=3).map(tuple),
    allocation_ids=st.lists(names, max_size=3).map(tuple),
    cdi_device_ids=st.lists(names, max_size=3).map(tuple),
    partition_ids=st.lists(names, max_size=2).map(tuple),
)
checkpoints = st.builds(
    Checkpoint, boot_id=names, claims=st.dictionaries(names, records, max_size=4)
)


@settings(max_examples=80, deadline=None)
@given(cp=checkpoints)
def test_decode_reads_back_what_encode_wrote(cp: Checkpoint) -> None:
    assert decode(encode(cp)) == cp


@settings(max_examples=80, deadline=None)
@given(cp=checkpoints, cut=st.integers(min_value=0))
def test_a_cut_file_is_corrupt_never_a_smaller_checkpoint(cp: Checkpoint, cut: int) -> None:
    data = encode(cp)
    cut %= len(data)
    with pytest.raises(CorruptCheckpoint):
        decode(data[:cut])


@settings(max_examples=80, deadline=None)
@given(data=st.binary(max_size=200))
def test_random_bytes_are_corrupt_or_a_checkpoint(data: bytes) -> None:
    with contextlib.suppress(CorruptCheckpoint):
        assert isinstance(decode(data), Checkpoint)


def test_an_edited_file_is_corrupt() -> None:
    doc = json.loads(encode(CP))
    doc["data"]["claims"]["uid-1"]["allocationIDs"] = ["someone-elses"]
    with pytest.raises(CorruptCheckpoint, match="checksum"):
        decode(json.dumps(doc).encode())


@pytest.mark.parametrize(
    "body",
    [
        {"version": 2, "bootID": BOOT, "claims": {}},
        {"version": 1, "bootID": BOOT, "claims": {"u": {"namespace": "n"}}},
        {"version": 1, "bootID": BOOT, "claims": {"u": "x"}},
        {"version": 1, "claims": {}},
        {
            "version": 1,
            "bootID": BOOT,
            "claims": {
                "u": {
                    "namespace": "n",
                    "name": "c",
                    "devices": [],
                    "allocationIDs": [],
                    "cdiDeviceIDs": [],
                    "partitionIDs": "gpu-0-mig-1g.10gb-0",
                }
            },
        },
    ],
)
def test_a_well_summed_but_foreign_body_is_corrupt(body: dict[str, object]) -> None:
    with pytest.raises(CorruptCheckpoint):
        decode(json.dumps({"checksum": _checksum(body), "data": body}).encode())


def test_a_checkpoint_from_another_boot_is_ignored() -> None:
    cp, outcome = current(encode(CP), OTHER_BOOT)
    assert outcome is LoadOutcome.OTHER_BOOT
    assert cp == Checkpoint(OTHER_BOOT)
    assert current(encode(CP), BOOT) == (CP, LoadOutcome.LOADED)
    assert current(None, BOOT) == (Checkpoint(BOOT), LoadOutcome.MISSING)


def test_store_saves_and_loads(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "dra" / "checkpoint.json", BOOT)
    assert store.load() == (Checkpoint(BOOT), LoadOutcome.MISSING)
    store.save(CP)
    assert store.load() == (CP, LoadOutcome.LOADED)
    # a restarted plugin (a new store on the same file) sees the same
    assert CheckpointStore(store.path, BOOT).load() == (CP, LoadOutcome.LOADED)
    # after a reboot it sees nothing prepared
    assert CheckpointStore(store.path, OTHER_BOOT).load()[1] is LoadOutcome.OTHER_BOOT
    # no temporary file is left beside it
    assert sorted(p.name for p in store.path.parent.iterdir()) == ["checkpoint.json"]


def test_store_sets_a_corrupt_file_aside_and_starts_empty(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_bytes(encode(CP)[:-7])
    store = CheckpointStore(path, BOOT)
    assert store.load() == (Checkpoint(BOOT), LoadOutcome.CORRUPT)
    assert not path.exists()
    assert (tmp_path / "checkpoint.json.corrupt").read_bytes() == encode(CP)[:-7]
    store.save(CP)
    assert store.load() == (CP, LoadOutcome.LOADED)


def test_a_failed_save_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = CheckpointStore(tmp_path / "checkpoint.json", BOOT)
    store.save(CP)

    def fail(*_: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(OSError, match="disk full"):
        store.save(Checkpoint(BOOT))
    monkeypatch.undo()
    assert store.load() == (CP, LoadOutcome.LOADED)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.json"]


def test_read_boot_id(tmp_path: Path) -> None:
    (tmp_path / "boot_id").write_text(BOOT + "\n")
    assert read_boot_id(tmp_path / "boot_id") == BOOT


def test_a_claim_without_partitions_is_written_as_before_they_existed() -> None:
    """A checkpoint of a plugin older than partitions on demand reads the same, and one written
    now for claims without partitions is the same bytes: an upgrade or downgrade loses nothing."""
    doc = json.loads(encode(CP))
    assert "partitionIDs" not in doc["data"]["claims"]["uid-1"]
    made = Checkpoint(
        BOOT, {"uid-1": ClaimRecord("ns", "c", partition_ids=("gpu-3-mig-3g.40gb-0",))}
    )
    assert decode(encode(made)) == made
