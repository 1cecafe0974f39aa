"""A pod as JSON (kubelet /pods or the apiserver's) → :class:`PodView`, what the shared-GPU
handshake (:mod:`.deviceplugin.handshake`) and the reconciler read of it. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .reconcile import PodState


@dataclass(frozen=True)
class PodView:
    """What the handshake needs of a pod."""

    namespace: str
    name: str
    uid: str
    resource_version: str
    annotations: Mapping[str, str]
    requests: Mapping[str, Mapping[str, int]]
    """Per container, per extended resource: units requested."""
    phase: str = ""
    deleted: bool = False
    """A deletionTimestamp is set."""

    @property
    def ended(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


def _units(q: Any) -> int | None:
    """A count of extended-resource units (the API allows whole numbers only); None otherwise."""
    if isinstance(q, bool) or not isinstance(q, str | int):
        return None
    try:
        n = int(str(q))
    except ValueError:
        return None
    return n if n >= 0 else None


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


def pod_view(obj: Mapping[str, Any]) -> PodView | None:
    """The view of one pod object in API JSON; None when it is not shaped like a pod.

    Total over any JSON: a field of the wrong type reads as absent (the kubelet's answer is
    outside input; one odd pod must not fail the others)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    if not isinstance(meta, dict) or not isinstance(spec, dict):
        return None
    requests: dict[str, dict[str, int]] = {}
    for c in _list(spec.get("containers")):
        if not isinstance(c, dict) or not isinstance(c.get("name"), str):
            continue
        res = _dict(c.get("resources"))
        limits = {**_dict(res.get("requests")), **_dict(res.get("limits"))}
        requests[c["name"]] = {str(k): n for k, v in limits.items() if (n := _units(v)) is not None}
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
