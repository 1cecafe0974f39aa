"""What the ``partition`` action must do to bring a node's GPUs to a layout. Pure: data in, data
out.

The layout itself was checked without the hardware (:mod:`.partition_layout`); here it meets the
node: whether each GPU can take its target (:func:`refusals`), which GPUs differ from it
(:func:`changes`), which live allocations or VM pods hold those (:func:`blocked`) and the Runtime
calls that carry one GPU over (:func:`steps`). Guarantees: a GPU already as its target yields no
change and so no call; nothing here decides to change a GPU the layout leaves as it is.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from .gpus import DRIVER, VFIO, Gpu, Holding
from .partition_layout import WHOLE, Layout, Target

GIB: Final = 1 << 30
_MIG_MEMORY = re.compile(r"^[0-9]+g\.([0-9]+)gb$")
#: The Runtime method a binding change needs; a Runtime older than it answers UNIMPLEMENTED.
SET_DEVICE_BINDING: Final = "ConfigService.SetDeviceBinding"


def current(gpu: Gpu) -> Target | None:
    """The GPU's state as a layout target; None when the Runtime reports a mode or binding this
    agent does not know (a newer Runtime): it then differs from every target."""
    if gpu.binding == VFIO:
        return Target("vfio")
    if gpu.binding != DRIVER or gpu.mode not in ("none", "mig", "tdm"):
        return None
    return _partitioning(gpu)


def _partitioning(gpu: Gpu) -> Target:
    if gpu.mode == "mig":
        return Target("mig", profiles=gpu.profiles)
    if gpu.mode == "tdm":
        return Target("tdm", slices=gpu.slices)
    return WHOLE


def describe(target: Target | None) -> str:
    return "an unknown state" if target is None else target.describe()


@dataclass(frozen=True)
class Change:
    """One GPU that is not as the layout says."""

    gpu: Gpu
    before: Target | None
    after: Target

    def describe(self) -> str:
        return f"{self.gpu.id}: {describe(self.before)} → {describe(self.after)}"


@dataclass(frozen=True)
class Step:
    """One Runtime call: ``partition`` (SetPartitioning to ``target``, whole meaning none) or
    ``bind`` (SetDeviceBinding to ``binding``, ``driver`` or ``vfio``)."""

    call: str
    device_id: str
    target: Target = WHOLE
    binding: str = ""


def changes(gpus: Iterable[Gpu], targets: Mapping[int, Target]) -> list[Change]:
    """The GPUs whose state differs from their target, in index order."""
    out = []
    for gpu in sorted(gpus, key=lambda g: g.index):
        before = current(gpu)
        after = targets.get(gpu.index, WHOLE)
        if before != after:
            out.append(Change(gpu, before, after))
    return out


def steps(change: Change) -> list[Step]:
    """The calls that carry one GPU to its target, in order: a partitioned GPU is made whole
    before vfio-pci takes it, and a vfio GPU goes back to the driver before it is partitioned (the
    Runtime refuses either the other way round)."""
    gpu, after = change.gpu, change.after
    if after.mode == "vfio":
        out = [] if gpu.mode == "none" else [Step("partition", gpu.id, WHOLE)]
        return [*out, Step("bind", gpu.id, binding=VFIO)]
    out = [] if gpu.binding == DRIVER else [Step("bind", gpu.id, binding=DRIVER)]
    if gpu.binding not in (DRIVER, VFIO) or gpu.mode not in ("none", "mig", "tdm"):
        return [*out, Step("partition", gpu.id, after)]  # unknown state: ask for the target
    if _partitioning(gpu) != after:
        out.append(Step("partition", gpu.id, after))
    return out


def needs_binding(plan: Sequence[Change]) -> bool:
    """Whether carrying out ``plan`` calls SetDeviceBinding."""
    return any(s.call == "bind" for c in plan for s in steps(c))


def mig_memory_gib(profiles: Iterable[str]) -> int:
    """GiB the MIG profiles ask for: the NN of each ``<g>g.<NN>gb``."""
    total = 0
    for p in profiles:
        m = _MIG_MEMORY.match(p)
        total += int(m[1]) if m else 0
    return total


def refusals(plan: Sequence[Change], binding_supported: bool | None) -> list[tuple[Change, str]]:
    """Why GPUs of ``plan`` cannot take their target on this hardware, one reason per GPU, before
    anything changes. ``binding_supported``: whether the Runtime has SetDeviceBinding (None: not
    asked, as nothing in the plan needs it). A GPU that reports no supported modes (a Runtime
    older than the field) is not judged here: the Runtime's own answer decides."""
    out = []
    for c in plan:
        why = _refusal(c, binding_supported)
        if why:
            out.append((c, why))
    return out


