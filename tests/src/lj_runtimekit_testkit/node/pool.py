"""Several real nodes on one control plane: unique names, addresses and pod subnets."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from lj_runtimekit_testkit.node.layout import FakeDevice
from lj_runtimekit_testkit.node.node import RealNode

if TYPE_CHECKING:
    from lj_runtimekit_testkit.cluster.launcher import ControlPlane


@dataclass
class RealNodes:
    """Makes real nodes on ``control_plane`` (started with ``node_network=True``)."""

    control_plane: ControlPlane
    prefix: str = "real-node"
    nodes: list[RealNode] = field(default_factory=list)
    _index: itertools.count[int] = field(default_factory=itertools.count, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(
        self,
        name: str | None = None,
        *,
        inventory: str | None = None,
        private_dev: bool = False,
        devices: list[FakeDevice] | None = None,
        labels: dict[str, str] | None = None,
        ready_deadline_s: float = 120.0,
        read_only_port: int = 10255,
        seed_images: Sequence[Path] = (),
    ) -> RealNode:
        """Start one node and return it once Ready (names ``<prefix>-<i>`` by default)."""
        with self._lock:
            index = next(self._index)
        node_name = name or f"{self.prefix}-{index}"
        node = RealNode(
            name=node_name,
            control_plane=self.control_plane,
            index=index,
            root=self.control_plane.work_dir / "nodes" / node_name,
            inventory=inventory,
            private_dev=private_dev,
            devices=list(devices or []),
            labels=dict(labels or {}),
            ready_deadline_s=ready_deadline_s,
            read_only_port=read_only_port,
            seed_images=tuple(seed_images),
        )
        with self._lock:
            self.nodes.append(node)
        node.start()
        return node

    def stop(self) -> None:
        """Stop every node, the latest first."""
        for node in reversed(self.nodes):
            node.stop()
