"""Running the host's networking and mount tools (``ip``, ``iptables``) with errors that say what
failed: the one place that shells out to them."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence


class RealNodeError(RuntimeError):
    """A real node could not be made or run here; the message names what failed and why."""


class RealNodeUnavailable(RealNodeError):
    """This machine cannot run real nodes at all (not Linux, not root, a tool missing)."""


def run(argv: Sequence[str], what: str, *, timeout: float = 30.0, check: bool = True) -> str:
    """Run ``argv``; return its stdout, or raise :class:`RealNodeError` naming ``what`` failed."""
    try:
        proc = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RealNodeError(f"{what}: `{' '.join(argv)}` could not run: {e}") from e
    if check and proc.returncode != 0:
        raise RealNodeError(
            f"{what}: `{' '.join(argv)}` exited {proc.returncode}: "
            f"{(proc.stderr or proc.stdout).strip()}"
        )
    return proc.stdout


def succeeds(argv: Sequence[str], *, timeout: float = 30.0) -> bool:
    """Whether ``argv`` runs and exits 0 (for probes where failure is an answer, not an error)."""
    try:
        proc = subprocess.run(list(argv), capture_output=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def free_char_major(first: int = 240, last: int = 254) -> int:
    """A character major (from the range Linux keeps for local use) that no driver registered,
    for fake device nodes that must not reach a real driver if opened."""
    used: set[int] = set()
    with open("/proc/devices") as f:
        block = False
        for line in f:
            if line.startswith("Block devices"):
                block = True
            parts = line.split()
            if not block and len(parts) == 2 and parts[0].isdigit():
                used.add(int(parts[0]))
    for major in range(first, last + 1):
        if major not in used:
            return major
    raise RealNodeError(f"no free character major in {first}..{last} for fake devices")


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (one of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
