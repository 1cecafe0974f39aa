"""The host side of the node: containerd's config files and its restart, under a root prefix."""

from __future__ import annotations

import asyncio
import os
import shlex
import time
from pathlib import Path

from . import files
from .errors import PermanentError, TemporaryError


class HostFileError(PermanentError):
    """A host file cannot be read or written."""


class ContainerdNotBack(TemporaryError):
    """containerd's restart command failed, or containerd did not answer after it."""


def on_host(root: str, path: str) -> Path:
    """``path`` (absolute on the host) seen under the host root prefix ``root``."""
    return Path(root) / path.lstrip("/")


class NotUtf8(HostFileError):
    """A host file is not UTF-8 text (TOML files must be, and containerd reads them as such)."""


def resolve(root: str, path: str | Path) -> Path:
    """``path`` under ``root`` with its own symlinks followed as the host would: an absolute
    target is a host path, so it is taken under ``root`` too. The link itself is kept: writes go
    to the file it names (an operator's config managed elsewhere and linked stays linked)."""
    current = Path(path)
    for _ in range(40):  # the kernel's own limit on nested links
        if not current.is_symlink():
            return current
        target = os.readlink(current)
        current = on_host(root, target) if target.startswith("/") else current.parent / target
    raise HostFileError(f"too many levels of symbolic links at {path}")


def read(path: Path) -> str | None:
    """The file's text, or None when it does not exist.

    UTF-8 only, a leading byte order mark kept as U+FEFF (so a write gives it back); anything
    else (UTF-16, Latin-1, binary) raises :class:`NotUtf8` naming the file, before any edit.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise HostFileError(f"cannot read {path}: {e.strerror}") from e
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise NotUtf8(
            f"{path} is not UTF-8 text (byte {e.start}: {data[e.start : e.start + 4]!r}); "
            "containerd reads its TOML config as UTF-8: convert the file (e.g. iconv) and retry"
        ) from e


def write_atomic(path: Path, text: str, backup: bool = True) -> Path | None:
    """Replace ``path`` by ``text`` atomically: write beside, fsync, keep a backup, rename.

    A crash at any point leaves either the old or the new file whole. Returns the backup path.
    """
    saved: Path | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        old = path.stat() if path.exists() else None
        mode = old.st_mode & 0o7777 if old else 0o644
        owner = (old.st_uid, old.st_gid) if old else None
        if backup and path.exists():
            saved = path.with_name(f"{path.name}.lj-runtimekit.bak")
            _write_beside(saved, path.read_bytes(), mode, owner)
        _write_beside(path, text.encode(), mode, owner)
    except OSError as e:
        raise HostFileError(f"cannot write {path}: {e.strerror}") from e
    return saved


def _write_beside(path: Path, data: bytes, mode: int, owner: tuple[int, int] | None) -> None:
    # The replaced file's owner too: a config owned by an operator's group stays theirs.
    files.write_atomic(path, data, mode=mode, owner=owner)


def matching(root: str, pattern: str) -> list[str]:
    """Host paths matching ``pattern`` (a host path or glob), sorted as containerd's imports."""
    base = Path(root)
    found = (
        sorted(base.glob(pattern.lstrip("/"))) if glob_chars(pattern) else [on_host(root, pattern)]
    )
    return ["/" + str(p.relative_to(base)) for p in found if p.is_file()]


def glob_chars(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


def remove(path: Path) -> bool:
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    except OSError as e:
        raise HostFileError(f"cannot remove {path}: {e.strerror}") from e
    return True


async def _run(command: str, limit_s: float) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *shlex.split(command), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), limit_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return -1, f"timed out after {limit_s:g}s"
    except asyncio.CancelledError:
        proc.kill()  # stopped by a signal: leave no command of ours running behind
        raise
    return proc.returncode or 0, out.decode(errors="replace").strip()[-500:]


async def restart_containerd(restart: str, confirm: str, limit_s: float) -> None:
    """Run ``restart``, then ``confirm`` until it succeeds within ``limit_s`` seconds."""
    try:
        rc, out = await _run(restart, limit_s)
    except OSError as e:
        raise ContainerdNotBack(f"restart command {restart!r} cannot run: {e.strerror}") from e
    if rc != 0:
        raise ContainerdNotBack(f"restart command {restart!r} exited {rc}: {out}")
    if not confirm:
        return
    deadline = time.monotonic() + limit_s
    last = ""
    while time.monotonic() < deadline:
        try:
            rc, last = await _run(confirm, max(deadline - time.monotonic(), 0.1))
        except OSError as e:
            raise ContainerdNotBack(f"confirm command {confirm!r} cannot run: {e.strerror}") from e
        if rc == 0:
            return
        await asyncio.sleep(0.2)
    raise ContainerdNotBack(
        f"containerd not back {limit_s:g}s after restart: {confirm!r} last said: {last}; "
        "check `journalctl -u containerd` on the node"
    )
