"""The agent Job for one action on one node. Pure: settings in, a Job manifest (dict) out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import names


@dataclass(frozen=True)
class JobTemplate:
    """What every agent Job shares; from the controller's settings."""

    image: str
    namespace: str = "kube-system"
    deadline_s: int = 600
    backoff_limit: int = 0
    socket_dir: str = "/run/amp/eKitC/xdm/sockets"
    containerd_dir: str = "/etc/containerd"
    agent_args: tuple[str, ...] = ()
    service_account: str = names.AGENT_SERVICE_ACCOUNT
    priority_class: str = "system-node-critical"
    pod_annotations: tuple[tuple[str, str], ...] = ()


def manifest(t: JobTemplate, node: str, action: str, attempt: int) -> dict[str, Any]:
    """The Job ``lj-agent-<node>-<action>``: pinned to ``node``, tolerating every taint, with the
    host paths the agent edits (containerd's config dir, the Runtime's socket dir) and host PID
    with privilege to restart containerd through nsenter — nothing else from the host."""
    name = names.job_name(node, action)
    labels = {**names.MANAGED_BY, names.NODE_KEY: names.label_value(node), names.ACTION_KEY: action}
    annotations = {names.NODE_KEY: node, names.ATTEMPT_KEY: str(attempt)}
    volumes = [
        {"name": "containerd", "hostPath": {"path": t.containerd_dir, "type": "DirectoryOrCreate"}},
        # OrCreate: on a node without the Runtime the agent starts and reports "config-daemon.sock
        # not found" (exit 3) instead of the pod hanging in ContainerCreating until the deadline.
        {
            "name": "runtime-sockets",
            "hostPath": {"path": t.socket_dir, "type": "DirectoryOrCreate"},
        },
    ]
    container = {
        "name": names.AGENT_CONTAINER,
        "image": t.image,
        "imagePullPolicy": "IfNotPresent",
        "args": [action, f"--node-name={node}", f"--socket-dir={t.socket_dir}", *t.agent_args],
        "env": [{"name": "NODE_NAME", "value": node}],
        # The one documented exception to the suite's pod security (docs/security.md): nsenter
        # into the host's PID 1 to restart containerd needs privilege and host PID. The root
        # filesystem stays read-only: the agent writes only the mounted host directories.
        "securityContext": {"privileged": True, "runAsUser": 0, "readOnlyRootFilesystem": True},
        "volumeMounts": [
            {"name": "containerd", "mountPath": t.containerd_dir},
            {"name": "runtime-sockets", "mountPath": t.socket_dir},
        ],
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}},
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    pod_spec: dict[str, Any] = {
        "nodeName": node,
        "restartPolicy": "Never",
        "hostPID": True,
        "automountServiceAccountToken": False,
        "serviceAccountName": t.service_account,
        "tolerations": [{"operator": "Exists"}],
        "containers": [container],
        "volumes": volumes,
    }
    if t.priority_class:
        pod_spec["priorityClassName"] = t.priority_class
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": t.namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {
            "backoffLimit": t.backoff_limit,
            "activeDeadlineSeconds": t.deadline_s,
            "template": {
                "metadata": {"labels": labels, "annotations": dict(t.pod_annotations)},
                "spec": pod_spec,
            },
        },
    }
