"""Names, labels and annotation keys of the controller's objects. Pure."""

from __future__ import annotations

import hashlib
from typing import Final

from . import k8s_names

PREFIX: Final = "lj-runtimekit-controller"
STATUS_ANNOTATION: Final = f"{PREFIX}/last-action-status"
RETRY_ANNOTATION: Final = f"{PREFIX}/retry"
NODE_KEY: Final = f"{PREFIX}/node"
ACTION_KEY: Final = f"{PREFIX}/action"
ATTEMPT_KEY: Final = f"{PREFIX}/attempt"
MANAGED_BY: Final = {"app.kubernetes.io/managed-by": PREFIX, "app": "lj-runtimekit-job-agent"}
MANAGED_SELECTOR: Final = ",".join(f"{k}={v}" for k, v in MANAGED_BY.items())
PARTITION_STATUS_ANNOTATION: Final = f"{PREFIX}/partition-status"
FENCE_ANNOTATION: Final = f"{PREFIX}/partition-fence"
"""The GPUs a waiting layout change fences from new pods (:mod:`.fence`); the device plugin reads
it (its setting ``fence_annotation``)."""
LAYOUT_KEY: Final = f"{PREFIX}/layout"
DIGEST_KEY: Final = f"{PREFIX}/layout-digest"
FEATURE_ACTIONS: Final = ("enable", "disable")
ACTIONS: Final = (*FEATURE_ACTIONS, "partition")
AGENT_CONTAINER: Final = "agent"
"""The agent Job's one container; only its termination message counts as the agent's result."""
AGENT_SERVICE_ACCOUNT: Final = "lj-runtimekit-job-agent"
"""The agent pods' ServiceAccount: no rights and no token (the agent talks only to its node); the
controller's admission policy refuses an agent Job under any other."""
MAX_NAME: Final = k8s_names.MAX_LABEL


def _digest(text: str, size: int = 10) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:size]


def job_name(node: str, action: str) -> str:
    """``lj-agent-<node>-<action>``; a name over 63 characters keeps a prefix and a hash.

    Guarantees: at most 63 characters, a valid DNS label for any valid node name, stable for one
    (node, action), different for different nodes with overwhelming probability.
    """
    full = f"lj-agent-{node}-{action}"
    if len(full) <= MAX_NAME:
        return full
    tail = f"-{_digest(node)}-{action}"
    head = f"lj-agent-{node}"[: MAX_NAME - len(tail)].rstrip("-.")
    return head + tail


def label_value(value: str) -> str:
    """``value`` when it is a valid label value (<= 63 chars), else a hash of it."""
    if k8s_names.is_label_value(value):
        return value
    return f"h-{_digest(value, 20)}"
