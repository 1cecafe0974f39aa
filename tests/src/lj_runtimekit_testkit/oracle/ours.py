"""Our scheduler as a process of its own against the cluster (its own core time, no GIL shared
with the harness), stopped with SIGTERM and waited for.

The command is a parameter: by default ``python -m lj_runtimekit_scheduler``; the negative
control gives a script that breaks one rule on purpose before it starts the same ``main``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_NAME = "lj-runtimekit-scheduler"
DEFAULT_COMMAND = (sys.executable, "-m", "lj_runtimekit_scheduler")


@dataclass
class OursProcess:
    kubeconfig: str
    log_path: Path
    scheduler_name: str = DEFAULT_NAME
    command: Sequence[str] = DEFAULT_COMMAND
    extra: Sequence[str] = ()
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def start(self) -> None:
        argv = [
            *self.command,
            "--kubeconfig",
            self.kubeconfig,
            "--leader-elect=false",
            "--scheduler-name",
            self.scheduler_name,
            "--metrics-bind-address",
            "127.0.0.1:0",
            "--log-level",
            "warning",
            "--log-format",
            "text",
            *self.extra,
        ]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
