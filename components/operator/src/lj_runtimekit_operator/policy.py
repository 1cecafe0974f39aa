"""The RuntimeKitPolicy: its API names, the suite's components in their safe upgrade order, and
the spec read into plain data with every field checked. Pure: data in, data out.

The spec (docs/operator.md)::

    spec:
      registry: <registry/project>          # default: the one deploy/ names
      namespace: kube-system                # where the namespaced objects go
      components:
        controller|scheduler|devicePlugin|exporter:
          enabled: true                     # default true
          image: lj-runtimekit-<component>  # repository; with a '/' it is the whole repository
          version: v1.14.0                  # tag; default: the release the operator ships
          nodeSelector: {label: value}      # replaces the workload's nodeSelector when given
          config: |                         # the ConfigMap's config.yaml (version: v1)
            version: v1
        controller:
          jobAgentImage: lj-runtimekit-controller-job-agent   # tagged with the controller's version
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from . import k8s_names
from .errors import PolicyError

Obj = dict[str, Any]

GROUP = "lj-runtimekit.aliyun.com"
VERSION = "v1"
PLURAL = "runtimekitpolicies"
KIND = "RuntimeKitPolicy"
API_VERSION = f"{GROUP}/{VERSION}"
FINALIZER = f"{GROUP}/operator"
FIELD_MANAGER = "lj-runtimekit-operator"
#: On every object the operator made: the policy it came from, and the component.
POLICY_LABEL = f"{GROUP}/policy"
COMPONENT_LABEL = f"{GROUP}/component"
MANAGED_BY = ("app.kubernetes.io/managed-by", "lj-runtimekit-operator")
DEFAULT_NAMESPACE = "kube-system"


@dataclass(frozen=True)
class Component:
    """One component of the suite as the operator deploys it."""

    key: str  # its key under spec.components
    name: str  # its name everywhere else (status, labels, images)
    folder: str  # deploy/<folder>/
    kind: str  # its workload's kind
    workload: str  # its workload's name (also its main container's)
    #: More workloads of the same kind and image, rolled out and judged with the main one
    others: tuple[str, ...] = ()

    @property
    def workloads(self) -> tuple[str, ...]:
        """Every workload of the component, the main one first."""
        return (self.workload, *self.others)


#: The safe order of an upgrade: the Deployments that decide (controller, scheduler) first, then
#: the DaemonSets on every GPU node (device plugin, exporter); one at a time.
COMPONENTS = (
    Component("controller", "controller", "controller", "Deployment", "lj-runtimekit-controller"),
    Component("scheduler", "scheduler", "scheduler", "Deployment", "lj-runtimekit-scheduler"),
    # The same image in DRA mode, on the nodes labelled for it (docs/dra.md).
    Component(
        "devicePlugin",
        "device-plugin",
        "deviceplugin",
        "DaemonSet",
        "lj-runtimekit-device-plugin",
        others=("lj-runtimekit-dra-plugin",),
    ),
    Component("exporter", "exporter", "exporter", "DaemonSet", "lj-runtimekit-exporter"),
)
BY_NAME = {c.name: c for c in COMPONENTS}
#: The objects every enabled suite needs whatever its components (the RuntimeClass).
COMMON = "common"
JOB_AGENT_IMAGE = "lj-runtimekit-controller-job-agent"
#: The device plugin's default node label prefix (docs/node-labels.md).
DEFAULT_LABEL_PREFIX = "lj-runtimekit.aliyun.com"

_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
# A repository path: lowercase components separated by '/', '.', '_', '__' or '-' (OCI), with an
# optional registry host and port in front.
_REPO = re.compile(
    r"([a-zA-Z0-9.-]+(:[0-9]+)?/)?[a-z0-9]+([._-]+[a-z0-9]+)*(/[a-z0-9]+([._-]+[a-z0-9]+)*)*"
)


@dataclass(frozen=True)
class ComponentSpec:
    """What the policy asks of one component, defaults filled in."""

    name: str
    enabled: bool
    image: str  # the whole reference, registry/repository:tag
    version: str
    node_selector: tuple[tuple[str, str], ...] | None  # None: the manifest's
    config: str | None  # None: the manifest's
    job_agent_image: str = ""  # the controller's --job-image
    #: The device plugin's node_label_prefix when its config names one ("": the default); its
    #: admission policy must admit label writes under it (render.py)
    label_prefix: str = ""


@dataclass(frozen=True)
class Policy:
    name: str
    uid: str
    generation: int
    namespace: str
    registry: str
    components: tuple[ComponentSpec, ...]

    def component(self, name: str) -> ComponentSpec:
        return next(c for c in self.components if c.name == name)


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise PolicyError(f"{where}: expected an object, got {type(value).__name__}")
    return value


def _text(value: Any, where: str, default: str) -> str:
    if value is None:
        return default
    if not isinstance(value, str):
        raise PolicyError(f"{where}: expected a string, got {value!r}")
    return value


def _repository(registry: str, image: str) -> str:
    return image if "/" in image else f"{registry}/{image}"


def _selector(value: Any, where: str) -> tuple[tuple[str, str], ...] | None:
    if value is None:
        return None
    items = _mapping(value, where)
    out = []
    for k, v in items.items():
        if not isinstance(k, str) or not k8s_names.is_qualified_name(k):
            raise PolicyError(f"{where}: {k!r} is not a label key")
        if not isinstance(v, str) or not k8s_names.is_label_value(v):
            raise PolicyError(f"{where}.{k}: {v!r} is not a label value (a string of at most 63)")
        out.append((k, v))
    return tuple(sorted(out))


def _config(value: Any, where: str) -> str | None:
    if value is None:
        return None
    text = _text(value, where, "")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise PolicyError(f"{where}: not YAML: {str(e)[:200]}") from e
    # The component refuses a file without `version: v1` at start and would crash-loop; say it
    # here, in the policy's status, before anything is rolled out.
    if not isinstance(data, dict) or data.get("version") != "v1":
        raise PolicyError(f"{where}: expected a YAML object with version: v1 (a component config)")
    return text


def _label_prefix(config: str | None, where: str) -> str:
    """The device plugin's ``node_label_prefix`` in ``config`` ("" when it names none or the
    default), checked as the plugin checks it: it goes into the plugin's admission policy, so
    nothing but a DNS subdomain may reach it."""
    if config is None:
        return ""
    value = yaml.safe_load(config).get("node_label_prefix")
    if value is None or value == DEFAULT_LABEL_PREFIX:
        return ""
    if not isinstance(value, str) or len(value) > 63 or not k8s_names.is_dns_subdomain(value):
        raise PolicyError(
            f"{where}: node_label_prefix {value!r}: expected a DNS subdomain of at most 63 "
            "characters, lowercase letters, digits, '-' and '.', e.g. gpu.example.com"
        )
    return value


def parse(obj: Mapping[str, Any], default_registry: str, default_version: str) -> Policy:
    """The policy ``obj`` (as the apiserver returns it) as plain data; raises
    :class:`PolicyError` naming the first field that cannot be used."""
    meta = _mapping(obj.get("metadata"), "metadata")
    spec = _mapping(obj.get("spec"), "spec")
    namespace = _text(spec.get("namespace"), "spec.namespace", DEFAULT_NAMESPACE)
    if not k8s_names.is_dns_label(namespace):
        raise PolicyError(f"spec.namespace: {namespace!r} is not a namespace name")
    registry = _text(spec.get("registry"), "spec.registry", default_registry).rstrip("/")
    if not registry or " " in registry:
        raise PolicyError(f"spec.registry: {registry!r} is not a registry")
    known = {c.key for c in COMPONENTS}
    given = _mapping(spec.get("components"), "spec.components")
    for key in given:
        if key not in known:
            raise PolicyError(
                f"spec.components.{key}: unknown component (known: {', '.join(sorted(known))})"
            )
    out = []
    for c in COMPONENTS:
        where = f"spec.components.{c.key}"
        s = _mapping(given.get(c.key), where)
        enabled = s.get("enabled", True)
        if not isinstance(enabled, bool):
            raise PolicyError(f"{where}.enabled: expected true or false, got {enabled!r}")
        version = _text(s.get("version"), f"{where}.version", default_version)
        if not _TAG.fullmatch(version):
            raise PolicyError(f"{where}.version: {version!r} is not an image tag")
        repo = _repository(registry, _text(s.get("image"), f"{where}.image", c.workload))
        if not _REPO.fullmatch(repo):
            raise PolicyError(f"{where}.image: {repo!r} is not an image repository")
        agent = ""
        if c.name == "controller":
            agent_repo = _repository(
                registry, _text(s.get("jobAgentImage"), f"{where}.jobAgentImage", JOB_AGENT_IMAGE)
            )
            if not _REPO.fullmatch(agent_repo):
                raise PolicyError(f"{where}.jobAgentImage: {agent_repo!r} is not a repository")
            agent = f"{agent_repo}:{version}"
        config = _config(s.get("config"), f"{where}.config")
        prefix = _label_prefix(config, f"{where}.config") if c.name == "device-plugin" else ""
        out.append(
            ComponentSpec(
                name=c.name,
                enabled=enabled,
                image=f"{repo}:{version}",
                version=version,
                node_selector=_selector(s.get("nodeSelector"), f"{where}.nodeSelector"),
                config=config,
                job_agent_image=agent,
                label_prefix=prefix,
            )
        )
    generation = meta.get("generation")
    return Policy(
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        generation=generation if isinstance(generation, int) else 0,
        namespace=namespace,
        registry=registry,
        components=tuple(out),
    )


def in_force(policies: list[Obj]) -> Obj | None:
    """The one policy the operator follows: the one already in force (it carries the operator's
    finalizer), else the oldest, then by name (creation times have a resolution of one second);
    the others are reported Degraded. Sticky, so that a second policy never takes over."""
    if not policies:
        return None

    def rank(p: Obj) -> tuple[bool, str, str]:
        meta = p.get("metadata") or {}
        return (
            FINALIZER not in (meta.get("finalizers") or []),
            str(meta.get("creationTimestamp") or ""),
            str(meta.get("name") or ""),
        )

    return min(policies, key=rank)
