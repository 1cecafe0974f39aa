"""A pod as JSON (kubelet /pods or the apiserver's) → :class:`PodView`. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .assignment import PodView
from .reconcile import PodState


def _units(q: Any) -> int | None:
    try:
        return int(str(q))
    except ValueError:
        return None


def pod_view(obj: Mapping[str, Any]) -> PodView | None:
    """The view of one pod object in API JSON; None when it is not shaped like a pod."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    if not isinstance(meta, dict) or not isinstance(spec, dict):
        return None
    requests: dict[str, dict[str, int]] = {}
    for c in spec.get("containers") or []:
        if not isinstance(c, dict) or not isinstance(c.get("name"), str):
            continue
        res = c.get("resources") or {}
        limits = {**(res.get("requests") or {}), **(res.get("limits") or {})}
        requests[c["name"]] = {k: n for k, v in limits.items() if (n := _units(v)) is not None}
    ann = meta.get("annotations") or {}
    status = obj.get("status") or {}
    return PodView(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        resource_version=str(meta.get("resourceVersion", "")),
        annotations={str(k): str(v) for k, v in ann.items()} if isinstance(ann, dict) else {},
        requests=requests,
        phase=str(status.get("phase", "")) if isinstance(status, dict) else "",
        deleted=bool(meta.get("deletionTimestamp")),
    )


def pod_state(view: PodView) -> PodState:
    return PodState(view.namespace, view.name, view.uid, view.phase, view.deleted)
