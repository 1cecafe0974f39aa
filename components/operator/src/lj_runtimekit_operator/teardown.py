"""What a deleted policy must undo on the nodes, decided from plain data. Pure.

The same steps as ``deploy/deploy-all.sh undeploy`` (guide §3.5), in the same order: take the
feature label off every node, so that the controller runs the job agent's disable action there
(the ``lj-runtime`` handler leaves the node's containerd); wait until every node the controller
enabled records a succeeded disable and no agent Job runs, within a deadline; only then remove the
suite; at the end take the suite's own labels and annotations off the nodes.

Where the teardown stands is kept in the policy's status (``status.teardown``), so that a new
leader goes on from there: when it started (the deadline's start), and once the nodes are done,
whether they were all disabled or which were left enabled when the deadline passed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from .policy import DEFAULT_LABEL_PREFIX

#: The controller's feature label (its setting ``label_key``) and where it records a result.
FEATURE_LABEL = "lj_runtimekit_enable"
STATUS_ANNOTATION = "lj-runtimekit-controller/last-action-status"
#: The controller's agent Jobs, and the annotation naming a Job's node.
AGENT_JOBS = "app.kubernetes.io/managed-by=lj-runtimekit-controller"
JOB_NODE = "lj-runtimekit-controller/node"
#: The components' node annotations (``lj-runtimekit-<component>/<key>``).
ANNOTATION_PREFIXES = (
    "lj-runtimekit-controller/",
    "lj-runtimekit-device-plugin/",
    "lj-runtimekit-scheduler/",
    "lj-runtimekit-exporter/",
)
#: status.teardown.nodes once the nodes are done.
DISABLED, NOT_DISABLED = "Disabled", "NotDisabled"
#: The Event reason when the deadline passed with nodes still enabled.
NODES_NOT_DISABLED = "NodesNotDisabled"


@dataclass(frozen=True)
class Node:
    name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]


@dataclass(frozen=True)
class State:
    """``status.teardown``: when it started; the nodes' outcome once known ("" before)."""

    started: str = ""
    nodes: str = ""
    not_disabled: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"startedAt": self.started}
        if self.nodes:
            out["nodes"] = self.nodes
        if self.not_disabled:
            out["notDisabled"] = list(self.not_disabled)
        return out


def state(status: Mapping[str, Any] | None) -> State:
    """The teardown state a status holds; anything malformed reads as not started."""
    raw = (status or {}).get("teardown")
    if not isinstance(raw, Mapping) or not isinstance(raw.get("startedAt"), str):
        return State()
    nodes = raw.get("nodes") if raw.get("nodes") in (DISABLED, NOT_DISABLED) else ""
    left = raw.get("notDisabled")
    names = tuple(str(n) for n in left) if isinstance(left, list) else ()
    return State(str(raw["startedAt"]), str(nodes), names)


def feature_label(controller_config: str | None) -> str:
    """The label key the controller follows: ``label_key`` of its config, else the default."""
    try:
        data = yaml.safe_load(controller_config or "")
    except yaml.YAMLError:
        return FEATURE_LABEL
    key = data.get("label_key") if isinstance(data, dict) else None
    return key if isinstance(key, str) and key else FEATURE_LABEL


def _status(text: str | None) -> tuple[str, str, str] | None:
    """(action, result, message) of the controller's annotation; None when absent or garbled."""
    try:
        data = json.loads(text) if text else None
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    return str(data.get("action", "")), str(data.get("result", "")), str(data.get("message", ""))


def pending(nodes: Iterable[Node], running_jobs: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Nodes not yet disabled → why: a recorded result other than a succeeded disable, or an
    agent Job still running (``(job, node)``). A node the controller never acted on (no result)
    needs nothing but the label off. As ``deploy-all.sh undeploy`` judges it."""
    out: dict[str, str] = {}
    for node in nodes:
        if STATUS_ANNOTATION not in node.annotations:
            continue
        found = _status(node.annotations[STATUS_ANNOTATION])
        if found is None:
            out[node.name] = "its last action status is not one the controller wrote"
            continue
        action, result, message = found
        if (action, result) != ("disable", "succeeded"):
            out[node.name] = f"last action {action} {result}" + (f": {message}" if message else "")
    for job, on in running_jobs:
        out.setdefault(on or job, f"Job {job} running")
    return out


def feature_off(node: Node, label: str) -> dict[str, Any] | None:
    """The merge patch that takes the feature label off ``node``; None when it has none."""
    if label not in node.labels:
        return None
    return {"metadata": {"labels": {label: None}}}


def leftovers(node: Node, label: str, prefix: str = "") -> dict[str, Any] | None:
    """The merge patch that takes the suite's labels and annotations off ``node`` (the feature
    label, the device plugin's labels under the default prefix and the policy's ``prefix``, the
    components' annotations); None when it carries none."""
    prefixes = {f"{DEFAULT_LABEL_PREFIX}/"} | ({f"{prefix}/"} if prefix else set())
    labels = {k: None for k in node.labels if k == label or any(k.startswith(p) for p in prefixes)}
    annotations = {
        k: None for k in node.annotations if any(k.startswith(p) for p in ANNOTATION_PREFIXES)
    }
    meta: dict[str, Any] = {}
    if labels:
        meta["labels"] = labels
    if annotations:
        meta["annotations"] = annotations
    return {"metadata": meta} if meta else None


def waiting_message(left: Mapping[str, str], controller_ready: bool, seconds_left: float) -> str:
    """What the policy's status says while nodes are being disabled."""
    shown = "; ".join(f"{n}: {why}" for n, why in sorted(left.items())[:5])
    more = f" (and {len(left) - 5} more)" if len(left) > 5 else ""
    head = f"waiting for the controller to disable {len(left)} node(s): {shown}{more}"
    tail = f"; the suite is removed in {max(int(seconds_left), 0)} s at the latest"
    if not controller_ready:
        head += (
            "; the controller is not ready, so nobody can switch the feature off on them (their"
            " containerd keeps the lj-runtime handler)"
        )
    return head + tail


def gave_up_message(left: Mapping[str, str], deadline: float) -> str:
    """The Event and status once the deadline passed with nodes still enabled."""
    shown = "; ".join(f"{n}: {why}" for n, why in sorted(left.items()))
    return (
        f"{len(left)} node(s) not disabled after {int(deadline)} s, the suite is removed anyway "
        f"and their containerd keeps the lj-runtime handler: {shown}"[:900]
        + ". Check: kubectl -n <namespace> get jobs -l "
        + AGENT_JOBS
        + "; kubectl get node <node> -o jsonpath='{.metadata.annotations."
        + STATUS_ANNOTATION
        + "}'; then deploy the suite again and delete its policy, or run"
        " deploy/deploy-all.sh undeploy"
    )
