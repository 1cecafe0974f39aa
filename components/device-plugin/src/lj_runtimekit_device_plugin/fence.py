"""GPUs fenced from new pods while a partition layout change waits for them (issue 39). Pure.

The controller records the fence on the node, the annotation :data:`FENCE_ANNOTATION` (JSON: the
layout, the GPUs' Runtime device ids, the pods it waits for; docs/partitioning.md). This plugin
enforces it on both paths by which a pod gets a GPU, at one place, the inventory's view
(:func:`overlay`): a fenced device reads unhealthy, so

- the kubelet hears its units Unhealthy (ListAndWatch): it gives them to no new container and
  the node's allocatable drops, whichever scheduler placed the pod — the root fix, since the
  kubelet, not a scheduler, hands out the units;
- NodeDevices shows it unhealthy (``fenced`` says why), so the suite's scheduler places
  nothing on it, and a shared-GPU Allocate on it is refused; in mode dra its slice device gets
  the unhealthy NoSchedule taint.

Pods already on it keep running (Unhealthy never evicts). Only the named GPUs: every other GPU of
the node keeps serving. The annotation lives in the cluster, so a restarted plugin finds it
again before it registers (:mod:`.modes`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Final

from .model import Device

#: The controller's annotation (its names.FENCE_ANNOTATION); the controller is the only writer.
FENCE_ANNOTATION: Final = "lj-runtimekit-controller/partition-fence"
MAX_DEVICES: Final = 64
MAX_TEXT: Final = 512


def parse(text: str | None) -> dict[str, str]:
    """Device id → why it is fenced, from the annotation's text; ``{}`` when absent or not a
    fence (a hand-edited value that is no JSON object fences nothing rather than everything)."""
    if not text:
        return {}
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return {}
    if not isinstance(data, dict) or not isinstance(data.get("devices"), list):
        return {}
    layout = data.get("layout")
    held = data.get("heldBy")
    pods = [h for h in held if isinstance(h, str)] if isinstance(held, list) else []
    why = f"fenced for partition layout {layout if isinstance(layout, str) else '?'}"
    if pods:
        why += f", waiting for {'; '.join(pods)}"
    return {
        d: why[:MAX_TEXT]
        for d in data["devices"][:MAX_DEVICES]
        if isinstance(d, str) and 0 < len(d) <= 253
    }


def of_node(node: Mapping[str, object]) -> dict[str, str]:
    """The fence on a Node as API JSON."""
    meta = node.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    text = annotations.get(FENCE_ANNOTATION) if isinstance(annotations, dict) else None
    return parse(text if isinstance(text, str) else None)


def overlay(devices: Iterable[Device], fenced: Mapping[str, str]) -> tuple[Device, ...]:
    """``devices`` with each fenced one unavailable: ``healthy`` False and ``fenced`` saying why.

    Guarantees: a device not named is returned as it is; a fenced device that was healthy keeps
    its Runtime health visible as ``healthy or fenced`` (an unhealthy one stays unhealthy with its
    own reason, and is not marked fenced)."""
    if not fenced:
        return tuple(devices)
    return tuple(
        replace(d, healthy=False, fenced=fenced[d.id], reason=fenced[d.id])
        if d.id in fenced and d.healthy
        else d
        for d in devices
    )
