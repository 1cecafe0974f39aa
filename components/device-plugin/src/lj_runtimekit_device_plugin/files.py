"""Atomic file writes: a reader, or a crash, sees the old file or the new one, never a part."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(
    path: Path,
    data: bytes,
    *,
    mode: int | None = None,
    owner: tuple[int, int] | None = None,
    sync_dir: bool = True,
) -> None:
    """Replace ``path`` by ``data``: write a temporary file beside it, fsync, rename over it.

    The temporary name is ``.<name>.<random>.tmp`` in the same directory (so the rename is
    atomic, and a reader of ``*.json``/``*.toml`` never picks it up); it is removed when anything
    fails, the exception raised as it came (``OSError`` for the disk's refusals). ``mode``: the
    file's permission bits (None: ``mkstemp``'s 0600); ``owner``: ``(uid, gid)`` to give it, so a
    replaced file keeps its owner; ``sync_dir``: fsync the directory too, so the rename itself
    survives a power loss. Missing parent directories are made.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if owner is not None:
            os.chown(tmp, *owner)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if sync_dir:
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
