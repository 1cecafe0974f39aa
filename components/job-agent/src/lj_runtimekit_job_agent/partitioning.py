"""The ``partition`` action: converge this node's GPUs to a layout through the Runtime (issue 22,
items 1 and 2).

Order, so that a refusal or a wait never leaves the node half-changed: read the node (ListDevices),
decide (:mod:`.partition_plan`), refuse what the hardware cannot take, wait for live allocations
on the GPUs to change to end (and, for a GPU bound to vfio-pci, which the Runtime allocates nothing
on, for the kubelet to say no pod holds it), and only then call the Runtime, one GPU at a time in
index order.
A failure halfway stops there and says which GPUs changed; a rerun skips every GPU already as the
layout says, so it continues from there. containerd is never touched.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any, Final

import structlog

from . import partition_plan, podresources
from .errors import JobAgentError, PermanentError, TemporaryError
from .gpus import VFIO, Holding
from .partition_layout import Layout, LayoutError, from_json
from .partition_plan import Change
from .podresources import PodResourcesUnavailable
from .runtime import (
    ConfigDaemon,
    DeviceDaemon,
    MethodMissing,
    RuntimeBusy,
    RuntimeRefused,
    RuntimeUnavailable,
)
from .settings import Settings

log = structlog.get_logger("lj_runtimekit_job_agent")

#: Seconds between two looks at the allocations while waiting for them to end.
POLL_S: Final = 2.0


class LayoutRefused(PermanentError):
    """The layout is no layout, or does not fit this node's GPUs; nothing was changed."""


class AllocationsLive(TemporaryError):
    """Live allocations hold GPUs that must change (the controller tries again later)."""


class PartitioningFailed(TemporaryError):
    """The Runtime refused a change halfway; a rerun continues from the GPU that failed."""


def read_layout(text: str) -> Layout:
    """The layout of ``--layout``; :class:`LayoutRefused` when the text is not one."""
    try:
        return from_json(text)
    except LayoutError as e:
        raise LayoutRefused(f"--layout is not a partition layout: {e}; nothing was changed") from e


def features(layout: Layout) -> list[str]:
    """The Runtime features (versions.FEATURE_MINIMUM) converging to ``layout`` needs."""
    modes = {e.target.mode for e in layout.entries}
    return ["partitioning", *(m for m in ("mig", "tdm") if m in modes)]


async def converge(
    settings: Settings, layout: Layout, config: ConfigDaemon, known: dict[str, Any]
) -> tuple[str, str]:
    """Bring the node's GPUs to ``layout``; (reason, message) on success, else a
    :class:`JobAgentError` saying what blocks or failed. ``known`` gets ``devices_changed``,
    ``devices_waited`` and ``blocked_by`` as they are learnt, for the result of a run that fails
    later."""
    name = f"layout {layout.name!r} ({layout.digest()})"
    async with DeviceDaemon(settings.socket_dir, settings.rpc_timeout) as devices:
        gpus = await devices.list_gpus()
        try:
            targets = layout.targets(g.index for g in gpus)
        except LayoutError as e:
            raise LayoutRefused(f"{e}; nothing was changed") from e
        plan = partition_plan.changes(gpus, targets)
        binding = (
            await config.has_set_device_binding() if partition_plan.needs_binding(plan) else None
        )
        refused = partition_plan.refusals(plan, binding)
        if refused:
            raise LayoutRefused(partition_plan.refusal_message(layout, refused))
        if not plan:
            return "AlreadyConverged", f"{name}: all {len(gpus)} GPUs already as it says"
        wanted = "; ".join(c.describe() for c in plan)
        log.info("partition_planned", layout=layout.name, changes=[c.describe() for c in plan])
        if settings.dry_run:
            return "DryRun", f"dry run: {name} would change {wanted}"
        await _wait_for_release(settings, devices, layout, plan, known)
        await _apply(settings, config, devices, layout, plan, known=known)
        after = partition_plan.changes(await devices.list_gpus(), targets)
    if after:
        raise PartitioningFailed(
            f"{name}: the Runtime accepted every change but reports "
            f"{'; '.join(c.describe() for c in after)} still to do; a rerun tries again"
        )
    return "Converged", f"{name} applied: {wanted}"


