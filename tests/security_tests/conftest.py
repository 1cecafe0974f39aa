"""The suite's RBAC and admission policies on the real control plane, and each component's real
token: a TokenRequest for its ServiceAccount, bound to a pod of that ServiceAccount on a node, as
the kubelet asks for the token it mounts (so the token carries the node-name claim the device
plugin's policy reads).

Only the access objects are applied (ServiceAccounts, roles, bindings, admission policies, the
CRDs), plus the controller's Deployment at zero replicas: the parameter of its policy. They are
removed again at the end of the module, the CRDs excepted (other tests use them).
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from kubernetes import client

from lj_runtimekit_testkit.cluster.handle import Cluster
from lj_runtimekit_testkit.manifests import (
    DEPLOY,
    FOLDERS,
    Obj,
    load_objects,
    manifest_files,
    tool_dir,
)

NS = "kube-system"
#: component → its ServiceAccount (the job agent's comes with the controller).
ACCOUNTS = {
    "scheduler": "lj-runtimekit-scheduler",
    "controller": "lj-runtimekit-controller",
    "device-plugin": "lj-runtimekit-device-plugin",
    "exporter": "lj-runtimekit-exporter",
    "job-agent": "lj-runtimekit-job-agent",
}
ACCESS_KINDS = {
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}


def access_objects() -> list[Obj]:
    """The access objects of every component folder, and the controller's Deployment (its
    policy's parameter) scaled to zero so that no controller runs."""
    objs: list[Obj] = []
    for folder in FOLDERS.values():
        for o in load_objects(manifest_files(folder)):
            if o["kind"] in ACCESS_KINDS:
                objs.append(o)
            elif o["kind"] == "Deployment" and o["metadata"]["name"] == ACCOUNTS["controller"]:
                objs.append({**o, "spec": {**o["spec"], "replicas": 0}})
    return objs


def job_image() -> str:
    """The job-agent image the controller's Deployment names with --job-image."""
    for o in access_objects():
        if o["kind"] == "Deployment":
            for c in o["spec"]["template"]["spec"]["containers"]:
                for a in c.get("args", []):
                    if a.startswith("--job-image="):
                        return str(a.removeprefix("--job-image="))
    raise AssertionError("the controller's Deployment names no --job-image")


@dataclass
class Reply:
    status: int
    body: dict[str, Any]

    @property
    def message(self) -> str:
        return str(self.body.get("message", ""))


class Caller:
    """Raw requests with one bearer token: each reply's status and body, never an exception."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api

    def __call__(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        patch: str = "merge",
        query: list[tuple[str, Any]] | None = None,
    ) -> Reply:
        content = {
            "merge": "application/merge-patch+json",
            "json": "application/json-patch+json",
            "strategic": "application/strategic-merge-patch+json",
        }[patch]
        headers = {
            "Accept": "application/json",
            "Content-Type": content if method == "PATCH" else "application/json",
        }
        params = self.api.param_serialize(
            method=method,
            resource_path=path,
            query_params=query or [],
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        resp = self.api.call_api(*params, _request_timeout=30)
        status, raw = resp.status, resp.read()  # type: ignore[no-untyped-call]
        text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
        try:
            data = json.loads(text) if text.strip() else {}
        except ValueError:
            data = {"message": text[:500]}
        return Reply(int(status), data if isinstance(data, dict) else {"items": data})


def caller_with(admin: client.ApiClient, token: str) -> Caller:
    """A caller of ``admin``'s apiserver with ``token`` as its bearer token."""
    cfg = client.Configuration()
    cfg.host = admin.configuration.host
    cfg.ssl_ca_cert = admin.configuration.ssl_ca_cert
    cfg.api_key = {"authorization": f"Bearer {token}"}
    return Caller(client.ApiClient(cfg))


@dataclass
class Rig:
    """What the security tests act on."""

    cluster: Cluster
    admin: client.ApiClient
    own_node: str
    other_node: str
    victims: str
    """A namespace of another tenant's pods."""
    tokens: dict[str, str]
    """ServiceAccount tokens bound to a pod of that account on ``own_node``."""
    unbound_tokens: dict[str, str]
    """Tokens of the same accounts not bound to any pod (no node claim)."""
    job_image: str

    def caller(self, token: str) -> Caller:
        return caller_with(self.admin, token)

    def as_(self, component: str) -> Caller:
        return self.caller(self.tokens[component])

    @property
    def root(self) -> Caller:
        return Caller(self.admin)


def kubectl(cluster: Cluster, *args: str, stdin: str | None = None) -> str:
    out = subprocess.run(
        [str(tool_dir() / "kubectl"), f"--kubeconfig={cluster.kubeconfig}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, f"kubectl {' '.join(args)}: {out.stderr}"
    return out.stdout


def ok(reply: Reply, what: str) -> dict[str, Any]:
    """The body of a reply that must have succeeded."""
    assert 200 <= reply.status < 300, f"{what}: {reply.status} {reply.message}"
    return reply.body


def eventually(what: str, check: Callable[[], bool], deadline_s: float = 60.0) -> None:
    deadline = time.monotonic() + deadline_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {deadline_s:.0f} s")
        time.sleep(0.5)


def pod_body(name: str, node: str | None, **spec: Any) -> Obj:
    body: Obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "containers": [{"name": "main", "image": "busybox"}],
            "restartPolicy": "Never",
            "tolerations": [{"operator": "Exists"}],
            **spec,
        },
    }
    if node:
        body["spec"]["nodeName"] = node
    return body


