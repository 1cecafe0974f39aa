"""The host bridge real nodes hang off: ``ljrk<K>`` with ``10.213.<K>.1/24``, no gateway to the
outside, no masquerade, no iptables rule. Each control plane claims its own K (``ip link add``
either creates the bridge or fails, so two harnesses on one machine never share one); a bridge
whose owner process is gone (a run killed with SIGKILL) is reclaimed. Nodes get ``.10`` upwards.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import threading
from dataclasses import dataclass, field

import structlog

from lj_runtimekit_testkit.node.hostcmd import RealNodeError, pid_alive, run, succeeds

log = structlog.get_logger(__name__)

PREFIX = "ljrk"
SUBNET_BASE = "10.213.{k}.0/24"
_MAX_BRIDGES = 64
_ALIAS = "lj-runtimekit pid {pid}"


def _owner(name: str) -> int | None:
    """The pid recorded in the bridge's alias, or None when it has none (not ours)."""
    out = run(["ip", "-j", "link", "show", "dev", name], f"read bridge {name}", check=False)
    try:
        alias = str(json.loads(out)[0].get("ifalias", ""))
    except (ValueError, IndexError):
        return None
    prefix = _ALIAS.format(pid="")
    if not alias.startswith(prefix):
        return None
    with contextlib.suppress(ValueError):
        return int(alias[len(prefix) :])
    return None


def _subnet_used(subnet: ipaddress.IPv4Network) -> bool:
    out = run(["ip", "-j", "-4", "addr"], "list host addresses")
    for link in json.loads(out):
        for addr in link.get("addr_info", []):
            iface = ipaddress.ip_interface(f"{addr['local']}/{addr['prefixlen']}")
            if iface.network.overlaps(subnet):
                return True
    return False


@dataclass
class HostBridge:
    """A claimed bridge; :meth:`release` deletes it (and with it every veth still attached)."""

    name: str
    index: int
    subnet: ipaddress.IPv4Network
    _next_host: int = 10
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    released: bool = False

    @property
    def ip(self) -> str:
        return str(self.subnet.network_address + 1)

    @property
    def prefixlen(self) -> int:
        return self.subnet.prefixlen

    @classmethod
    def claim(cls) -> HostBridge:
        """Create the first free ``ljrk<K>`` bridge, up, with its address."""
        for k in range(_MAX_BRIDGES):
            name, subnet = f"{PREFIX}{k}", ipaddress.IPv4Network(SUBNET_BASE.format(k=k))
            if _link_exists(name):
                owner = _owner(name)
                if owner is None or pid_alive(owner):
                    continue
                log.warning("stale_bridge_removed", bridge=name, owner_pid=owner)
                run(["ip", "link", "del", name], f"delete stale bridge {name}", check=False)
            if _subnet_used(subnet):
                continue
            # Fails when another harness created it since the check above: try the next one.
            if not succeeds(["ip", "link", "add", name, "type", "bridge"]):
                continue
            bridge = cls(name, k, subnet)
            try:
                run(
                    ["ip", "link", "set", "dev", name, "alias", _ALIAS.format(pid=os.getpid())],
                    f"mark bridge {name} as ours",
                )
                run(
                    ["ip", "addr", "add", f"{bridge.ip}/{subnet.prefixlen}", "dev", name],
                    f"address bridge {name}",
                )
                run(["ip", "link", "set", "dev", name, "up"], f"bring bridge {name} up")
            except RealNodeError:
                run(["ip", "link", "del", name], f"delete bridge {name}", check=False)
                raise
            log.info("bridge_claimed", bridge=name, subnet=str(subnet))
            return bridge
        raise RealNodeError(f"no free bridge {PREFIX}0..{PREFIX}{_MAX_BRIDGES - 1} on this host")

    def allocate_ip(self) -> str:
        with self._lock:
            host = self._next_host
            self._next_host += 1
        if host >= 250:
            raise RealNodeError(f"bridge {self.name}: no node address left in {self.subnet}")
        return str(self.subnet.network_address + host)

    def release(self) -> None:
        """Delete the bridge if it is still ours; safe to call twice."""
        if self.released:
            return
        self.released = True
        if _link_exists(self.name) and _owner(self.name) == os.getpid():
            run(["ip", "link", "del", self.name], f"delete bridge {self.name}", check=False)
            log.info("bridge_released", bridge=self.name)


def _link_exists(name: str) -> bool:
    return os.path.exists(f"/sys/class/net/{name}")
