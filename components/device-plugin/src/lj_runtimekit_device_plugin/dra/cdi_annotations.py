"""Which annotations a container gets from its prepared DRA devices. Pure: data in, data out.

CDI applies a device's env, device nodes and mounts, but not its ``annotations`` (:mod:`.cdi`
puts the Runtime's ``xdm.amp.com*`` annotations there): the NRI plugin (:mod:`.nri`) adds them
to the container's OCI spec at CreateContainer, so the ``lj-runtime`` handler sees them as it
does in mode device-plugin.

A container names its CDI devices in NRI's ``CDI_devices`` (containerd 2.2 and later fill it
from the CRI request, which is where the kubelet puts a DRA claim's devices) and, as older
clients did, in ``cdi.k8s.io/<key>`` annotations whose values are comma-separated device ids.
Only devices of our kind count: the specs this module reads are our own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: The annotation prefix CDI's Kubernetes convention uses for device ids (containerd reads it).
CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"


@dataclass(frozen=True)
class Adjustment:
    """What to add to one container, and the keys two of its devices disagreed on."""

    annotations: dict[str, str] = field(default_factory=dict)
    conflicts: tuple[str, ...] = ()


def our_devices(
    cdi_devices: Iterable[str], annotations: Mapping[str, str], kind: str
) -> tuple[str, ...]:
    """The names of the container's CDI devices of ``kind``, in the order named, once each."""
    ids = list(cdi_devices)
    for key, value in annotations.items():
        if key.startswith(CDI_ANNOTATION_PREFIX):
            ids.extend(v.strip() for v in value.split(","))
    prefix = f"{kind}="
    names = (i[len(prefix) :] for i in ids if i.startswith(prefix) and len(i) > len(prefix))
    return tuple(dict.fromkeys(names))


def adjustment(names: Iterable[str], specs: Iterable[Mapping[str, Any]], kind: str) -> Adjustment:
    """The annotations of the devices ``names`` in the CDI ``specs`` of ``kind``.

    Guarantees: only devices named and only specs of ``kind`` contribute; a device's annotations
    are added whole; when two devices give one key different values the first named wins and
    the key is reported in ``conflicts``; a name found in no spec adds nothing.
    """
    wanted = list(names)
    found: dict[str, Mapping[str, Any]] = {}
    for spec in specs:
        if spec.get("kind") != kind:
            continue
        devices = spec.get("devices")
        for dev in devices if isinstance(devices, list) else ():
            if not isinstance(dev, dict):
                continue
            name = dev.get("name")
            if name in wanted and name not in found and isinstance(dev.get("annotations"), dict):
                found[name] = dev["annotations"]
    out: dict[str, str] = {}
    conflicts: list[str] = []
    for name in wanted:
        for key, value in found.get(name, {}).items():
            if key in out and out[key] != value:
                conflicts.append(key)
                continue
            out[key] = str(value)
    return Adjustment(out, tuple(dict.fromkeys(conflicts)))
