"""The profile builder: the enabled plugins from the registry, in config order, with their
weights, each made with its own typed arguments from the settings (kube-scheduler's
``frameworkruntime.NewFramework`` over a ``KubeSchedulerProfile``)."""

from __future__ import annotations

from .errors import ConfigError
from .framework import Profile
from .metrics import Metrics
from .plugins import (
    allocate_handshake,
    gpu_fit,
    node_resources_fit,
    pod_topology_spread,
    volume_binding,
)
from .plugins.registry import REGISTRY, PluginArgs
from .settings import PluginConfig, Settings
from .state import ClusterState


def plugin_args(settings: Settings) -> PluginArgs:
    """Each plugin's arguments, from the settings it depends on."""
    return PluginArgs(
        gpu_fit=gpu_fit.Args(settings.gpu_strategy, settings.feature_label),
        node_resources_fit=node_resources_fit.Args(settings.gpu_strategy == "binpack"),
        allocate_handshake=allocate_handshake.Args(settings.resources),
        pod_topology_spread=pod_topology_spread.Args(
            settings.spread_defaulting, settings.spread_default_constraints
        ),
        volume_binding=volume_binding.Args(settings.volume_bind_timeout),
    )


def check_names(plugins: tuple[PluginConfig, ...]) -> None:
    """Every configured plugin is one the registry knows (a ConfigError naming it)."""
    for p in plugins:
        if p.name not in REGISTRY:
            raise ConfigError(f"plugins: unknown plugin {p.name!r}; known: {sorted(REGISTRY)}")


def build_profile(settings: Settings, state: ClusterState, metrics: Metrics) -> Profile:
    """The profile of ``settings.plugins``; raises :class:`ConfigError` for an unknown name."""
    check_names(settings.plugins)
    args = plugin_args(settings)
    profile = Profile([(REGISTRY[p.name](args, state), p.weight) for p in settings.plugins])
    profile.observe = metrics.plugin
    return profile
