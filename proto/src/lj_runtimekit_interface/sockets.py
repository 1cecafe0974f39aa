"""Where the Runtime serves its services, and the kubelet's device plugin constants."""

from __future__ import annotations

from typing import Final

#: The Runtime's socket directory on a node (guide §1.2).
DEFAULT_SOCKET_DIR: Final = "/run/amp/eKitC/xdm/sockets"
#: DeviceService.
DEVICE_SOCKET: Final = "device-daemon.sock"
#: MonitorService.
MONITOR_SOCKET: Final = "monitor-daemon.sock"
#: ConfigService; the name is fixed by the guide.
CONFIG_SOCKET: Final = "config-daemon.sock"

#: The kubelet's device plugin directory and registration socket.
DEVICE_PLUGIN_DIR: Final = "/var/lib/kubelet/device-plugins"
KUBELET_SOCKET: Final = "kubelet.sock"
DEVICE_PLUGIN_API_VERSION: Final = "v1beta1"
HEALTHY: Final = "Healthy"
UNHEALTHY: Final = "Unhealthy"

#: Prefix of the container annotations the lj-runtime handler reads.
INJECTION_ANNOTATION_PREFIX: Final = "xdm.amp.com"
#: Between the prefix and a key's name: a dot, never a slash. containerd passes an annotation to
#: the handler only if it matches ``container_annotations = ["xdm.amp.com*"]`` with Go's
#: ``path.Match``, where ``*`` stops at ``/`` (docs/contracts.md, "Injection annotations").
INJECTION_ANNOTATION_SEPARATOR: Final = "."


def injection_annotation(name: str) -> str:
    """The injection annotation key for ``name``: ``xdm.amp.com.<name>``."""
    return f"{INJECTION_ANNOTATION_PREFIX}{INJECTION_ANNOTATION_SEPARATOR}{name}"


#: Every injection annotation key a Runtime returns in ``Injection.annotations`` (the last two only
#: for shared gpu-core/gpu-memory allocations).
INJECTION_ANNOTATION_KEYS: Final = tuple(
    injection_annotation(n)
    for n in (
        "allocation-id",
        "devices",
        "device-uuids",
        "node",
        "pod-uid",
        "core-percent",
        "memory-bytes",
    )
)


def unix_target(path: str) -> str:
    """The gRPC target for a unix socket path (absolute or relative)."""
    return f"unix://{path}" if path.startswith("/") else f"unix:{path}"
