"""``files.write_atomic``: the old file or the new one, never a part, and no temporary left."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.shape_tests.canonical import files


def test_a_write_replaces_the_file_and_makes_missing_directories(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "config.toml"
    files.write_atomic(path, b"old\n")
    files.write_atomic(path, b"new\n")
    assert path.read_bytes() == b"new\n"
    assert sorted(p.name for p in path.parent.iterdir()) == ["config.toml"]


@pytest.mark.parametrize(("mode", "want"), [(0o644, 0o644), (0o600, 0o600), (None, 0o600)])
def test_the_mode_is_the_one_asked_or_mkstemps(tmp_path: Path, mode: int | None, want: int) -> None:
    path = tmp_path / "spec.json"
    files.write_atomic(path, b"{}", mode=mode, owner=(os.getuid(), os.getgid()))
    assert path.stat().st_mode & 0o7777 == want


@pytest.mark.parametrize("sync_dir", [True, False])
def test_a_failed_rename_keeps_the_old_file_and_leaves_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sync_dir: bool
) -> None:
    path = tmp_path / "checkpoint"
    files.write_atomic(path, b"old", sync_dir=sync_dir)

    def refuse(src: str, dst: Path) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError, match="No space left"):
        files.write_atomic(path, b"new", sync_dir=sync_dir)
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint"]
