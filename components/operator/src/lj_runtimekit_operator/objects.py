"""The kinds of object the operator writes: where each lives in the API. Pure data.

One list, so that the objects it applies, the strays it prunes, what a deleted policy removes and
its RBAC (deploy/operator/02-rbac.yaml) name the same kinds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]


@dataclass(frozen=True)
class Resource:
    api_version: str
    kind: str
    plural: str
    namespaced: bool

    def path(self, namespace: str = "", name: str = "") -> str:
        """The REST path of the collection, or of one object when ``name`` is given."""
        prefix = "/api/" if "/" not in self.api_version else "/apis/"
        path = prefix + self.api_version
        if self.namespaced and namespace:
            path += f"/namespaces/{namespace}"
        path += f"/{self.plural}"
        return f"{path}/{name}" if name else path


#: In the order they are applied (what a workload names exists before it), deleted in reverse.
RESOURCES = (
    Resource("node.k8s.io/v1", "RuntimeClass", "runtimeclasses", False),
    Resource("v1", "ConfigMap", "configmaps", True),
    Resource("v1", "ServiceAccount", "serviceaccounts", True),
    Resource("rbac.authorization.k8s.io/v1", "ClusterRole", "clusterroles", False),
    Resource("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", "clusterrolebindings", False),
    Resource("rbac.authorization.k8s.io/v1", "Role", "roles", True),
    Resource("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings", True),
    Resource(
        "admissionregistration.k8s.io/v1",
        "ValidatingAdmissionPolicy",
        "validatingadmissionpolicies",
        False,
    ),
    Resource(
        "admissionregistration.k8s.io/v1",
        "ValidatingAdmissionPolicyBinding",
        "validatingadmissionpolicybindings",
        False,
    ),
    # The device plugin's DRA DeviceClasses (docs/dra.md): what claims name.
    Resource("resource.k8s.io/v1", "DeviceClass", "deviceclasses", False),
    Resource("v1", "Service", "services", True),
    Resource("apps/v1", "Deployment", "deployments", True),
    Resource("apps/v1", "DaemonSet", "daemonsets", True),
)
#: What a deleted policy also removes, never applied (docs/operator.md, "Delete"): the agent Jobs
#: the controller kept (failed ones) and the device plugin's node inventories.
LEFTOVERS = (
    Resource("batch/v1", "Job", "jobs", True),
    Resource("lj-runtimekit.aliyun.com/v1", "NodeDevices", "nodedevices", False),
)
BY_KIND = {r.kind: r for r in (*RESOURCES, *LEFTOVERS)}
ORDER = {r.kind: i for i, r in enumerate(RESOURCES)}


def resource(obj: Obj) -> Resource:
    try:
        return BY_KIND[obj["kind"]]
    except KeyError:
        raise ValueError(
            f"the operator does not manage objects of kind {obj.get('kind')!r}"
        ) from None


def key(obj: Obj) -> tuple[str, str, str]:
    """Kind, namespace and name: what identifies an object in a cluster."""
    meta = obj.get("metadata") or {}
    return (str(obj.get("kind", "")), str(meta.get("namespace") or ""), str(meta.get("name", "")))