async def _wait_for_release(
    settings: Settings,
    devices: DeviceDaemon,
    layout: Layout,
    plan: Sequence[Change],
    known: dict[str, Any],
) -> None:
    """Return once no live allocation, and no pod given a vfio-bound GPU, holds a GPU of ``plan``;
    :class:`AllocationsLive` when some still do after ``wait_for_release`` seconds, or when the
    kubelet cannot say who holds a vfio-bound GPU of it. Never changes anything itself."""
    deadline = time.monotonic() + settings.wait_for_release
    vfio = partition_plan.on_vfio(plan)
    # every GPU of the plan, not only the held ones: the change waits until all are free at
    # once, so the controller fences them all from new pods while it waits
    known["devices_waited"] = tuple(c.gpu.id for c in plan)
    ask_runtime = True
    while True:
        holdings: list[Holding] = []
        if ask_runtime:
            try:
                holdings = await devices.list_holdings()
            except MethodMissing as e:
                # A Runtime without ListAllocations still refuses to change a held device itself
                # (FAILED_PRECONDITION), which ends the run as AllocationsLive in _apply.
                log.warning(
                    "allocations_unknown", error=str(e), effect="the Runtime's checks decide"
                )
                ask_runtime = False
        if not ask_runtime and not vfio:
            return
        # the Runtime cannot refuse to unbind a GPU a VM uses: only the kubelet knows
        vms = await _vm_holdings(settings, layout, vfio) if vfio else []
        blocks = partition_plan.blocked(plan, holdings, vms)
        known["blocked_by"] = tuple(b.describe() for b in blocks)
        if not blocks:
            return
        left = deadline - time.monotonic()
        if left <= 0:
            raise AllocationsLive(
                f"layout {layout.name!r}: live allocations hold GPUs it must change, still after "
                f"{settings.wait_for_release:g}s: {', '.join(known['blocked_by'])}; nothing was "
                "changed: the change runs once they end"
            )
        log.info(
            "partition_waiting_for_release",
            layout=layout.name,
            blocked_by=list(known["blocked_by"]),
            seconds_left=round(left, 1),
        )
        await asyncio.sleep(min(POLL_S, left))


async def _vm_holdings(
    settings: Settings,
    layout: Layout,
    vfio: Sequence[Change],
    progress: str = "nothing was changed",
) -> list[Holding]:
    """The pods the kubelet gave vfio-bound GPUs to (pod-resources), for the GPUs of ``vfio``.
    Unreachable: :class:`AllocationsLive`, since a GPU that may be in a running VM must not be
    taken from it blind; ``progress`` says what was already changed."""
    try:
        return await podresources.holdings(
            settings.pod_resources_socket, settings.vfio_resource, settings.rpc_timeout
        )
    except PodResourcesUnavailable as e:
        gpus = " or ".join(c.gpu.id for c in vfio)
        raise AllocationsLive(
            f"layout {layout.name!r}: the agent cannot tell whether a VM uses {gpus} "
            f"(pod-resources at {settings.pod_resources_socket} unreachable: {e}); {progress}: "
            "a GPU bound to vfio-pci is changed only once the kubelet says no pod holds it as "
            f"{settings.vfio_resource}"
        ) from e


