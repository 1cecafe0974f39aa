"""Plugin name → factory. The config enables and weights plugins by these names."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..state import ClusterState
from . import (
    allocate_handshake,
    default_binder,
    gpu_fit,
    gpu_topology,
    node_affinity,
    node_name,
    node_ports,
    node_ready,
    node_resources_fit,
    node_unschedulable,
    scheduling_gates,
    taint_toleration,
    unsupported_features,
)

Factory = Callable[[Any, ClusterState], object]

REGISTRY: dict[str, Factory] = {
    m.NAME: m.new
    for m in (
        scheduling_gates,
        unsupported_features,
        node_name,
        node_unschedulable,
        node_ready,
        node_affinity,
        taint_toleration,
        node_ports,
        node_resources_fit,
        gpu_fit,
        allocate_handshake,
        gpu_topology,
        default_binder,
    )
}