def _refusal(c: Change, binding_supported: bool | None) -> str:
    gpu, after = c.gpu, c.after
    if (
        after.mode in ("mig", "tdm")
        and gpu.supported_modes
        and after.mode not in gpu.supported_modes
    ):
        modes = " and ".join(m.upper() for m in sorted(gpu.supported_modes))
        return f"{after.mode.upper()} is not supported by the GPU (it supports {modes})"
    if after.mode == "mig":
        need, have = mig_memory_gib(after.profiles), gpu.memory_bytes / GIB
        if need * GIB > gpu.memory_bytes:
            return (
                f"MIG profiles {'+'.join(after.profiles)} need {need} GiB, the GPU has {have:g} GiB"
            )
    if binding_supported is False and any(s.call == "bind" for s in steps(c)):
        return (
            f"{describe(after)} needs {SET_DEVICE_BINDING}, which this Runtime does not have "
            "(UNIMPLEMENTED): upgrade the Runtime for vfio-pci binding"
        )
    return ""


def refusal_message(layout: Layout, refused: Sequence[tuple[Change, str]]) -> str:
    parts = "; ".join(
        f"GPU {c.gpu.index} ({c.gpu.id}) → {describe(c.after)}: {why}" for c, why in refused
    )
    return f"layout {layout.name!r} does not fit this node: {parts}; nothing was changed"


@dataclass(frozen=True)
class Block:
    """A GPU to change that a live allocation holds (itself or one of its partitions), or, for a
    vfio-bound GPU, a pod the kubelet gave it to."""

    gpu_id: str
    holding: Holding

    def describe(self) -> str:
        return f"{self.gpu_id} by {self.holding.owner()}"


def on_vfio(plan: Sequence[Change]) -> list[Change]:
    """The changes of GPUs bound to vfio-pci now: only the kubelet knows who holds those (the
    Runtime allocates nothing for a VM's GPU)."""
    return [c for c in plan if c.gpu.binding == VFIO]


def blocked(
    plan: Sequence[Change], holdings: Iterable[Holding], vm_holdings: Iterable[Holding] = ()
) -> list[Block]:
    """Who holds a GPU of ``plan``, by GPU in plan order, then allocation id and pod.

    ``holdings`` are the Runtime's allocations (of a GPU or of its partitions); ``vm_holdings``
    the pods the kubelet gave units of the vfio resource, whose unit id is the GPU's device id:
    they count only against GPUs of ``plan`` bound to vfio-pci now (a unit id left over from
    before a GPU went back to the driver holds nothing)."""
    owner: dict[str, str] = {}
    for c in plan:
        owner[c.gpu.id] = c.gpu.id
        owner.update(dict.fromkeys(c.gpu.partition_ids, c.gpu.id))
    vfio = {c.gpu.id for c in on_vfio(plan)}
    order = {c.gpu.id: n for n, c in enumerate(plan)}
    found = [
        (gpu_id, h)
        for h in holdings
        for unit in h.device_ids
        if (gpu_id := owner.get(unit)) is not None
    ]
    found += [(unit, h) for h in vm_holdings for unit in h.device_ids if unit in vfio]
    out = {(g, h.allocation_id, h.namespace, h.pod, h.container): Block(g, h) for g, h in found}
    return [out[k] for k in sorted(out, key=lambda k: (order[k[0]], *k[1:]))]
