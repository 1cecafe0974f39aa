"""The CDI spec a prepared DRA claim becomes, from the Runtime's injection. Pure: data in, data out.

With DRA the kubelet does not take envs, device nodes and mounts from the plugin as the device
plugin API does: the plugin answers ``NodePrepareResources`` with CDI device ids and the container
runtime (containerd 2.x: CDI on by default) applies the matching CDI spec it reads from its spec
directory. One spec per claim, one CDI device per prepared claim device, each carrying the
container edits of the Runtime's :class:`~.model.Injection` for that device.

Names follow the CDI parser (container-device-interface ``pkg/parser``): the vendor and class of
the kind start with a letter, hold letters, digits, ``_``, ``-``, ``.`` and end with a letter or
digit; a device name starts and ends with a letter or digit and may also hold ``:``. Every path is
absolute. A spec that would break these rules is never produced: :class:`InvalidCDI` names what
is wrong instead.

When one Runtime allocation serves several claim devices, each of their CDI devices may carry the
whole injection: the runtime applies a device node or mount per container path and an env var per
key, so identical edits from two devices merge into one.

The injection's annotations (``xdm.amp.com*``) become the CDI device's ``annotations``. CDI does
not copy those to the container's OCI annotations: the NRI plugin (:mod:`.nri`) reads them from
here and adds them to the container, so the ``lj-runtime`` handler sees them.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import PermanentError
from ..k8s_names import is_qualified_name
from ..model import Injection

CDI_VERSION = "0.6.0"
DEFAULT_KIND = "aliyun.com/gpu"

_VENDOR_OR_CLASS = re.compile(r"[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?\Z")
_DEVICE_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?\Z")
_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*\Z")
_NOT_IN_NAME = re.compile(r"[^A-Za-z0-9_.:-]+")
#: CDI caps the total size of a spec's or a device's annotations (keys and values) at 256 KiB.
MAX_ANNOTATIONS_BYTES = 256 * 1024
#: Room kept for the readable part of a device name; the digest keeps names unique.
_READABLE_MAX = 120


class InvalidCDI(PermanentError):
    """The injection or the configured kind cannot be written as a valid CDI spec."""


@dataclass(frozen=True)
class PreparedDevice:
    """One device of a claim as prepared: which request, which slice device, what it injects."""

    request: str
    """The claim's request name (``<request>/<subrequest>`` for a first-available subrequest)."""
    pool: str
    device: str
    """The device's name in the ResourceSlice pool."""
    injection: Injection


def validate_kind(kind: str) -> None:
    """``<vendor>/<class>`` with both parts valid CDI names, else :class:`InvalidCDI`."""
    vendor, sep, klass = kind.partition("/")
    if not sep or not _VENDOR_OR_CLASS.match(vendor) or not _VENDOR_OR_CLASS.match(klass):
        raise InvalidCDI(
            f"CDI kind {kind!r} is not <vendor>/<class> (each starting with a letter, ending "
            "with a letter or digit, holding only letters, digits, '_', '-', '.')"
        )


def device_name(claim_uid: str, request: str, device: str) -> str:
    """The CDI device name for ``device`` of ``request`` in claim ``claim_uid``.

    Stable (the same triple always gives the same name, across restarts), unique per triple
    (a digest of the exact triple ends it, so two triples that read alike after characters CDI
    does not allow are replaced still differ) and a valid CDI device name.
    """
    digest = hashlib.sha256("\0".join((claim_uid, request, device)).encode()).hexdigest()[:12]
    readable = _NOT_IN_NAME.sub("_", f"{claim_uid}-{request}-{device}")
    readable = readable.strip("_.:-")[:_READABLE_MAX].rstrip("_.:-")
    return f"{readable}-{digest}" if readable else digest


def cdi_device_id(kind: str, name: str) -> str:
    """The fully qualified CDI device id the kubelet passes on: ``<vendor>/<class>=<name>``."""
    return f"{kind}={name}"


def spec_file_name(kind: str, claim_uid: str) -> str:
    """The claim's spec file name in the CDI directory: one file per claim, so unpreparing it
    removes exactly that file. Vendor and class are joined with ``-`` as CDI's own tools do."""
    validate_kind(kind)
    safe_uid = _NOT_IN_NAME.sub("_", claim_uid).replace(":", "_")
    return f"{kind.replace('/', '-')}_{safe_uid}.json"


def _absolute(path: str, what: str) -> str:
    if not path.startswith("/") or "\0" in path:
        raise InvalidCDI(f"{what} {path!r} is not an absolute path")
    return path


def _annotations(pairs: Iterable[tuple[str, str]], where: str) -> dict[str, str]:
    out = dict(pairs)
    size = 0
    for key, value in out.items():
        # CDI checks its annotation keys as Kubernetes annotation keys: qualified names
        if not is_qualified_name(key):
            raise InvalidCDI(f"{where}: annotation key {key!r} is not a Kubernetes annotation key")
        size += len(key.encode()) + len(value.encode())
    if size > MAX_ANNOTATIONS_BYTES:
        raise InvalidCDI(f"{where}: annotations of {size} bytes exceed CDI's 256 KiB")
    return out


