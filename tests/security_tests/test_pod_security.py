"""Pod security (issue 19 §4, docs/security.md): each workload's pod, as the manifests and the
controller's job_spec build it, created with dry-run in namespaces that enforce each Pod Security
Standards level. The cluster services pass `restricted`; the node daemons need `privileged` for
exactly the host access docs/security.md gives a reason for, and for nothing more."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Iterator

import pytest

from lj_runtimekit_controller import job_spec
from lj_runtimekit_testkit.cluster.handle import Cluster
from lj_runtimekit_testkit.manifests import FOLDERS, Obj, load_objects, manifest_files

from .conftest import Caller, eventually, ok

pytestmark = pytest.mark.cluster

LEVELS = ("restricted", "baseline", "privileged")
#: workload → its manifest folder: the components', and the operator's (deploy/operator).
MANIFESTS = {**FOLDERS, "operator": "operator"}
WORKLOADS = [*MANIFESTS, "dra-plugin", "job-agent"]
#: A workload that is not its folder's first: workload → (folder's component, workload name).
OTHERS = {"dra-plugin": ("device-plugin", "lj-runtimekit-dra-plugin")}

#: workload → the level it passes, and the Pod Security checks it fails at each stricter level
#: (the check names the apiserver reports). Anything else failing is a regression.
EXPECTED: dict[str, tuple[str, dict[str, set[str]]]] = {
    "scheduler": ("restricted", {}),
    "controller": ("restricted", {}),
    "operator": ("restricted", {}),
    "device-plugin": (
        "privileged",
        {
            "baseline": {"host namespaces", "hostPath volumes", "hostPort"},
            "restricted": {
                "host namespaces",
                "hostPort",
                "restricted volume types",
                "runAsNonRoot != true",
                "runAsUser=0",
            },
        },
    ),
    # the device plugin's DRA DaemonSet: the same pod shape, other host directories
    "dra-plugin": (
        "privileged",
        {
            "baseline": {"host namespaces", "hostPath volumes", "hostPort"},
            "restricted": {
                "host namespaces",
                "hostPort",
                "restricted volume types",
                "runAsNonRoot != true",
                "runAsUser=0",
            },
        },
    ),
    "exporter": (
        "privileged",
        {
            "baseline": {"host namespaces", "hostPath volumes", "hostPort"},
            "restricted": {
                "host namespaces",
                "hostPort",
                "restricted volume types",
                "runAsNonRoot != true",
                "runAsUser=0",
            },
        },
    ),
    "job-agent": (
        "privileged",
        {
            "baseline": {"host namespaces", "privileged", "hostPath volumes"},
            "restricted": {
                "host namespaces",
                "privileged",
                "restricted volume types",
                "allowPrivilegeEscalation != false",
                "unrestricted capabilities",
                "runAsNonRoot != true",
                "runAsUser=0",
                "seccompProfile",
            },
        },
    ),
}


def pod_spec(workload: str) -> Obj:
    if workload == "job-agent":
        t = job_spec.JobTemplate(image="reg/lj-runtimekit-controller-job-agent:v1.13.0")
        spec: Obj = job_spec.manifest(t, "gpu-1", "enable", 1)["spec"]["template"]["spec"]
    else:
        component, name = OTHERS.get(workload, (workload, f"lj-runtimekit-{workload}"))
        (obj,) = [
            o
            for o in load_objects(manifest_files(MANIFESTS[component]))
            if o["kind"] in ("Deployment", "DaemonSet") and o["metadata"]["name"] == name
        ]
        spec = obj["spec"]["template"]["spec"]
    # Pod Security looks at neither; the ServiceAccount and the system priority classes exist only
    # in the suite's namespace, and their admission would refuse the pod before Pod Security.
    return {k: v for k, v in spec.items() if k not in ("serviceAccountName", "priorityClassName")}


@pytest.fixture(scope="module")
def enforcing(cluster: Cluster) -> Iterator[dict[str, str]]:
    """level → a namespace that enforces it (with its default ServiceAccount made)."""
    api = cluster.api_client()
    root = Caller(api)
    run = uuid.uuid4().hex[:6]
    made = {}
    for level in LEVELS:
        name = f"pss-{level}-{run}"
        labels = {
            "pod-security.kubernetes.io/enforce": level,
            "pod-security.kubernetes.io/enforce-version": "latest",
        }
        ok(root("POST", "/api/v1/namespaces", {"metadata": {"name": name, "labels": labels}}), name)
        made[level] = name
    for name in made.values():
        path = f"/api/v1/namespaces/{name}/serviceaccounts/default"
        eventually(f"ServiceAccount {name}/default", functools.partial(_exists, root, path))
    try:
        yield made
    finally:
        for name in made.values():
            root("DELETE", f"/api/v1/namespaces/{name}")
        api.close()  # type: ignore[no-untyped-call]


def _exists(root: Caller, path: str) -> bool:
    return root("GET", path).status == 200


def _violations(message: str) -> set[str]:
    """The Pod Security check names in the apiserver's refusal: ``<check> (<detail>)`` items,
    separated by commas outside the parentheses."""
    _, _, detail = message.partition('": ')
    names, depth, item = set(), 0, ""
    for ch in detail + ",":
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            names.add(item.strip().partition(" (")[0])
            item = ""
        else:
            item += ch
    return names


@pytest.mark.parametrize("workload", WORKLOADS, ids=WORKLOADS)
def test_workload_passes_the_level_docs_security_names_and_fails_only_for_its_reasons(
    cluster: Cluster, enforcing: dict[str, str], workload: str
) -> None:
    root = Caller(cluster.api_client())
    spec = pod_spec(workload)
    passes, fails = EXPECTED[workload]
    for level in LEVELS:
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": workload}, "spec": spec}
        got = root(
            "POST", f"/api/v1/namespaces/{enforcing[level]}/pods", body, query=[("dryRun", "All")]
        )
        if LEVELS.index(level) >= LEVELS.index(passes):
            assert got.status == 201, (level, got.status, got.message)
        else:
            assert got.status == 403, (level, got.status, got.message)
            assert f'violates PodSecurity "{level}:latest"' in got.message, got.message
            assert _violations(got.message) == fails[level], got.message
