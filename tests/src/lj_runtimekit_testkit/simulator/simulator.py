"""The runtime simulator: the Runtime's three sockets in one directory, with faults on demand."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from pathlib import Path

import grpc
import structlog

from lj_runtimekit_interface import sockets
from lj_runtimekit_interface.runtime.v1 import config_pb2_grpc as cgrpc
from lj_runtimekit_interface.runtime.v1 import device_pb2_grpc as dgrpc
from lj_runtimekit_interface.runtime.v1 import monitor_pb2_grpc as mgrpc
from lj_runtimekit_testkit.simulator.inventory import Binding, Device, Inventory
from lj_runtimekit_testkit.simulator.inventory_file import load_inventory
from lj_runtimekit_testkit.simulator.ledger import Allocation
from lj_runtimekit_testkit.simulator.node import NodeState
from lj_runtimekit_testkit.simulator.services import (
    DEFAULT_CAPABILITIES,
    ConfigService,
    DeviceService,
    Faults,
    MonitorService,
    full_method,
)

log = structlog.get_logger("lj_runtime_sim")
SOCKETS = {
    "DeviceService": sockets.DEVICE_SOCKET,
    "MonitorService": sockets.MONITOR_SOCKET,
    "ConfigService": sockets.CONFIG_SOCKET,
}
STOP_GRACE_S = 0.5
MAX_SOCKET_PATH = 107


class Simulator:
    """A faithful node-local Runtime over unix sockets in ``socket_dir``.

    State (allocations, health, partitioning, features) survives ``restart()`` as the real
    Runtime's does; watch streams end with UNAVAILABLE and the sockets are removed while stopped.
    """

    def __init__(
        self,
        socket_dir: str | Path,
        inventory: str | Path | Inventory = "gpu-8x-nvlink",
        *,
        node: str | None = None,
        state_file: str | Path | None = None,
        capabilities: Iterable[str] | None = None,
    ) -> None:
        self.socket_dir = Path(socket_dir)
        inv = inventory if isinstance(inventory, Inventory) else load_inventory(inventory)
        self.node = NodeState(inv, node, Path(state_file) if state_file else None)
        caps = tuple(capabilities) if capabilities is not None else DEFAULT_CAPABILITIES
        self.faults = Faults(capabilities=caps)
        self._servers: dict[str, grpc.aio.Server] = {}
        self._monitor = MonitorService(self.node, self.faults)

    # ---------------------------------------------------------------- addresses
    def socket_path(self, service: str = "DeviceService") -> Path:
        """Path of one service's socket: DeviceService, MonitorService or ConfigService."""
        return self.socket_dir / SOCKETS[service]

    def target(self, service: str = "DeviceService") -> str:
        return sockets.unix_target(str(self.socket_path(service)))

    @property
    def running(self) -> bool:
        return bool(self._servers)

    # ---------------------------------------------------------------- lifecycle
    async def start(self, services: Iterable[str] | None = None) -> None:
        """Serve the named services (all by default); a running one is left as it is."""
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        for service in services or SOCKETS:
            if service in self._servers:
                continue
            path = self.socket_path(service)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # a stale socket from a killed run
            server = grpc.aio.server()
            if service == "DeviceService":
                dgrpc.add_DeviceServiceServicer_to_server(
                    DeviceService(self.node, self.faults), server
                )
            elif service == "MonitorService":
                mgrpc.add_MonitorServiceServicer_to_server(self._monitor, server)
            else:
                cgrpc.add_ConfigServiceServicer_to_server(
                    ConfigService(self.node, self.faults), server
                )
            if len(str(path).encode()) > MAX_SOCKET_PATH:
                raise OSError(
                    f"socket path {path} is longer than {MAX_SOCKET_PATH} bytes, the "
                    "unix socket limit: choose a shorter socket directory"
                )
            try:
                server.add_insecure_port(sockets.unix_target(str(path)))
            except RuntimeError as e:
                raise OSError(f"cannot bind {path}: is the directory writable?") from e
            await server.start()
            self._servers[service] = server
        log.info(
            "runtime_sim_started",
            node=self.node.node,
            socket_dir=str(self.socket_dir),
            services=sorted(self._servers),
            inventory=self.node.inventory.source,
        )

    async def stop(self, services: Iterable[str] | None = None) -> None:
        """Stop the named services (all by default) and remove their sockets."""
        names = [s for s in (services or list(self._servers)) if s in self._servers]
        if "DeviceService" in names:
            self.node.end_watches()
        for service in names:
            await self._servers.pop(service).stop(STOP_GRACE_S)
            with contextlib.suppress(FileNotFoundError):
                self.socket_path(service).unlink()
        if names:
            log.info("runtime_sim_stopped", node=self.node.node, services=names)

    async def restart(self, services: Iterable[str] | None = None) -> None:
        """Stop and start again, as a Runtime restart does: sockets vanish, then reappear."""
        names = list(services) if services is not None else list(SOCKETS)
        await self.stop(names)
        await self.start(names)

    async def __aenter__(self) -> Simulator:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ---------------------------------------------------------------- faults and state
    def set_health(self, device_id: str, healthy: bool, reason: str = "") -> None:
        """Mark a device or partition (un)healthy; watchers see HEALTH_CHANGED at once."""
        self.node.set_health(device_id, healthy, reason)

    def fail(self, method: str, code: grpc.StatusCode | None, delay_s: float = 0.0) -> None:
        """Make ``method`` (``Allocate`` or ``DeviceService.Allocate``) slow and/or fail.

        ``code=None, delay_s=0`` clears the fault; ``code=None, delay_s>0`` only slows it.
        """
        name = full_method(method)
        if code is None and not delay_s:
            self.faults.failures.pop(name, None)
        else:
            self.faults.failures[name] = (code, delay_s)
        log.info(
            "runtime_sim_fault", method=name, code=code.name if code else None, delay_s=delay_s
        )

    def clear_faults(self) -> None:
        self.faults.failures.clear()

    def set_capabilities(self, capabilities: Iterable[str]) -> None:
        """Emulate another Runtime version: methods not listed answer UNIMPLEMENTED."""
        self.faults.capabilities = tuple(capabilities)

    def calls(self, method: str) -> int:
        """How many times ``method`` was called (faulted calls included)."""
        return self.faults.calls.get(full_method(method), 0)

    def allocations(self) -> list[Allocation]:
        return list(self.node.ledger.allocations.values())

    def devices(self) -> list[Device]:
        return list(self.node.devices.values())

    def set_binding(self, device_id: str, binding: Binding) -> Device:
        """Bind a device as SetDeviceBinding does (RuntimeRefusal when it may not be)."""
        return self.node.set_binding(device_id, binding)[0]

    def add_device(self, device: Device) -> None:
        self.node.add_device(device)

    def remove_device(self, device_id: str) -> None:
        self.node.remove_device(device_id)
