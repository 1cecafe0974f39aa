"""The per-node cgroup root (``/ljrk-<owner pid>-<node>``) in every cgroup hierarchy of the host:
made before the kubelet starts (it refuses a cgroupRoot that does not exist) and removed after
the node stops, so the host's cgroup tree is as it was. Roots left by a killed run (owner pid
gone) are swept on the next start."""

from __future__ import annotations

import contextlib
import os
import re
import time
from pathlib import Path

from lj_runtimekit_testkit.node.hostcmd import RealNodeError, pid_alive

PREFIX = "ljrk-"
_STALE = re.compile(rf"^{PREFIX}(\d+)-")


def hierarchies() -> list[Path]:
    """Mount points of every cgroup (v1) and cgroup2 hierarchy."""
    mounts: list[Path] = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[2] in ("cgroup", "cgroup2"):
            mounts.append(Path(parts[1]))
    return mounts


def _v1(mount: Path) -> bool:
    return not (mount / "cgroup.controllers").exists()


def create_root(name: str) -> None:
    """Make ``/<name>`` in every v1 hierarchy (the kubelet uses cgroupfs on v1 here)."""
    for mount in hierarchies():
        if not _v1(mount):
            continue
        path = mount / name
        try:
            path.mkdir(exist_ok=True)
            for knob in ("cpuset.cpus", "cpuset.mems"):  # a new cpuset starts empty on v1
                if (path / knob).exists() and not (path / knob).read_text().strip():
                    (path / knob).write_text((mount / knob).read_text())
        except OSError as e:
            raise RealNodeError(f"cannot create cgroup {path}: {e}") from e


def remove_root(name: str, deadline_s: float = 20.0) -> list[str]:
    """Remove ``/<name>`` and everything under it from every hierarchy; the paths left over (with
    processes still in them after ``deadline_s``) are returned."""
    left: list[str] = []
    for mount in hierarchies():
        root = mount / name
        if root.is_dir():
            left += _rmtree(root, deadline_s)
    return left


def _rmtree(root: Path, deadline_s: float) -> list[str]:
    dirs = sorted((Path(d) for d, _, _ in os.walk(root)), key=lambda p: len(p.parts), reverse=True)
    deadline = time.monotonic() + deadline_s
    left: list[str] = []
    for d in dirs:
        while True:
            try:
                d.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    left.append(str(d))
                    break
                time.sleep(0.05)  # processes of a killed pod leave the cgroup a moment later
    return left


def sweep_stale() -> None:
    """Remove node cgroup roots whose owner process is gone (a run killed with SIGKILL)."""
    for mount in hierarchies():
        with contextlib.suppress(OSError):
            for entry in mount.iterdir():
                match = _STALE.match(entry.name)
                if match and entry.is_dir() and not pid_alive(int(match.group(1))):
                    _rmtree(entry, 2.0)