async def _apply(
    settings: Settings,
    config: ConfigDaemon,
    devices: DeviceDaemon,
    layout: Layout,
    plan: Sequence[Change],
    *,
    known: dict[str, Any],
) -> None:
    """Carry out ``plan`` GPU by GPU, in index order; stop at the first refusal."""
    changed: list[Change] = []
    for n, c in enumerate(plan):
        if c.gpu.binding == VFIO:
            await _still_free(settings, layout, c, changed=changed, rest=plan[n + 1 :], known=known)
        done: list[str] = []
        try:
            for step in partition_plan.steps(c):
                if step.call == "bind":
                    await config.set_binding(step.device_id, step.binding)
                    done.append(f"SetDeviceBinding({step.binding})")
                else:
                    t = step.target
                    await config.set_partitioning(step.device_id, t.mode, t.profiles, t.slices)
                    done.append(f"SetPartitioning({t.describe()})")
        except (RuntimeRefused, RuntimeUnavailable) as e:
            busy = isinstance(e, RuntimeBusy) and await _held(devices, c, known)
            raise _halfway(
                e,
                layout,
                changed,
                c,
                busy=busy,
                blocked=known.get("blocked_by", ()),
                done=done,
                rest=plan[n + 1 :],
            ) from e
        changed.append(c)
        known["devices_changed"] = tuple(x.gpu.id for x in changed)
        log.info("gpu_changed", gpu=c.gpu.id, change=c.describe(), layout=layout.name)


async def _still_free(
    settings: Settings,
    layout: Layout,
    change: Change,
    *,
    changed: Sequence[Change],
    rest: Sequence[Change],
    known: dict[str, Any],
) -> None:
    """Ask the kubelet again just before a vfio-bound GPU leaves vfio-pci: the kubelet may have
    given it to a VM pod since the wait, and the Runtime, which allocated nothing, would unbind
    it under the VM. Held or unknown: :class:`AllocationsLive`, saying what already changed."""
    progress = _progress(changed, change, rest) if changed else "nothing was changed"
    vms = await _vm_holdings(settings, layout, [change], progress)
    blocks = partition_plan.blocked([change], (), vms)
    if blocks:
        known["blocked_by"] = tuple(b.describe() for b in blocks)
        raise AllocationsLive(
            f"layout {layout.name!r}: {change.describe()} not done: a pod was given the GPU after "
            f"the wait: {', '.join(b.describe() for b in blocks)}; {progress}"
        )


async def _held(devices: DeviceDaemon, change: Change, known: dict[str, Any]) -> bool:
    """Whether a live allocation holds the GPU the Runtime just refused to change with
    FAILED_PRECONDITION (one that came after the wait), noted in ``blocked_by``. The Runtime
    answers FAILED_PRECONDITION for other reasons too (a mode an older Runtime does not report
    as unsupported): those are failures, not a wait."""
    try:
        blocks = partition_plan.blocked([change], await devices.list_holdings())
    except (RuntimeRefused, RuntimeUnavailable) as e:
        log.warning("allocations_unknown", error=str(e), effect="the refusal is taken as busy")
        return True
    known["blocked_by"] = tuple(b.describe() for b in blocks)
    return bool(blocks)


def _progress(changed: Sequence[Change], failed: Change, rest: Sequence[Change]) -> str:
    before = "; ".join(c.describe() for c in changed) or "none"
    untouched = ", ".join(c.gpu.id for c in rest) or "none"
    return (
        f"changed: {before}; not yet: {untouched}; a rerun continues from {failed.gpu.id} (GPUs "
        "already as the layout says are skipped)"
    )


def _halfway(
    error: JobAgentError,
    layout: Layout,
    changed: Sequence[Change],
    failed: Change,
    *,
    busy: bool,
    blocked: Sequence[str] = (),
    done: Sequence[str],
    rest: Sequence[Change],
) -> JobAgentError:
    """The error of a run stopped at ``failed``: which GPUs changed, which failed, in the
    Runtime's words, and that a rerun continues from there."""
    partly = f" (its {' and '.join(done)} done)" if done else ""
    progress = _progress(changed, failed, rest)
    if busy:
        return AllocationsLive(
            f"layout {layout.name!r}: the Runtime refused {failed.describe()}{partly} for a "
            f"live allocation that came after the wait: {', '.join(blocked)} ({error}); "
            f"{progress}"
        )
    if isinstance(error, RuntimeUnavailable):
        return RuntimeUnavailable(f"{error}, at {failed.describe()}{partly}; {progress}")
    return PartitioningFailed(
        f"layout {layout.name!r}: {failed.describe()} failed{partly}: {error}; {progress}"
    )
