"""What a container gets for GPUs bound to vfio-pci. Pure: data in, data out.

The Runtime allocates nothing on a vfio-bound GPU (the VM's own driver will drive it), so this
answer comes from the inventory alone: the vfio container node, each GPU's IOMMU group node as
the Runtime lists it, and the GPUs' PCI addresses in the environment variable KubeVirt's
virt-launcher reads for a host device of the resource (``PCI_RESOURCE_<RESOURCE NAME>``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..errors import PermanentError
from ..model import Device, Injection

#: The vfio container device every user of vfio-pci opens besides its group's node.
VFIO_CONTAINER = "/dev/vfio/vfio"
ENV_PREFIX = "PCI_RESOURCE"
_NOT_ALNUM = re.compile(r"[^A-Z0-9]")


class VfioUnavailable(PermanentError):
    """A unit the kubelet handed out is no longer a vfio-bound GPU the Runtime lists."""


def env_names(resource: str) -> tuple[str, ...]:
    """The environment variables that carry the PCI addresses of ``resource``'s devices.

    First KubeVirt's own spelling (upper case, ``/`` and ``.`` to ``_``; it keeps ``-``, so
    ``aliyun.com/gpu-vfio`` reads ``PCI_RESOURCE_ALIYUN_COM_GPU-VFIO``); then, when it differs,
    the POSIX one (every other character to ``_``), which a shell can read.
    """
    upper = resource.upper()
    kubevirt = f"{ENV_PREFIX}_{upper.replace('/', '_').replace('.', '_')}"
    posix = f"{ENV_PREFIX}_{_NOT_ALNUM.sub('_', upper)}"
    return tuple(dict.fromkeys((kubevirt, posix)))


def injection(resource: str, devices: Sequence[Device], unit_ids: Sequence[str]) -> Injection:
    """The device nodes and environment of a container given vfio units ``unit_ids``.

    Guarantees: every unit is a vfio-bound device the Runtime lists with at least one
    ``/dev/vfio/`` node, else :class:`VfioUnavailable` naming it; the vfio container node comes
    first and no node repeats; PCI addresses are in the order of ``unit_ids``.
    """
    by_id = {d.id: d for d in devices}
    chosen: list[Device] = []
    for unit in unit_ids:
        d = by_id.get(unit)
        if d is None or not d.vfio:
            state = "not listed by the Runtime" if d is None else f"bound to {d.binding}"
            raise VfioUnavailable(
                f"{resource} {unit}: {state}, not vfio-pci; was it bound back to the driver "
                "after the kubelet chose it? The pod is retried on the next admission."
            )
        if not any(n.startswith("/dev/vfio/") for n in d.device_nodes) or not d.pci_bus_id:
            raise VfioUnavailable(
                f"{resource} {unit}: the Runtime lists no /dev/vfio/<group> node or PCI address "
                f"for it (device_nodes {list(d.device_nodes)}, pci_bus_id {d.pci_bus_id!r}): "
                "check the Runtime's vfio binding of the device"
            )
        chosen.append(d)
    paths = dict.fromkeys([VFIO_CONTAINER, *(n for d in chosen for n in d.device_nodes)])
    addresses = ",".join(d.pci_bus_id for d in chosen)
    return Injection(
        envs=tuple((name, addresses) for name in env_names(resource)),
        device_nodes=tuple((p, p, "rwm") for p in paths),
    )
