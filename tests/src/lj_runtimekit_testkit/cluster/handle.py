"""What tests get from the ``cluster`` fixture: the kubeconfig, API clients, node factories."""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from pathlib import Path

from kubernetes import client, config

from lj_runtimekit_testkit.cluster.launcher import ControlPlane
from lj_runtimekit_testkit.cluster.nodes import NodeShape, create_nodes, wait_nodes_ready


@dataclass
class Cluster:
    """A running local control plane seen through its admin kubeconfig."""

    kubeconfig: str
    logs_dir: Path
    control_plane: ControlPlane | None = None
    _node_index: itertools.count[int] = field(default_factory=itertools.count, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _names: set[str] = field(default_factory=set, repr=False)

    @classmethod
    def from_control_plane(cls, control_plane: ControlPlane) -> Cluster:
        return cls(str(control_plane.kubeconfig), control_plane.logs_dir, control_plane)

    def api_client(self, pool_size: int = 32) -> client.ApiClient:
        """A fresh admin ``ApiClient`` (close it, or use it as a context manager)."""
        configuration = client.Configuration()
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=self.kubeconfig, client_configuration=configuration
        )
        configuration.connection_pool_maxsize = pool_size
        return client.ApiClient(configuration)

    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api_client())

    def create_gpu_nodes(
        self,
        n: int,
        prefix: str = "gpu-node",
        gpus: int = 8,
        labels: dict[str, str] | None = None,
        *,
        enable: bool = False,
        ppus: int = 0,
        gpu_memory_gib: int = 80,
        taint: bool = False,
        wait_ready: bool = True,
        deadline_s: float = 300.0,
    ) -> list[str]:
        """Create ``n`` KWOK nodes named ``<prefix>-<i>`` and return their names.

        Names are unique for the whole session (the index keeps counting), so tests may reuse a
        prefix. ``enable`` adds ``lj_runtimekit_enable=true``; rack/block labels follow the index.
        """
        with self._lock:
            indices = [next(self._node_index) for _ in range(n)]
        names = [f"{prefix}-{i}" for i in indices]
        shape = NodeShape(
            gpus=gpus,
            ppus=ppus,
            gpu_memory_gib=gpu_memory_gib,
            enable=enable,
            taint=taint,
            labels=dict(labels or {}),
        )
        with self.api_client() as api:
            create_nodes(api, names, shape, first_index=indices[0] if indices else 0)
            if wait_ready:
                wait_nodes_ready(api, names, deadline_s)
        with self._lock:
            self._names.update(names)
        return names

    @property
    def made_nodes(self) -> frozenset[str]:
        """The nodes :meth:`create_gpu_nodes` made that are not forgotten yet."""
        with self._lock:
            return frozenset(self._names)

    def forget_nodes(self, names: set[str]) -> None:
        with self._lock:
            self._names -= names

    def log_tails(self, lines: int = 15) -> str:
        return self.control_plane.log_tails(lines) if self.control_plane else ""
