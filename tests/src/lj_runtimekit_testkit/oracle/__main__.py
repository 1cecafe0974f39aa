"""``python -m lj_runtimekit_testkit.oracle --seed S --cases N``: the differential harness on a
control plane of its own (``make oracle``), with our scheduler as a process beside
kube-scheduler. Prints the seed, the count, progress and every finding with the case that shows
it (``--only I,J`` runs just those cases of the seed again); exits 1 when anything was found.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from lj_runtimekit_testkit.cluster.crds import installed_crd
from lj_runtimekit_testkit.cluster.handle import Cluster
from lj_runtimekit_testkit.cluster.launcher import ControlPlane
from lj_runtimekit_testkit.oracle import generate, report
from lj_runtimekit_testkit.oracle.ours import OursProcess
from lj_runtimekit_testkit.oracle.runner import Harness

ROOT = Path(__file__).resolve().parents[4]
CRD = ROOT / "deploy" / "crds" / "nodedevices.lj-runtimekit.aliyun.com.yaml"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="lj-oracle", description=__doc__)
    p.add_argument("--seed", type=int, default=35, help="the seed of the cases (default 35)")
    p.add_argument("--cases", type=int, default=5000, help="how many cases (default 5000)")
    p.add_argument("--start", type=int, default=0, help="the first case's index (default 0)")
    p.add_argument("--only", default="", help="comma-separated case indices to run alone")
    p.add_argument(
        "--families",
        default=",".join(generate.COMPARED),
        help=f"comma-separated feature families (default: all compared ones; also 'gpu'); "
        f"known: {', '.join(generate.FAMILIES)}; pending: {', '.join(generate.PENDING)}",
    )
    p.add_argument("--width", type=int, default=16, help="cases per batch (default 16)")
    p.add_argument("--show", type=int, default=20, help="findings printed in full (default 20)")
    args = p.parse_args(argv)
    families = generate.enabled(f for f in args.families.split(",") if f)
    only = [int(i) for i in args.only.split(",") if i]
    print(
        f"oracle: seed {args.seed}, "
        f"{len(only) or args.cases} cases from {only or args.start}, families {','.join(families)}",
        flush=True,
    )
    work = Path(tempfile.mkdtemp(prefix="lj-oracle-"))
    cp = ControlPlane(work_dir=work)
    cp.start()
    ours: OursProcess | None = None
    try:
        cluster = Cluster.from_control_plane(cp)
        with installed_crd(cluster, CRD):
            ours = OursProcess(cluster.kubeconfig, work / "ours.log")
            ours.start()
            harness = Harness(cluster, width=args.width).open()
            try:
                harness.barrier()
                rep = report.run(
                    harness,
                    args.seed,
                    args.cases,
                    families,
                    start=args.start,
                    only=only,
                    progress=True,
                )
            finally:
                harness.close()
                ours.stop()
            print(rep.text(args.show))
            print(f"oracle: {harness.timings.line()}")
            return 1 if rep.findings else 0
    finally:
        if ours is not None:
            ours.stop()
        cp.stop()


if __name__ == "__main__":
    sys.exit(main())