def token_for(root: Caller, account: str, pod: Obj | None) -> str:
    """A TokenRequest for ``account``, bound to ``pod`` when given (as the kubelet asks for the
    token it mounts: the apiserver then adds the pod's node name to the token)."""
    spec: dict[str, Any] = {"audiences": [], "expirationSeconds": 3600}
    if pod is not None:
        meta = pod["metadata"]
        spec["boundObjectRef"] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": meta["name"],
            "uid": meta["uid"],
        }
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
    path = f"/api/v1/namespaces/{NS}/serviceaccounts/{account}/token"
    return str(ok(root("POST", path, body), f"token of {account}")["status"]["token"])


@pytest.fixture(scope="module")
def rig(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    objs = access_objects()
    crds = sorted((DEPLOY / "crds").glob("*.yaml"))
    kubectl(cluster, "apply", "--server-side", "--force-conflicts", *(f"-f={p}" for p in crds))
    # A policy naming a resource of a CRD that is not served yet (an earlier test's `undeploy
    # --purge` removed it) is not in force until the apiserver's policies refresh: apply the
    # policies only once the CRDs are served.
    kubectl(cluster, "wait", "--for=condition=Established", "--timeout=60s",
            *(f"-f={p}" for p in crds))  # fmt: skip
    kubectl(
        cluster,
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        "-",
        stdin=yaml.safe_dump_all(objs),
    )
    own, other = cluster.create_gpu_nodes(2, prefix="sec", enable=True)
    admin = cluster.api_client()
    core = client.CoreV1Api(admin)
    run = uuid.uuid4().hex[:6]
    victims = f"sec-victims-{run}"
    root = Caller(admin)
    ok(root("POST", "/api/v1/namespaces", {"metadata": {"name": victims}}), "victims' namespace")
    tokens, unbound, holders = {}, {}, []
    for component, account in ACCOUNTS.items():
        body = pod_body(f"sec-{component}-{run}", own, serviceAccountName=account)
        if component == "job-agent":
            body["spec"]["automountServiceAccountToken"] = False
        pod = ok(root("POST", f"/api/v1/namespaces/{NS}/pods", body), f"{component} pod")
        holders.append(pod["metadata"]["name"])
        tokens[component] = token_for(root, account, pod)
        unbound[component] = token_for(root, account, None)
    r = Rig(cluster, admin, own, other, victims, tokens, unbound, job_image())

    # Policies take effect once the apiserver has loaded them (and the controller's parameter).
    # Every probe is a real change: a new label value, a new Lease name. A probe the apiserver
    # let through before the policies were in force has written its label or made its Lease,
    # and the same request again would be a no-op label patch (which the device plugin's policy
    # rightly allows) or a 409: the policy's refusal would never be seen (CI lost 270 s and the
    # whole module that way).
    probes = iter(range(1_000_000))

    def in_force() -> bool:
        n = next(probes)
        return bool(
            "may only change its own labels"
            in r.as_("device-plugin")(
                "PATCH",
                f"/api/v1/nodes/{own}",
                {"metadata": {"labels": {"sec-test/probe": f"p{n}"}}},
            ).message
            and "the controller may only create and renew its own Lease"
            in r.as_("controller")(
                "POST",
                f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases",
                {"metadata": {"name": f"probe-{run}-c{n}"}, "spec": {}},
            ).message
            and "may only create and renew its own Lease lj-runtimekit-scheduler"
            in r.as_("scheduler")(
                "POST",
                f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases",
                {"metadata": {"name": f"probe-{run}-s{n}"}, "spec": {}},
            ).message
        )

    try:  # what the setup made goes, even when the policies never came into force
        eventually("the admission policies in force", in_force, deadline_s=180.0)
        yield r
    finally:
        leases = client.CoordinationV1Api(admin)
        for lease in leases.list_namespaced_lease(NS).items:
            name = (lease.metadata.name if lease.metadata else None) or ""
            if name.startswith(f"probe-{run}-"):  # probes let through
                leases.delete_namespaced_lease(name, NS)
        for name in holders:
            core.delete_namespaced_pod(name, NS, grace_period_seconds=0)
        core.delete_namespace(victims)
        for o in reversed(objs):
            kind = o["kind"].lower()
            ns = o["metadata"].get("namespace")
            kubectl(
                cluster,
                "delete",
                kind,
                o["metadata"]["name"],
                *([f"-n={ns}"] if ns else []),
                "--ignore-not-found",
                "--wait=false",
            )
        for node in (own, other):
            core.delete_node(node)
        # The CRDs too: the worker's cluster is shared with the next test file.
        kubectl(cluster, "delete", "--ignore-not-found", "--wait=false", *(f"-f={p}" for p in crds))
        admin.close()  # type: ignore[no-untyped-call]
