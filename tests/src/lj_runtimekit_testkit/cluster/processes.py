"""One control plane binary as a child process: its own process group, its own log file, and a
stop that leaves nothing behind (SIGTERM to the group, SIGKILL after a grace period)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import structlog

log = structlog.get_logger(__name__)

#: util-linux's setpriv, which can set the parent-death signal of the binary it execs.
_SETPRIV = shutil.which("setpriv")


class ProcessExited(RuntimeError):
    """A control plane binary exited while it was expected to run."""


@dataclass
class BinaryProcess:
    """A running binary; ``log_path`` holds its stdout and stderr."""

    name: str
    argv: list[str]
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        # A session of its own: one killpg stops the binary and anything it forks, and a Ctrl-C
        # in the terminal does not hit it before our own cleanup runs.
        main = threading.current_thread() is threading.main_thread()
        argv, preexec = self.argv, None
        if main and sys.platform == "linux":
            # Killed when this process dies, even by SIGKILL. setpriv sets that in the child
            # (PR_SET_PDEATHSIG, kept across its exec) so that Popen needs no preexec_fn: with one,
            # it forks, and grpcio's fork handlers run in the child before the exec; they
            # aborted it now and then (kwok killed by SIGABRT at start, its log holding only
            # grpc's "epoll_wait error: Bad file descriptor"). Without, Popen uses vfork.
            if _SETPRIV is not None:
                argv = [_SETPRIV, "--pdeathsig", "KILL", "--", *self.argv]
            else:
                preexec = _die_with_parent
        self.popen = subprocess.Popen(
            argv,
            preexec_fn=preexec,  # noqa: PLW1509 - main thread only
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.debug("binary_started", binary=self.name, pid=self.popen.pid, log=str(self.log_path))

    @property
    def pid(self) -> int:
        return self.popen.pid if self.popen else -1

    def check_running(self) -> None:
        """Raise :class:`ProcessExited` (with the log tail) if the binary has exited."""
        if self.popen is None:
            raise ProcessExited(f"{self.name} was never started")
        code = self.popen.poll()
        if code is not None:
            raise ProcessExited(
                f"{self.name} exited with code {code}; last lines of {self.log_path}:\n"
                + self.tail()
            )

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def terminate(self) -> None:
        """Ask the process group to stop (SIGTERM) without waiting: lets a caller stopping many
        binaries give them one grace period together instead of one each."""
        if self.popen is not None and self.popen.poll() is None:
            _signal_group(self.popen.pid, signal.SIGTERM)

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop the process group; SIGKILL whatever is left after ``grace_s``."""
        popen = self.popen
        if popen is None:
            return
        if popen.poll() is None:
            _signal_group(popen.pid, signal.SIGTERM)
            try:
                popen.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                log.warning("binary_killed", binary=self.name, pid=popen.pid, grace_s=grace_s)
        # The leader may be gone while children it forked still hold the group.
        _signal_group(popen.pid, signal.SIGKILL)
        if popen.poll() is None:
            popen.wait(timeout=grace_s)
        if self._log is not None:
            self._log.close()
            self._log = None


def _die_with_parent() -> None:
    """In the child: SIGKILL it when the parent dies, even by SIGKILL (no cleanup ran).

    Only for children of the main thread: the kernel ties this to the spawning thread."""
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, left when no one reaps an orphan, does not count)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def group_alive(pgid: int) -> bool:
    """Whether any process is left in the process group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def wait_until(
    condition: str,
    probe: Callable[[], bool],
    deadline_s: float,
    *,
    watched: list[BinaryProcess],
    interval_s: float = 0.05,
) -> None:
    """Poll ``probe`` until it returns True; fail early when a watched binary exits."""
    deadline = time.monotonic() + deadline_s
    while True:
        for proc in watched:
            proc.check_running()
        if probe():
            return
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p.name} ({p.log_path}):\n{p.tail(20)}" for p in watched)
            raise TimeoutError(f"{condition} not reached within {deadline_s:.0f} s\n{tails}")
        time.sleep(interval_s)
        interval_s = min(interval_s * 1.5, 0.5)
