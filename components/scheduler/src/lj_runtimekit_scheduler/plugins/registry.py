"""Plugin name → factory. The config enables and weights plugins by these names.

As kube-scheduler's registry: a factory gets the plugin's own typed arguments (its ``Args``, out
of :class:`PluginArgs`, which the profile builder fills from the settings) and the handle to the
cluster state; plugins never see the settings tree.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ..framework import Plugin
from ..state import ClusterState
from . import (
    allocate_handshake,
    default_binder,
    default_preemption,
    dra_claims,
    gpu_fit,
    gpu_topology,
    inter_pod_affinity,
    node_affinity,
    node_name,
    node_ports,
    node_ready,
    node_resources_fit,
    node_unschedulable,
    node_volume_limits,
    pod_topology_spread,
    scheduling_gates,
    taint_toleration,
    unsupported_features,
    volume_binding,
    volume_restrictions,
    volume_zone,
)


@dataclass(frozen=True)
class PluginArgs:
    """Each plugin's own arguments (kube-scheduler's ``pluginConfig`` of a profile)."""

    gpu_fit: gpu_fit.Args = field(default_factory=gpu_fit.Args)
    node_resources_fit: node_resources_fit.Args = field(default_factory=node_resources_fit.Args)
    allocate_handshake: allocate_handshake.Args = field(default_factory=allocate_handshake.Args)
    pod_topology_spread: pod_topology_spread.Args = field(default_factory=pod_topology_spread.Args)
    inter_pod_affinity: inter_pod_affinity.Args = field(default_factory=inter_pod_affinity.Args)
    volume_binding: volume_binding.Args = field(default_factory=volume_binding.Args)


Factory = Callable[[PluginArgs, ClusterState], Plugin]

REGISTRY: Mapping[str, Factory] = {
    scheduling_gates.NAME: lambda args, state: scheduling_gates.new(),
    unsupported_features.NAME: lambda args, state: unsupported_features.new(),
    node_name.NAME: lambda args, state: node_name.new(),
    node_unschedulable.NAME: lambda args, state: node_unschedulable.new(),
    node_ready.NAME: lambda args, state: node_ready.new(),
    node_affinity.NAME: lambda args, state: node_affinity.new(),
    taint_toleration.NAME: lambda args, state: taint_toleration.new(),
    node_ports.NAME: lambda args, state: node_ports.new(),
    node_resources_fit.NAME: lambda args, state: node_resources_fit.new(
        args.node_resources_fit, state
    ),
    volume_restrictions.NAME: lambda args, state: volume_restrictions.new(state),
    node_volume_limits.NAME: lambda args, state: node_volume_limits.new(state),
    volume_binding.NAME: lambda args, state: volume_binding.new(args.volume_binding, state),
    volume_zone.NAME: lambda args, state: volume_zone.new(state),
    gpu_fit.NAME: lambda args, state: gpu_fit.new(args.gpu_fit, state),
    allocate_handshake.NAME: lambda args, state: allocate_handshake.new(
        args.allocate_handshake, state
    ),
    dra_claims.NAME: lambda args, state: dra_claims.new(state),
    pod_topology_spread.NAME: lambda args, state: pod_topology_spread.new(
        args.pod_topology_spread, state
    ),
    inter_pod_affinity.NAME: lambda args, state: inter_pod_affinity.new(
        args.inter_pod_affinity, state
    ),
    gpu_topology.NAME: lambda args, state: gpu_topology.new(),
    default_preemption.NAME: lambda args, state: default_preemption.new(state),
    default_binder.NAME: lambda args, state: default_binder.new(),
}
