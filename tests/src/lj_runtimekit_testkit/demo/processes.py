"""The demo's local processes: the components and simulators, each with its own log file."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path


def console_script(name: str) -> str:
    """The path of a console script installed beside this interpreter."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if not found:
        raise FileNotFoundError(f"{name} is not installed: run `make setup`")
    return found


@dataclass
class Processes:
    """Started processes, stopped in reverse order (SIGTERM, then SIGKILL after a grace)."""

    logs_dir: Path
    running: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Path:
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        log = self.logs_dir / f"{name}.log"
        with log.open("ab") as out:
            proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                start_new_session=True,
            )
        self.running.append((name, proc))
        return log

    def exited(self) -> list[tuple[str, int]]:
        """The processes that stopped on their own, with their exit codes."""
        return [(n, p.returncode) for n, p in self.running if p.poll() is not None]

    def stop(self, grace_s: float = 10.0) -> None:
        for _, proc in reversed(self.running):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for _, proc in reversed(self.running):
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.running.clear()
