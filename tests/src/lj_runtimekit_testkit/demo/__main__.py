"""``make demo [ARGS=--once|--keep]``: the whole suite end to end on the local control plane.

Starts the control plane with KWOK nodes and three emulated accelerator nodes (8 GPUs in NVLink
islands, 8 PPUs, MIG/TDM), runs the five components as local processes, switches the nodes on
with the feature label, submits sample workloads and shows what happens. Exits 0 only when every
workload ran on the expected kind of node, the simulators hold the allocations and the exporters
expose series with pod labels.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import structlog

from lj_runtimekit_testkit.demo.scenario import Outcome, Scenario
from lj_runtimekit_testkit.demo.stack import Stack


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="make demo", description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--once", action="store_true", help="exit after the summary")
    mode.add_argument(
        "--keep", action="store_true", help="leave the cluster running in the background"
    )
    p.add_argument(
        "--kwok-nodes", type=int, default=200, help="KWOK nodes beside the emulated ones"
    )
    p.add_argument("--timeout", type=float, default=240, help="seconds to wait for the workloads")
    p.add_argument("--work-dir", type=Path, default=None, help="default: a fresh temp dir")
    p.add_argument(
        "--hold", action="store_true", help=argparse.SUPPRESS
    )  # --keep's background half
    return p.parse_args(argv)


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def progress(scenario: Scenario, outcomes: list[Outcome]) -> str:
    placed = sum(1 for o in outcomes if o.node)
    running = sum(1 for o in outcomes if o.phase == "Running")
    res = scenario.resources()
    gpus = sum(int(r.get("aliyun.com/gpu", "0")) for r in res.values())
    ppus = sum(int(r.get("alibabacloud.com/ppu", "0")) for r in res.values())
    return (
        f"resources: {gpus} GPUs, {ppus} PPUs registered | agents run: {len(scenario.agent_runs)}"
        f" | workloads: {placed}/{len(outcomes)} placed, {running} running"
    )


def chosen(assignment: str) -> str:
    """The devices of the scheduler's decision, e.g. ``gpu-0,gpu-1`` or ``gpu-3 (30% 10GiB)``."""
    try:
        decision = json.loads(assignment)
        parts = []
        for c in decision["containers"]:
            for d in c["devices"]:
                share = (
                    "" if d.get("whole") else f" ({d.get('core', 0)}% {d.get('memoryGiB', 0)}GiB)"
                )
                parts.append(f"{d['id']}{share}")
        return ", ".join(parts)
    except (ValueError, KeyError, TypeError):
        return f"unreadable assignment: {assignment[:60]}"


def summary(scenario: Scenario, outcomes: list[Outcome]) -> bool:
    allocations = scenario.allocations()
    unanswered = scenario.unanswered(outcomes)
    metrics = scenario.metrics_with_pods()
    print()
    print(f"{'workload':<16} {'node':<16} {'phase':<9} {'ok':<3} GPUs chosen / reason")
    for o in outcomes:
        detail = chosen(o.assignment) if o.assignment else o.message
        mark = "yes" if o.placed_as_expected and o.phase == "Running" else "NO"
        print(f"{o.workload.name:<16} {o.node or '-':<16} {o.phase:<9} {mark:<3} {detail[:90]}")
    print()
    print(f"{'node':<16} {'resources':<60} {'allocs':<7} {'pod series'}")
    for node, res in scenario.resources().items():
        shown = ", ".join(f"{k.split('/')[-1]}={v}" for k, v in sorted(res.items()))
        print(f"{node:<16} {shown:<60} {allocations.get(node, 0):<7} {metrics.get(node, -1)}")
    print()
    for name, run in sorted(scenario.agent_runs.items()):
        result = run.get("result", {})
        print(
            f"job agent {name}: exit {run['exit']}, lj-runtime handler in containerd config: "
            f"{run['handler']}, {result.get('message', '')}"
        )
    print(
        "Allocate answered for every accelerator resource of every workload"
        if not unanswered
        else f"Allocate NOT answered: {', '.join(unanswered)}"
    )
    ok = (
        all(o.placed_as_expected and o.phase == "Running" for o in outcomes)
        and not unanswered
        and sum(allocations.values()) > 0
        and any(v > 0 for v in metrics.values())
        and len(scenario.agent_runs) == len(scenario.stack.nodes)
        and all(r["exit"] == 0 and r["handler"] for r in scenario.agent_runs.values())
    )
    print()
    print("DEMO OK: every workload placed and running as expected" if ok else "DEMO FAILED")
    return ok


