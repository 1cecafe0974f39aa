"""``lj-runtime-sim``: the runtime simulator as a process, with its fault control on control.sock.

    lj-runtime-sim --socket-dir /tmp/rt --inventory gpu-8x-nvlink [--node NAME] [--state-file F]

SIGTERM or SIGINT stops it and removes every socket it made; a second signal exits at once.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence

import structlog

from lj_runtimekit_testkit.simulator.control import CONTROL_SOCKET, ControlServer
from lj_runtimekit_testkit.simulator.inventory import InventoryError
from lj_runtimekit_testkit.simulator.services import DEFAULT_CAPABILITIES
from lj_runtimekit_testkit.simulator.simulator import Simulator

log = structlog.get_logger("lj_runtime_sim")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="lj-runtime-sim",
        description="Serve a simulated node-local accelerator Runtime (DeviceService, "
        "MonitorService, ConfigService) on unix sockets, with faults on demand through "
        f"HTTP on <socket-dir>/{CONTROL_SOCKET} (GET /state; POST /health, /fail, /restart, "
        "/stop, /start).",
    )
    parser.add_argument(
        "--socket-dir",
        required=True,
        help="directory for device-daemon.sock, monitor-daemon.sock, "
        "config-daemon.sock and control.sock (created if missing)",
    )
    parser.add_argument(
        "--inventory",
        required=True,
        help="inventory name in tests/inventories (gpu-8x-nvlink, ppu-8x, mig-tdm, "
        "gpu-1x; $LJ_RUNTIME_SIM_INVENTORY_DIR overrides the folder) or a YAML path",
    )
    parser.add_argument(
        "--node", default=None, help="node name the Runtime reports (default: the inventory's)"
    )
    parser.add_argument(
        "--state-file",
        default=None,
        help="JSON file keeping features and partitioning across restarts "
        "(default: none, state is lost on exit)",
    )
    parser.add_argument(
        "--capabilities",
        default=None,
        help="comma-separated capabilities to claim, to emulate an older Runtime; "
        "methods left out answer UNIMPLEMENTED (default: all: "
        f"{','.join(DEFAULT_CAPABILITIES)})",
    )
    parser.add_argument(
        "--log-format",
        choices=("console", "json"),
        default="console",
        help="log lines for a terminal (console, default) or for machines (json)",
    )
    return parser.parse_args(argv)


def _configure_logging(fmt: str) -> None:
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if fmt == "json" else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )


async def serve(args: argparse.Namespace) -> None:
    caps = (
        [c.strip() for c in args.capabilities.split(",") if c.strip()]
        if args.capabilities
        else None
    )
    sim = Simulator(
        args.socket_dir,
        args.inventory,
        node=args.node,
        state_file=args.state_file,
        capabilities=caps,
    )
    control = ControlServer(sim)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        if stop.is_set():
            os._exit(128 + signum)  # second signal: exit now
        log.info("runtime_sim_signal", signal=signal.Signals(signum).name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        await sim.start()
        await control.start()
        log.info("runtime_sim_ready", control=str(control.path), pid=os.getpid())
        await stop.wait()
    finally:
        await control.stop()
        await sim.stop()
        log.info("runtime_sim_exited", socket_dir=str(sim.socket_dir))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    _configure_logging(args.log_format)
    try:
        asyncio.run(serve(args))
    except InventoryError as e:
        print(f"lj-runtime-sim: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"lj-runtime-sim: cannot serve in {args.socket_dir}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
