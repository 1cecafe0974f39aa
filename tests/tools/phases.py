#!/usr/bin/env python3
"""`make test`'s clock: runs its phases, side by side where one does not need another, and ends
with a table of what each took.

    setup ──┬── lint ───────────────┐
            ├── images ──┐          │
            └── isolated │          ├── (all must pass)
    binaries ────────────┴── tests ─┘

`binaries` (Go builds into ~/.cache) needs nothing from the repo's venv, so it starts at once;
`tests` waits for the binaries and images it runs. The tests phase streams its output (pytest's
own summary and its 20 slowest tests); every other phase writes build/logs/<phase>.log, and its
tail is printed when it fails. A failed phase stops the ones that need it and fails the run.

Standard library only: it runs before the venv exists.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TAIL_LINES = 60
# The Makefile's two chains of Go builds, side by side.
BINARY_JOBS = 2


@dataclass
class Phase:
    name: str
    argv: list[str]
    needs: tuple[str, ...] = ()
    stream: bool = False
    summary: str | None = None  # a regex: lines of the log printed when the phase ends
    started: float | None = None
    seconds: float | None = None
    status: str = "waiting"  # waiting | running | passed | failed | skipped
    done: threading.Event = field(default_factory=threading.Event)


def phases(make: Sequence[str], workers: str) -> list[Phase]:
    """The phases of `make test`, as make targets that do not re-run setup (SETUP=)."""
    m = [*make, "--no-print-directory", "SETUP="]
    return [
        Phase("setup", [*make, "--no-print-directory", "setup"]),
        Phase("binaries", [*m, "-j", str(BINARY_JOBS), "k8s-bin"]),
        Phase("lint", [*m, "lint"], needs=("setup",)),
        Phase("images", [*m, "images"], needs=("setup",)),
        Phase(
            "isolated",
            [*m, "isolation"],
            needs=("setup",),
            summary=r"^(== isolated: |=*\s*\d+ (passed|failed)\b)",
        ),
        Phase(
            "tests",
            [*m, "test-suite", f"TEST_WORKERS={workers}"],
            needs=("binaries", "images"),
            stream=True,
        ),
    ]


class Clock:
    def __init__(self, plan: list[Phase], logs: Path) -> None:
        self.plan = {p.name: p for p in plan}
        self.logs = logs
        self.t0 = time.monotonic()
        self.print_lock = threading.Lock()

    def say(self, text: str) -> None:
        with self.print_lock:
            print(f"[{time.monotonic() - self.t0:6.0f} s] {text}", flush=True)

    def run(self) -> bool:
        threads = [
            threading.Thread(target=self._one, args=(p,), name=p.name) for p in self.plan.values()
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return all(p.status == "passed" for p in self.plan.values())

    def _one(self, phase: Phase) -> None:
        try:
            for need in phase.needs:
                self.plan[need].done.wait()
            failed = [n for n in phase.needs if self.plan[n].status != "passed"]
            if failed:
                phase.status = "skipped"
                self.say(f"{phase.name}: skipped ({', '.join(failed)} failed)")
                return
            phase.status = "running"
            phase.started = time.monotonic()
            self.say(f"{phase.name}: started")
            ok = self._spawn(phase)
            phase.seconds = time.monotonic() - phase.started
            phase.status = "passed" if ok else "failed"
            self.say(f"{phase.name}: {phase.status} in {phase.seconds:.0f} s")
        finally:
            phase.done.set()

    def _spawn(self, phase: Phase) -> bool:
        if phase.stream:
            return (
                subprocess.run(
                    phase.argv, cwd=REPO, stdin=subprocess.DEVNULL, check=False
                ).returncode
                == 0
            )
        self.logs.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"{phase.name}.log"
        with log.open("wb") as out:
            rc = subprocess.run(
                phase.argv,
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                check=False,
            ).returncode
        if phase.summary and rc == 0:
            pattern = re.compile(phase.summary)
            lines = [
                ln for ln in log.read_text(errors="replace").splitlines() if pattern.search(ln)
            ]
            with self.print_lock:
                print("\n".join(f"  {phase.name}| {line}" for line in lines), flush=True)
        if rc != 0:
            tail = log.read_text(errors="replace").splitlines()[-TAIL_LINES:]
            self.say(f"{phase.name}: exited {rc}; the last {len(tail)} lines of {log}:")
            with self.print_lock:
                print("\n".join(f"  {phase.name}| {line}" for line in tail), flush=True)
        return rc == 0

    def table(self) -> str:
        rows = [("phase", "start s", "seconds", "result")]
        for p in self.plan.values():
            start = f"{p.started - self.t0:.0f}" if p.started is not None else "-"
            secs = f"{p.seconds:.0f}" if p.seconds is not None else "-"
            rows.append((p.name, start, secs, p.status))
        rows.append(("total (wall)", "0", f"{time.monotonic() - self.t0:.0f}", ""))
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        lines = [
            "  ".join(
                c.ljust(w) if i in (0, 3) else c.rjust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
            for r in rows
        ]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--make",
        default=os.environ.get("MAKE", "make"),
        help="the make to call (default: $MAKE or make)",
    )
    parser.add_argument(
        "--workers", default="3", help="pytest-xdist workers of the tests phase (default 3)"
    )
    parser.add_argument(
        "--logs", type=Path, default=REPO / "build" / "logs", help="where each phase's log goes"
    )
    args = parser.parse_args(argv)
    clock = Clock(phases([args.make], args.workers), args.logs)
    ok = clock.run()
    print(
        "\n== make test: phases (side by side where the start times overlap)\n" + clock.table(),
        flush=True,
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