async def registered(scenario: Scenario, deadline: float, stop: asyncio.Event) -> None:
    """Until every accelerator node has registered its devices: a whole-GPU job submitted
    earlier lands on whichever node registered first, not the one it is meant for."""
    while time.monotonic() < deadline and not stop.is_set():
        res = await asyncio.to_thread(scenario.resources)
        if all(any(int(v) > 0 for v in r.values()) for r in res.values()):
            return
        await asyncio.sleep(1)


async def run(args: argparse.Namespace) -> int:
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="lj-demo-"))
    (work / "logs").mkdir(parents=True, exist_ok=True)
    # The in-process parts (control plane launcher, kubelet emulators) log to a file, so the
    # terminal shows only the demo's own progress.
    harness_log = (work / "logs" / "harness.log").open("a")
    structlog.configure(logger_factory=structlog.WriteLoggerFactory(file=harness_log))
    stack = Stack(work, args.kwok_nodes)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    ok = False
    try:
        say(f"starting the local control plane and {args.kwok_nodes} KWOK nodes (work dir {work})")
        await asyncio.to_thread(stack.start_cluster)
        say(f"control plane up: export KUBECONFIG={stack.cluster.kubeconfig}")
        say("starting 3 accelerator nodes: runtime simulator + kubelet emulator each")
        await stack.start_accelerator_nodes()
        stack.start_node_agents()
        stack.start_cluster_services()
        say(f"components running; their logs are in {stack.processes.logs_dir}")
        scenario = Scenario(stack)
        agents = asyncio.create_task(scenario.run_job_agents(stop), name="job-agents")
        say("labelling the accelerator nodes lj_runtimekit_enable=true")
        scenario.label_nodes()
        await registered(scenario, time.monotonic() + args.timeout, stop)
        scenario.submit()
        say("submitted: 4 whole GPUs, 2 shared GPU slices, 2 PPUs, a gang of 3")
        deadline = time.monotonic() + args.timeout
        outcomes = scenario.outcomes()
        while time.monotonic() < deadline and not stop.is_set():
            outcomes = await asyncio.to_thread(scenario.outcomes)
            say(await asyncio.to_thread(progress, scenario, outcomes))
            agents_done = len(scenario.agent_runs) >= len(stack.nodes)
            if all(o.phase == "Running" for o in outcomes) and agents_done:
                break
            for name, code in stack.processes.exited():
                say(f"{name} exited with {code}: see {stack.processes.logs_dir}/{name}.log")
            await asyncio.sleep(2)
        await asyncio.sleep(2)  # one exporter poll after the last allocation
        ok = await asyncio.to_thread(summary, scenario, await asyncio.to_thread(scenario.outcomes))
        if args.hold:
            say(f"KUBECONFIG={stack.cluster.kubeconfig} (stop it with: kill {os.getpid()})")
            await stop.wait()
        elif not args.once:
            say("the cluster stays up until Ctrl-C")
            await stop.wait()
        stop.set()
        await agents
    finally:
        await stack.stop()
    return 0 if ok else 1


def keep(args: argparse.Namespace) -> int:
    """Run the demo in the background and follow its output until the summary is printed."""
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="lj-demo-"))
    log = work / "demo.log"
    argv = [sys.executable, "-m", "lj_runtimekit_testkit.demo", "--hold", f"--work-dir={work}"]
    argv += [f"--kwok-nodes={args.kwok_nodes}", f"--timeout={args.timeout}"]
    with log.open("wb") as out:
        child = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    with log.open() as follow:
        while True:
            line = follow.readline()
            if not line:
                if child.poll() is not None:
                    return child.returncode or 1
                time.sleep(0.2)
                continue
            print(line, end="", flush=True)
            if "KUBECONFIG=" in line and "kill" in line:
                return 0
            if line.startswith("DEMO FAILED"):
                return 1


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.keep:
        return keep(args)
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
