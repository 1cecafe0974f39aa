"""The objects of one component as the policy wants them, from the bundled manifests. Pure.

What changes from deploy/: the namespace (of the objects, of the ServiceAccounts that RBAC
bindings and admission policies name), the image of the workload's container (and the
controller's ``--job-image``), its nodeSelector (the DRA DaemonSet keeps its device mode label),
the ConfigMap's ``config.yaml``, the label prefixes the device plugin's admission policy admits
(a renamed ``node_label_prefix`` besides the default, as the chart does) and, so that a config
change restarts the pods as a new image does, a hash of that config on the pod template.
Every object gets the labels of the policy and component; namespaced ones an owner reference to
the policy (a cluster-scoped owner of namespaced dependents is allowed; for the cluster-scoped
objects the label and the policy's finalizer do the job).
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterable

from .objects import ORDER, Obj, resource
from .policy import (
    API_VERSION,
    BY_NAME,
    COMPONENT_LABEL,
    DEFAULT_LABEL_PREFIX,
    KIND,
    MANAGED_BY,
    POLICY_LABEL,
    ComponentSpec,
    Policy,
)

CONFIG_KEY = "config.yaml"
CONFIG_HASH = "lj-runtimekit.aliyun.com/config-hash"
_MANIFEST_NAMESPACE = "kube-system"
#: The node label that puts a node's devices in DRA mode (docs/dra.md).
DEVICE_MODE_LABEL = "lj_runtimekit_device_mode"
#: The device plugin's admission policy, and its variable of the label prefixes it may write.
DEVICE_PLUGIN_POLICY = "lj-runtimekit-device-plugin-own-node"
PREFIXES_VARIABLE = "prefixes"


def prefixes_expression(prefix: str) -> str:
    """The ``prefixes`` variable of the device plugin's admission policy for ``prefix`` (""
    the default), as the chart renders it: the default prefix always (its fixed key
    node-label-prefix, and the labels a rename leaves to remove), and the renamed one."""
    extra = f", '{prefix}/'" if prefix and prefix != DEFAULT_LABEL_PREFIX else ""
    return f"['{DEFAULT_LABEL_PREFIX}/'{extra}]"


def _label_prefixes(obj: Obj, prefix: str) -> None:
    if (
        obj["kind"] != "ValidatingAdmissionPolicy"
        or obj["metadata"]["name"] != DEVICE_PLUGIN_POLICY
    ):
        return
    for variable in obj["spec"].get("variables") or []:
        if variable.get("name") == PREFIXES_VARIABLE:
            variable["expression"] = prefixes_expression(prefix)


def labels(policy: str, component: str) -> dict[str, str]:
    return {POLICY_LABEL: policy, COMPONENT_LABEL: component, MANAGED_BY[0]: MANAGED_BY[1]}


def selector(policy: str, component: str | None = None) -> str:
    """The label selector of what the operator made for ``policy`` (one component of it)."""
    s = f"{POLICY_LABEL}={policy}"
    return s if component is None else f"{s},{COMPONENT_LABEL}={component}"


def _owner(policy: Policy) -> Obj:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": policy.name,
        "uid": policy.uid,
        "blockOwnerDeletion": False,  # deletion is the finalizer's job, not the GC's foreground
        "controller": True,
    }


def _ns(text: str, namespace: str) -> str:
    # Admission policies match the component's ServiceAccount by its user name.
    return text.replace(
        f"system:serviceaccount:{_MANIFEST_NAMESPACE}:", f"system:serviceaccount:{namespace}:"
    )


def _namespace_refs(obj: Obj, namespace: str) -> None:
    kind, spec = obj["kind"], obj.get("spec") or {}
    for subject in obj.get("subjects") or []:
        if subject.get("kind") == "ServiceAccount":
            subject["namespace"] = namespace
    if kind == "ValidatingAdmissionPolicy":
        for cond in spec.get("matchConditions") or []:
            cond["expression"] = _ns(cond["expression"], namespace)
    if kind == "ValidatingAdmissionPolicyBinding" and spec.get("paramRef", {}).get("namespace"):
        spec["paramRef"]["namespace"] = namespace


def config_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _workload(obj: Obj, spec: ComponentSpec, image: str, config: str) -> None:
    name = obj["metadata"]["name"]
    template = obj["spec"]["template"]
    pod = template["spec"]
    container = next(c for c in pod["containers"] if c["name"] == name)
    container["image"] = image
    if spec.job_agent_image:
        args = container.get("args") or []
        container["args"] = [
            f"--job-image={spec.job_agent_image}" if a.startswith("--job-image=") else a
            for a in args
        ]
    if spec.node_selector is not None:
        # The device mode stays: it is what says which of the device plugin's two DaemonSets
        # runs on a node (the other one keeps off those nodes by its affinity).
        mode = {k: v for k, v in (pod.get("nodeSelector") or {}).items() if k == DEVICE_MODE_LABEL}
        pod["nodeSelector"] = dict(spec.node_selector) | mode
    annotations = template.setdefault("metadata", {}).setdefault("annotations", {})
    annotations[CONFIG_HASH] = config_hash(config)


def render(policy: Policy, component: str, manifests: Iterable[Obj], image: str = "") -> list[Obj]:
    """The objects of ``component`` (or ``common``) for ``policy``, in apply order; the workload
    runs ``image`` (default: the policy's image of the component).

    Guarantees: every object carries the policy's and component's labels; every namespaced one
    is in ``policy.namespace`` and owned by the policy; nothing names kube-system that the
    manifests named as the suite's namespace."""
    spec = policy.component(component) if component in BY_NAME else None
    items = [copy.deepcopy(o) for o in manifests]
    config = next(
        (str((o.get("data") or {}).get(CONFIG_KEY, "")) for o in items if o["kind"] == "ConfigMap"),
        "",
    )
    if spec is not None and spec.config is not None:
        config = spec.config
    out = []
    for obj in items:
        meta = obj.setdefault("metadata", {})
        meta.setdefault("labels", {}).update(labels(policy.name, component))
        if resource(obj).namespaced:
            meta["namespace"] = policy.namespace
            meta["ownerReferences"] = [_owner(policy)]
        _namespace_refs(obj, policy.namespace)
        if spec is not None:
            if obj["kind"] == "ConfigMap":
                obj.setdefault("data", {})[CONFIG_KEY] = config
            if obj["kind"] in ("Deployment", "DaemonSet"):
                _workload(obj, spec, image or spec.image, config)
            _label_prefixes(obj, spec.label_prefix)
        out.append(obj)
    out.sort(key=lambda o: ORDER[o["kind"]])  # stable: file order within a kind
    return out


def digest(objects: Iterable[Obj]) -> str:
    """A short hash of a rendered set: the same objects, the same hash (to apply on change)."""
    text = json.dumps(list(objects), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]