def container_edits(injection: Injection, where: str = "injection") -> dict[str, Any]:
    """The CDI ``containerEdits`` for one injection; :class:`InvalidCDI` when it cannot be one."""
    edits: dict[str, Any] = {}
    env = []
    for key, value in injection.envs:
        if not _ENV_KEY.match(key) or "\0" in value:
            raise InvalidCDI(f"{where}: env var {key!r} cannot be set through CDI")
        env.append(f"{key}={value}")
    if env:
        edits["env"] = env
    nodes = []
    for container_path, host_path, permissions in injection.device_nodes:
        node: dict[str, str] = {"path": _absolute(container_path, f"{where}: device node")}
        if host_path:
            node["hostPath"] = _absolute(host_path, f"{where}: device node host path")
        if permissions:
            if set(permissions) - set("rwm"):
                raise InvalidCDI(
                    f"{where}: device node {container_path} permissions {permissions!r} "
                    "are not a combination of r, w, m"
                )
            node["permissions"] = permissions
        nodes.append(node)
    if nodes:
        edits["deviceNodes"] = nodes
    mounts = [
        {
            "hostPath": _absolute(host_path, f"{where}: mount host path"),
            "containerPath": _absolute(container_path, f"{where}: mount"),
            "options": ["bind", "ro" if read_only else "rw"],
        }
        for container_path, host_path, read_only in injection.mounts
    ]
    if mounts:
        edits["mounts"] = mounts
    return edits


def claim_spec(
    claim_uid: str, devices: Sequence[PreparedDevice], kind: str = DEFAULT_KIND
) -> tuple[dict[str, Any], dict[PreparedDevice, str]]:
    """The CDI spec for one claim and, per prepared device, the CDI device id to return.

    Raises :class:`InvalidCDI` rather than produce a spec the container runtime would reject.
    """
    validate_kind(kind)
    if not claim_uid:
        raise InvalidCDI("a claim without a uid cannot be given a CDI spec")
    cdi_devices: list[dict[str, Any]] = []
    ids: dict[PreparedDevice, str] = {}
    names: set[str] = set()
    for dev in devices:
        name = device_name(claim_uid, dev.request, dev.device)
        if name in names:
            # the same request and device twice: one CDI device serves both entries
            ids[dev] = cdi_device_id(kind, name)
            continue
        names.add(name)
        where = f"claim {claim_uid} request {dev.request} device {dev.device}"
        entry: dict[str, Any] = {
            "name": name,
            "containerEdits": container_edits(dev.injection, where),
        }
        if dev.injection.annotations:
            entry["annotations"] = _annotations(dev.injection.annotations, where)
        cdi_devices.append(entry)
        ids[dev] = cdi_device_id(kind, name)
    spec = {"cdiVersion": CDI_VERSION, "kind": kind, "devices": cdi_devices}
    validate_spec(spec)
    return spec, ids


def validate_spec(spec: Mapping[str, Any]) -> None:
    """Check a spec against the CDI rules this module writes by; :class:`InvalidCDI` if not.

    Used on every spec :func:`claim_spec` builds and on specs read back from disk.
    """
    if spec.get("cdiVersion") != CDI_VERSION:
        raise InvalidCDI(f"cdiVersion {spec.get('cdiVersion')!r} is not {CDI_VERSION}")
    validate_kind(str(spec.get("kind", "")))
    devices = spec.get("devices")
    if not isinstance(devices, list) or not devices:
        raise InvalidCDI("a CDI spec needs at least one device")
    seen: set[str] = set()
    for dev in devices:
        name = str(dev.get("name", ""))
        if not _DEVICE_NAME.match(name):
            raise InvalidCDI(f"CDI device name {name!r} is not valid")
        if name in seen:
            raise InvalidCDI(f"CDI device name {name!r} appears twice")
        seen.add(name)
        edits = dev.get("containerEdits", {})
        for env in edits.get("env", []):
            if "=" not in env or not _ENV_KEY.match(env.split("=", 1)[0]):
                raise InvalidCDI(f"CDI device {name}: env {env!r} is not KEY=value")
        for node in edits.get("deviceNodes", []):
            _absolute(node.get("path", ""), f"CDI device {name}: device node")
            if "hostPath" in node:
                _absolute(node["hostPath"], f"CDI device {name}: device node host path")
            if set(node.get("permissions", "")) - set("rwm"):
                raise InvalidCDI(f"CDI device {name}: bad device node permissions")
        for mount in edits.get("mounts", []):
            _absolute(mount.get("hostPath", ""), f"CDI device {name}: mount host path")
            _absolute(mount.get("containerPath", ""), f"CDI device {name}: mount")
        _annotations(dev.get("annotations", {}).items(), f"CDI device {name}")
