"""Rollout decisions for one component, one step at a time: apply which image, and what the
policy's status says of it. Pure: the workload and its pods' troubles come in as plain data.

A component's new image is *ready* when its workload has seen its latest spec and every replica
(every scheduled pod of a DaemonSet) is updated and available; a component of several workloads
(the device plugin and its DRA mode) when each of them is. A DaemonSet that no node asks for
(0 desired: no node labelled for it) is ready. It *failed* when one of its new
pods waits in a state that does not heal by waiting (ImagePullBackOff, ErrImagePull,
CrashLoopBackOff, InvalidImageName), or when it is not ready within the deadline; then the
component goes back to the last image that was ready (kept in the status) and stays there until
the policy names another image: the failed one is not retried by itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from .policy import ComponentSpec

#: Waiting reasons that mean the new version will not come up by waiting.
FAILING = frozenset({"ImagePullBackOff", "ErrImagePull", "CrashLoopBackOff", "InvalidImageName"})


@dataclass(frozen=True)
class Workload:
    """A Deployment's or DaemonSet's state, as far as readiness goes."""

    image: str  # the main container's image in the pod template
    generation: int
    observed_generation: int
    desired: int  # replicas; a DaemonSet's desiredNumberScheduled
    updated: int
    available: int
    total: int  # pods of any version (a Deployment's old ones included)
    parts: tuple[Workload, ...] = ()  # made by combine(): the workloads it sums

    @property
    def ready(self) -> bool:
        if self.parts:
            return all(p.ready for p in self.parts)
        return (
            self.observed_generation >= self.generation
            and self.updated == self.desired
            and self.available >= self.desired
            and self.total <= self.desired
        )

    def progress(self) -> str:
        return f"{self.updated}/{self.desired} updated, {self.available}/{self.desired} available"


def combine(seen: Sequence[Workload | None]) -> Workload | None:
    """The workloads of one component as one: absent while any of them is (the next apply makes
    it), its image theirs when they all run the same one (else none), its counts summed, ready
    when each of them is."""
    if not seen or any(w is None for w in seen):
        return None
    parts = tuple(w for w in seen if w is not None)
    if len(parts) == 1:
        return parts[0]
    images = {w.image for w in parts}
    return Workload(
        image=parts[0].image if len(images) == 1 else "",
        generation=sum(w.generation for w in parts),
        observed_generation=sum(w.observed_generation for w in parts),
        desired=sum(w.desired for w in parts),
        updated=sum(w.updated for w in parts),
        available=sum(w.available for w in parts),
        total=sum(w.total for w in parts),
        parts=parts,
    )


@dataclass(frozen=True)
class PodTrouble:
    """A container of one of the component's pods waiting for a reason in :data:`FAILING`."""

    pod: str
    image: str
    reason: str
    message: str = ""


@dataclass(frozen=True)
class Record:
    """What the status keeps of one component between reconciles (and operator restarts)."""

    name: str
    enabled: bool = True
    version: str = ""
    image: str = ""
    ready: bool = False
    message: str = ""
    last_ready_version: str = ""
    last_ready_image: str = ""
    failed_image: str = ""
    failed_message: str = ""
    rollout_image: str = ""
    rollout_started: float | None = None


@dataclass(frozen=True)
class Decision:
    image: str | None  # the image to apply now; None: leave the component as it is
    record: Record
    settled: bool  # nothing of this component is rolling out: the next may start


def tag(image: str) -> str:
    _, sep, t = image.rpartition(":")
    return t if sep and "/" not in t else ""


def disabled(prior: Record) -> Decision:
    return Decision(
        None,
        dataclasses.replace(
            prior,
            enabled=False,
            version="",
            image="",
            ready=False,
            message="disabled: its objects are removed",
            failed_image="",
            failed_message="",
            rollout_image="",
            rollout_started=None,
        ),
        settled=True,
    )


def _ready(seen: Workload | None, image: str) -> bool:
    return seen is not None and seen.image == image and seen.ready


def decide(
    spec: ComponentSpec,
    prior: Record,
    seen: Workload | None,
    troubles: list[PodTrouble],
    *,
    now: float,
    deadline: float,
    may_start: bool,
    blocker: str = "",
) -> Decision:
    """The next step of ``spec``'s component. ``prior`` is its record from the status, ``seen``
    its workload (None: absent), ``troubles`` its pods' failing waits. ``may_start`` is False while
    a component before it in the safe order is rolling out (``blocker``): a new image then waits.

    Guarantees: an image that failed and was rolled back is applied again only when the policy
    names it anew after naming another; a rollback goes only to an image that was ready; a
    component whose image is ready is settled (and a failure without a rollback clears then)."""
    target = spec.image
    base = dataclasses.replace(prior, enabled=True)
    if prior.failed_image == target and prior.last_ready_image not in ("", target):
        # Rolled back: stay on the last ready image until the policy names another.
        back = prior.last_ready_image
        ready = _ready(seen, back)
        record = dataclasses.replace(
            base,
            version=tag(back),
            image=back,
            ready=ready,
            message=prior.failed_message,
            rollout_image="",
            rollout_started=None,
        )
        if ready:
            record = dataclasses.replace(
                record, last_ready_image=back, last_ready_version=tag(back)
            )
        return Decision(back, record, settled=True)
    if _ready(seen, target):
        record = dataclasses.replace(
            base,
            version=spec.version,
            image=target,
            ready=True,
            message="ready",
            last_ready_version=spec.version,
            last_ready_image=target,
            failed_image="",
            failed_message="",
            rollout_image="",
            rollout_started=None,
        )
        return Decision(target, record, settled=True)
    if not may_start and (seen is None or seen.image != target):
        message = f"waiting for {blocker} to finish rolling out before {target}"
        return Decision(None, dataclasses.replace(base, message=message), settled=False)
    started = prior.rollout_started
    if prior.rollout_image != target or started is None:
        started = now
    trouble = next((t for t in troubles if t.image == target), None)
    if trouble is not None or now - started >= deadline:
        if trouble is not None:
            why = f"pod {trouble.pod} is waiting: {trouble.reason}"
            if trouble.message:
                why += f" ({trouble.message[:200]})"
        else:
            progress = seen.progress() if seen is not None else "no workload"
            why = f"not ready within {deadline:g} s ({progress})"
        message = f"{spec.name}: image {target} failed: {why}"
        back = prior.last_ready_image
        if back and back != target:
            message += f"; rolled back to {prior.last_ready_version}"
        else:
            # Nothing else was ready (a first install, or a config change on the same image):
            # the failure is reported, and a fix that makes the pods ready clears it.
            message += "; no other ready version to roll back to"
            back = target
        record = dataclasses.replace(
            base,
            version=tag(back),
            image=back,
            ready=False,
            message=message,
            failed_image=target,
            failed_message=message,
            rollout_image="",
            rollout_started=None,
        )
        return Decision(back, record, settled=True)
    progress = seen.progress() if seen is not None and seen.image == target else "starting"
    record = dataclasses.replace(
        base,
        version=spec.version,
        image=target,
        ready=False,
        message=f"rolling out {target}: {progress}",
        failed_image="",
        failed_message="",
        rollout_image=target,
        rollout_started=started,
    )
    return Decision(target, record, settled=False)
