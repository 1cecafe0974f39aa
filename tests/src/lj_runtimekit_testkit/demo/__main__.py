"""``make demo [ARGS=--once|--keep]``: the whole suite end to end on a cluster with real nodes.

Starts the control plane with KWOK nodes for scale and three real accelerator nodes (kubelet,
containerd and runc; 8 GPUs in NVLink islands, 8 PPUs, MIG/TDM — each node's Runtime is the
runtime simulator), loads the images ``make images`` built onto the nodes, labels them
``lj_runtimekit_enable=true`` and runs ``deploy/deploy-all.sh deploy`` — the controller's Jobs then
run the job agent on each node. It submits whole-GPU, shared-GPU, PPU and gang workloads, shows
what an operator would check, deletes and resubmits them (every device must come back), and exits
0 only when every workload ran where expected with its injection, allocation and metrics.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import structlog

from lj_runtimekit_testkit.demo.scenario import Outcome, Scenario
from lj_runtimekit_testkit.demo.stack import ACCELERATOR_NODES, Stack
from lj_runtimekit_testkit.node import host_support


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="make demo", description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--once", action="store_true", help="exit after the summary")
    mode.add_argument(
        "--keep", action="store_true", help="leave the cluster running in the background"
    )
    p.add_argument("--kwok-nodes", type=int, default=200, help="KWOK nodes beside the real ones")
    p.add_argument("--timeout", type=float, default=300, help="seconds to wait for each phase")
    p.add_argument("--work-dir", type=Path, default=None, help="default: a fresh temp dir")
    p.add_argument(
        "--hold", action="store_true", help=argparse.SUPPRESS
    )  # --keep's background half
    return p.parse_args(argv)


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


class Stopped(Exception):
    """Ctrl-C or SIGTERM while waiting."""


def until(
    what: str,
    done: Callable[[], bool],
    deadline_s: float,
    stop: threading.Event,
    show: Callable[[], str] | None = None,
) -> bool:
    """Poll ``done`` every 2 s, printing ``show()`` when it changes; False at the deadline."""
    deadline = time.monotonic() + deadline_s
    last = ""
    while not stop.is_set():
        if done():
            return True
        if show is not None and (line := show()) != last:
            say(line)
            last = line
        if time.monotonic() > deadline:
            say(f"{what}: not within {deadline_s:.0f} s")
            return False
        stop.wait(2)
    raise Stopped


def progress(scenario: Scenario, outcomes: list[Outcome]) -> str:
    placed = sum(1 for o in outcomes if o.node)
    running = sum(1 for o in outcomes if o.phase == "Running")
    injected = sum(1 for o in outcomes if o.injected)
    return (
        f"workloads: {placed}/{len(outcomes)} placed, {running} running, "
        f"{injected} with the Runtime's injection at xpu-container-runtime | "
        f"allocations: {scenario.allocation_counts()}"
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


def table(outcomes: list[Outcome]) -> bool:
    print()
    print(
        f"{'workload':<16} {'node':<16} {'phase':<9} {'inj':<4} {'alloc':<6} {'decided':<11}"
        f"{'series':<7} "
        "ok  GPUs chosen / reason"
    )
    for o in outcomes:
        detail = chosen(o.assignment) if o.assignment else o.message
        print(
            f"{o.workload.name:<16} {o.node or '-':<16} {o.phase:<9} "
            f"{'yes' if o.injected else 'no':<4} {'yes' if o.allocated else 'no':<6} "
            f"{'yes' if o.decided else 'NO':<11}{o.series:<7} {'yes' if o.ok else 'NO':<3} "
            f"{detail[:70]}"
        )
    return all(o.ok for o in outcomes)


def summary(scenario: Scenario, rounds: list[bool]) -> bool:
    print()
    print(f"{'node':<16} {'resources':<62} {'allocs':<7} agent / lj-runtime handler loaded")
    agents = scenario.agents()
    counts = scenario.allocation_counts()
    for node in scenario.stack.nodes:
        res = scenario.resources()[node.name]
        shown = ", ".join(f"{k.split('/')[-1]}={v}" for k, v in sorted(res.items()))
        agent = agents.get(node.name, {})
        print(
            f"{node.name:<16} {shown:<62} {counts[node.name]:<7} "
            f"{agent.get('action', '-')} {agent.get('result', '-')} / "
            f"{scenario.handler_loaded(node)}"
        )
    leftovers = scenario.leftover_allocations()
    print()
    print(
        "the Runtime holds only the live pods' allocations"
        if not any(leftovers.values())
        else f"LEAKED allocations: {leftovers}"
    )
    ok = all(rounds) and len(rounds) == 2 and not any(leftovers.values())
    print()
    print(
        "DEMO OK: every workload placed, injected, allocated and measured, twice"
        if ok
        else "DEMO FAILED"
    )
    return ok


def run_round(scenario: Scenario, args: argparse.Namespace, stop: threading.Event) -> bool:
    scenario.submit()
    say(
        "submitted: 4 whole GPUs, 2 shared GPU slices, 2 PPUs, a gang of 3 (runtimeClassName "
        "lj-runtime)"
    )
    outcomes: list[Outcome] = []

    def done() -> bool:
        nonlocal outcomes
        outcomes = scenario.outcomes()
        return all(o.ok for o in outcomes)

    until("workloads running", done, args.timeout, stop, lambda: progress(scenario, outcomes))
    return table(scenario.outcomes())


def run(args: argparse.Namespace, stop: threading.Event) -> int:
    reason = host_support()
    if reason:
        say(f"this machine cannot run the demo's real nodes: {reason}")
        return 2
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="lj-demo-"))
    (work / "logs").mkdir(parents=True, exist_ok=True)
    harness_log = (work / "logs" / "harness.log").open("a")
    structlog.configure(logger_factory=structlog.WriteLoggerFactory(file=harness_log))
    stack = Stack(work, args.kwok_nodes)
    ok = False
    try:
        say(f"starting the local control plane and {args.kwok_nodes} KWOK nodes (work dir {work})")
        stack.start_cluster()
        say(f"control plane up: export KUBECONFIG={stack.control_plane.kubeconfig}")
        for name, inventory in ACCELERATOR_NODES.items():
            node = stack.start_accelerator_node(name)
            say(
                f"real node {name} Ready in {node.start_s:.1f} s ({node.ip}, "
                f"Runtime: {inventory}); images loaded"
            )
        scenario = Scenario(stack)
        say("labelling the accelerator nodes lj_runtimekit_enable=true (guide §3.2 step 4)")
        scenario.label_nodes()
        say(f"deploy/deploy-all.sh deploy (guide §3.3); its log is in {stack.operator.log_dir}")
        for line in scenario.deploy().splitlines():
            if "ready" in line or "Running" in line or "ERROR" in line:
                print("    " + line, flush=True)
        until(
            "the controller's agent Jobs enable every node",
            scenario.agents_done,
            args.timeout,
            stop,
            lambda: f"agents: {scenario.agents()}",
        )
        until(
            "every node registers its devices",
            scenario.registered,
            args.timeout,
            stop,
            lambda: f"resources: {scenario.resources()}",
        )
        rounds = [run_round(scenario, args, stop)]
        say("deleting every workload: their devices must all come back")
        scenario.delete_workloads()
        until(
            "the Runtime releases the deleted pods' allocations",
            lambda: not any(scenario.allocation_counts().values()),
            args.timeout,
            stop,
            lambda: f"allocations left: {scenario.allocation_counts()}",
        )
        say("resubmitting the same workloads")
        rounds.append(run_round(scenario, args, stop))
        ok = summary(scenario, rounds)
        say(
            f"component logs: KUBECONFIG={stack.control_plane.kubeconfig} kubectl -n kube-system "
            "logs -l app=lj-runtimekit-<component>; node logs under "
            f"{stack.control_plane.work_dir / 'nodes'}"
        )
        if args.hold:
            say(f"KUBECONFIG={stack.control_plane.kubeconfig} (stop it with: kill {os.getpid()})")
            stop.wait()
        elif not args.once:
            say("the cluster stays up until Ctrl-C")
            stop.wait()
    except Stopped:
        say("interrupted")
    finally:
        say("stopping the nodes and the control plane")
        stack.stop()
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
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: stop.set())
    return run(args, stop)


if __name__ == "__main__":
    sys.exit(main())
