"""The three ways a node serves its devices, chosen once at start (docs/dra.md).

The node's mode label (``--mode``, from ``lj_runtimekit_device_mode``) and the DRA checkpoint of
this boot decide, in :data:`TABLE`; a node that never ran in mode dra this boot has no checkpoint
and runs the device plugin alone. Each mode implements :class:`.mode.Mode`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from kubernetes_asyncio.config import ConfigException

from ..dra.plugin import DraHost
from ..node import Parts
from . import migration
from .device_plugin import DevicePluginMode
from .dra import DraMode
from .hand_back import HandBack
from .mode import Mode

Build = Callable[[Parts, DraHost, asyncio.Event], Mode]

#: (node mode label, the checkpoint still holds claims) → the mode that runs.
TABLE: Mapping[tuple[str, bool], Build] = {
    # claims in the checkpoint (a restart) stay prepared: a repeated prepare allocates nothing
    ("dra", False): lambda parts, host, _: DraMode(parts, host),
    ("dra", True): lambda parts, host, _: DraMode(parts, host),
    # back from mode dra with nothing left to unprepare: only the slices are withdrawn
    ("device-plugin", False): lambda parts, host, _: DevicePluginMode(after_dra=host),
    # back from mode dra with claims prepared: the kubelet's DRA API for them alone, their
    # devices Unhealthy to the kubelet until each is unprepared
    ("device-plugin", True): HandBack,
}


def choose(parts: Parts) -> Mode:
    """The mode of this process. Mode dra needs the apiserver (ResourceSlices, ResourceClaims)."""
    s = parts.settings
    if s.mode == "dra" and parts.api is None:
        raise ConfigException("mode dra needs the apiserver (ResourceSlices, ResourceClaims)")
    if s.mode != "dra" and not migration.checkpoint_path(s).exists():
        return DevicePluginMode()  # this node never ran in mode dra this boot
    unprepared = asyncio.Event()
    host = migration.dra_host(parts, prepare=s.mode == "dra", on_unprepared=unprepared.set)
    return TABLE[s.mode, bool(host.claims)](parts, host, unprepared)


__all__ = ["Mode", "choose"]
