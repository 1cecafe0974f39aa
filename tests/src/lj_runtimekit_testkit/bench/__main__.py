"""``python -m lj_runtimekit_testkit.bench run --out build/bench [--only c1,c2]``.

Runs ``components/<c>/bench/run.py --out <dir>`` for each component that has one, then prints
the table of every figure written. ``... bench table FILE...`` prints the table of files written
before.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from . import table

ROOT = Path(__file__).resolve().parents[4]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="lj-bench")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the benchmarks")
    run.add_argument("--out", type=Path, default=ROOT / "build" / "bench")
    run.add_argument("--only", default="", help="comma-separated components (default: all)")
    shown = sub.add_parser("table", help="the table of figures already written")
    shown.add_argument("files", type=Path, nargs="+", help="<component>.json files")
    args = p.parse_args(argv)
    if args.command == "table":
        print(table(args.files))
        return 0
    only = {c for c in args.only.split(",") if c}
    scripts = sorted((ROOT / "components").glob("*/bench/run.py"))
    failed = []
    written = []
    for script in scripts:
        component = script.parent.parent.name
        if only and component not in only:
            continue
        print(f"== bench {component}", flush=True)
        rc = subprocess.call([sys.executable, str(script), "--out", str(args.out)], cwd=ROOT)
        if rc != 0:
            failed.append(component)
        elif (args.out / f"{component}.json").exists():
            written.append(args.out / f"{component}.json")
    if written:
        print(table(written))
    if failed:
        print(f"benchmarks failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
