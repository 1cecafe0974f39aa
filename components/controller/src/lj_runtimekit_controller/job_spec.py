"""The agent Job for one action on one node. Pure: settings in, a Job manifest (dict) out."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Any, Final

from . import names
from .partition_layout import Layout

#: The volume of the kubelet's pod-resources directory (partition Jobs only); the admission
#: policy allows it by this name, at that one path, read-only.
POD_RESOURCES_VOLUME: Final = "kubelet-pod-resources"
#: The kubelet's socket in that directory (pkg/kubelet/apis/podresources).
POD_RESOURCES_SOCKET: Final = "kubelet.sock"


@dataclass(frozen=True)
class JobTemplate:
    """What every agent Job shares; from the controller's settings."""

    image: str
    namespace: str = "kube-system"
    deadline_s: int = 600
    backoff_limit: int = 0
    socket_dir: str = "/run/amp/eKitC/xdm/sockets"
    containerd_dir: str = "/etc/containerd"
    pod_resources_dir: str = "/var/lib/kubelet/pod-resources"
    agent_args: tuple[str, ...] = ()
    service_account: str = names.AGENT_SERVICE_ACCOUNT
    priority_class: str = "system-node-critical"
    pod_annotations: tuple[tuple[str, str], ...] = ()


def manifest(
    t: JobTemplate,
    node: str,
    action: str,
    attempt: int,
    layout: Layout | None = None,
    *,
    first_look: bool = False,
) -> dict[str, Any]:
    """The Job ``lj-agent-<node>-<action>``: pinned to ``node``, tolerating every taint, with the
    host paths the agent edits (containerd's config dir, the Runtime's socket dir) and host PID
    with privilege to restart containerd through nsenter — nothing else from the host. A
    ``partition`` Job carries its layout as the agent's ``--layout`` (canonical JSON) and names
    it, with its digest, in annotations; it alone also mounts the kubelet's pod-resources
    directory, read-only, for the agent to ask which pods hold a GPU bound to vfio-pci (the
    Runtime allocates nothing for those) before changing it. A ``first_look`` partition Job (its
    layout fences nothing on the node yet) does not wait for GPUs in use (``--wait-for-release=0``,
    after the operator's own agent args): it reports them at once, so the controller fences them
    from new pods before any try waits."""
    name = names.job_name(node, action)
    labels = {**names.MANAGED_BY, names.NODE_KEY: names.label_value(node), names.ACTION_KEY: action}
    annotations = {names.NODE_KEY: node, names.ATTEMPT_KEY: str(attempt)}
    layout_args: list[str] = []
    if layout is not None:
        annotations[names.LAYOUT_KEY] = layout.name
        annotations[names.DIGEST_KEY] = layout.digest()
        layout_args = [f"--layout={layout.to_json()}"]
    volumes: list[dict[str, Any]] = [
        {"name": "containerd", "hostPath": {"path": t.containerd_dir, "type": "DirectoryOrCreate"}},
        # OrCreate: on a node without the Runtime the agent starts and reports "config-daemon.sock
        # not found" (exit 3) instead of the pod hanging in ContainerCreating until the deadline.
        {
            "name": "runtime-sockets",
            "hostPath": {"path": t.socket_dir, "type": "DirectoryOrCreate"},
        },
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "containerd", "mountPath": t.containerd_dir},
        {"name": "runtime-sockets", "mountPath": t.socket_dir},
    ]
    pod_resources_args: list[str] = []
    if action == "partition":
        # The directory, not the socket file: a restarted kubelet replaces the socket, which a
        # mount of the old file would miss. OrCreate, as above: a kubelet without the API leaves
        # the agent to say so (exit 7, nothing changed) instead of the pod hanging.
        volumes.append(
            {
                "name": POD_RESOURCES_VOLUME,
                "hostPath": {"path": t.pod_resources_dir, "type": "DirectoryOrCreate"},
            }
        )
        mounts.append(
            {"name": POD_RESOURCES_VOLUME, "mountPath": t.pod_resources_dir, "readOnly": True}
        )
        socket = posixpath.join(t.pod_resources_dir, POD_RESOURCES_SOCKET)
        pod_resources_args = [f"--pod-resources-socket={socket}"]
    container = {
        "name": names.AGENT_CONTAINER,
        "image": t.image,
        "imagePullPolicy": "IfNotPresent",
        "args": [
            action,
            f"--node-name={node}",
            f"--socket-dir={t.socket_dir}",
            *layout_args,
            *pod_resources_args,
            *t.agent_args,
            *(["--wait-for-release=0"] if first_look and action == "partition" else []),
        ],
        "env": [{"name": "NODE_NAME", "value": node}],
        # The one documented exception to the suite's pod security (docs/security.md): nsenter
        # into the host's PID 1 to restart containerd needs privilege and host PID. The root
        # filesystem stays read-only: the agent writes only the mounted host directories.
        "securityContext": {"privileged": True, "runAsUser": 0, "readOnlyRootFilesystem": True},
        "volumeMounts": mounts,
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
