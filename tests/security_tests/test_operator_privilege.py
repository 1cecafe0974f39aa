"""The operator's rights on the real control plane (docs/security.md, "The operator"): with a
token of its ServiceAccount bound to a pod, as the kubelet mounts it, everything the operator's
code does works (server-side apply of every object it renders, the rollout reads, its policy,
its Lease, the deletes), and every way out of the suite is refused: by RBAC (403) where a name,
kind or namespace says it, by its admission policy lj-runtimekit-operator-writes (422) where only
the object's content does.

Its own module rig: deploy/operator's access objects, one pod of its ServiceAccount on a KWOK
node, a RuntimeKitPolicy to own what it writes; all removed at the end, the CRDs too.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from kubernetes import client

from lj_runtimekit_operator import bundled, objects, render
from lj_runtimekit_operator import policy as policy_mod
from lj_runtimekit_testkit.cluster.handle import Cluster
from lj_runtimekit_testkit.manifests import DEPLOY, Obj, load_objects, manifest_files

from .conftest import NS, Caller, Reply, eventually, kubectl, ok, pod_body

pytestmark = pytest.mark.cluster

ACCOUNT = "lj-runtimekit-operator"
ACCESS_KINDS = {
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}
POLICIES = f"/apis/{policy_mod.GROUP}/{policy_mod.VERSION}/{policy_mod.PLURAL}"
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases"
#: nodeSelector of every workload written here: no node has it, so nothing is scheduled.
NOWHERE = {"lj-test/operator-privilege": "nowhere"}


class Operator(Caller):
    """The operator's token; adds its one write, server-side apply as kube.py does it."""

    def apply(self, obj: Obj, *, dry_run: bool = True) -> Reply:
        meta = obj["metadata"]
        path = objects.resource(obj).path(meta.get("namespace", ""), meta["name"])
        query = [("fieldManager", policy_mod.FIELD_MANAGER), ("force", "true")]
        if dry_run:
            query.append(("dryRun", "All"))
        params = self.api.param_serialize(
            method="PATCH",
            resource_path=path,
            query_params=query,
            header_params={
                "Accept": "application/json",
                "Content-Type": "application/apply-patch+yaml",
            },
            body=obj,
            auth_settings=["BearerToken"],
        )
        resp = self.api.call_api(*params, _request_timeout=30)
        raw = resp.read()  # type: ignore[no-untyped-call]
        body = yaml.safe_load(raw) if raw else {}
        return Reply(int(resp.status), body if isinstance(body, dict) else {})


@dataclass
class OperatorRig:
    cluster: Cluster
    root: Caller
    operator: Operator
    policy: Obj
    """The RuntimeKitPolicy (as the apiserver returned it) that owns what the tests write."""
    suite: list[Obj]
    """Every object the operator renders for that policy, in apply order."""
    victims: str
    node: str = ""
    """A KWOK node whose keys a deleted policy takes off (docs/operator.md, "Delete")."""

    def find(self, kind: str, name: str) -> Obj:
        """A deep copy of one rendered object, to bend into an escape."""
        for o in self.suite:
            if o["kind"] == kind and o["metadata"]["name"] == name:
                return copy.deepcopy(o)
        raise AssertionError(f"the operator renders no {kind} {name}")


def access_objects() -> list[Obj]:
    return [o for o in load_objects(manifest_files("operator")) if o["kind"] in ACCESS_KINDS]


def rendered(policy: Obj) -> list[Obj]:
    bundle = bundled.load()
    parsed = policy_mod.parse(policy, bundle.registry, bundle.version)
    out: list[Obj] = []
    for name in [policy_mod.COMMON, *(c.name for c in policy_mod.COMPONENTS)]:
        out += render.render(parsed, name, bundle.objects[name])
    out.sort(key=lambda o: objects.ORDER[o["kind"]])
    return out


def bound_token(root: Caller, pod: Obj) -> str:
    """A TokenRequest bound to ``pod``, as the kubelet asks for the token it mounts."""
    meta = pod["metadata"]
    ref = {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}
    body = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"audiences": [], "expirationSeconds": 3600, "boundObjectRef": ref},
    }
    path = f"/api/v1/namespaces/{NS}/serviceaccounts/{ACCOUNT}/token"
    return str(ok(root("POST", path, body), "the operator's token")["status"]["token"])


def _delete_labelled(root: Caller, policy: str) -> None:
    for res in reversed(objects.RESOURCES):
        found = root("GET", res.path(), query=[("labelSelector", render.selector(policy))])
        for item in found.body.get("items") or []:
            meta = item["metadata"]
            root("DELETE", res.path(meta.get("namespace", ""), meta["name"]))


@pytest.fixture(scope="module")
def op(cluster: Cluster) -> Iterator[OperatorRig]:
    crds = sorted((DEPLOY / "crds").glob("*.yaml"))
    kubectl(cluster, "apply", "--server-side", "--force-conflicts", *(f"-f={p}" for p in crds))
    kubectl(cluster, "wait", "--for=condition=Established", "--timeout=60s",
            *(f"-f={p}" for p in crds))  # fmt: skip
    access = access_objects()
    kubectl(cluster, "apply", "--server-side", "--force-conflicts", "-f", "-",
            stdin=yaml.safe_dump_all(access))  # fmt: skip
    admin = cluster.api_client()
    root = Caller(admin)
    # The session's cluster may hold a RuntimeClass lj-runtime an earlier module made without the
    # suite's labels; the operator's policy rightly refuses to take over an object that is not
    # the suite's (CI: 422 on it). Start from none, as a cluster the operator installs on.
    root("DELETE", "/apis/node.k8s.io/v1/runtimeclasses/lj-runtime")
    run = uuid.uuid4().hex[:6]
    (node,) = cluster.create_gpu_nodes(1, prefix=f"secop-{run}")
    victims = f"secop-victims-{run}"
    ok(root("POST", "/api/v1/namespaces", {"metadata": {"name": victims}}), "victims' namespace")
    spec = {
        "namespace": NS,
        "components": {c.key: {"nodeSelector": NOWHERE} for c in policy_mod.COMPONENTS},
    }
    body = {
        "apiVersion": policy_mod.API_VERSION,
        "kind": policy_mod.KIND,
        "metadata": {"name": f"secop-{run}"},
        "spec": spec,
    }
    policy = ok(root("POST", POLICIES, body), "the policy")
    holder = ok(
        root(
            "POST",
            f"/api/v1/namespaces/{NS}/pods",
            pod_body(f"secop-{run}", node, serviceAccountName=ACCOUNT),
        ),
        "the operator's pod",
    )
    cfg = client.Configuration()
    cfg.host = admin.configuration.host
    cfg.ssl_ca_cert = admin.configuration.ssl_ca_cert
    cfg.api_key = {"authorization": f"Bearer {bound_token(root, holder)}"}
    operator = Operator(client.ApiClient(cfg))
    rig = OperatorRig(cluster, root, operator, policy, rendered(policy), victims, node)
    unlabelled = rig.find("ConfigMap", "lj-runtimekit-exporter")
    del unlabelled["metadata"]["labels"]["app.kubernetes.io/part-of"]

    def in_force() -> bool:
        return "app.kubernetes.io/part-of=lj-runtimekit" in operator.apply(unlabelled).message

    try:
        eventually("the operator's admission policy in force", in_force, deadline_s=120.0)
        yield rig
    finally:
        _delete_labelled(root, policy["metadata"]["name"])
        root("DELETE", f"{POLICIES}/{policy['metadata']['name']}")
        root("DELETE", f"{LEASES}/{ACCOUNT}")
        root("DELETE", f"/api/v1/namespaces/{NS}/pods/{holder['metadata']['name']}")
        root("DELETE", f"/api/v1/namespaces/{victims}")
        for o in reversed(access):
            ns = o["metadata"].get("namespace")
            where = [f"-n={ns}"] if ns else []
            kubectl(cluster, "delete", o["kind"].lower(), o["metadata"]["name"], *where,
                    "--ignore-not-found", "--wait=false")  # fmt: skip
        root("DELETE", f"/api/v1/nodes/{node}")
        # The CRDs too: the worker's cluster is shared with the next test file.
        kubectl(cluster, "delete", "--ignore-not-found", "--wait=false", *(f"-f={p}" for p in crds))
        admin.close()  # type: ignore[no-untyped-call]


def test_the_operator_installs_watches_and_removes_the_whole_suite_with_its_own_token(
    op: OperatorRig,
) -> None:
    me = op.operator
    name = op.policy["metadata"]["name"]
    for obj in op.suite:
        got = me.apply(obj, dry_run=False)
        assert got.status in (200, 201), (objects.key(obj), got.status, got.message)
    # A second apply of the same objects is an UPDATE of each: allowed too.
    for obj in op.suite:
        got = me.apply(obj, dry_run=False)
        assert got.status == 200, (objects.key(obj), got.status, got.message)
    # What a reconcile reads: the policies, every kind by label in every namespace, the workloads
    # and their pods.
    ok(me("GET", POLICIES), "list policies")
    ok(me("GET", POLICIES, query=[("watch", "1"), ("timeoutSeconds", "1")]), "watch policies")
    for res in objects.RESOURCES:
        found = ok(
            me("GET", res.path(), query=[("labelSelector", render.selector(name))]),
            f"list {res.plural}",
        )
        want = {objects.key(o) for o in op.suite if o["kind"] == res.kind}
        got_keys = {objects.key({**i, "kind": res.kind}) for i in found["items"]}
        assert got_keys == want, res.kind
    for c in policy_mod.COMPONENTS:
        for workload in c.workloads:
            ok(me("GET", objects.BY_KIND[c.kind].path(NS, workload)), f"get {workload}")
    ok(me("GET", f"/api/v1/namespaces/{NS}/pods", query=[("labelSelector", "app=x")]), "pods")
    # Its policy: the finalizer and the status.
    fin = {"metadata": {"finalizers": [policy_mod.FINALIZER]}}
    ok(me("PATCH", f"{POLICIES}/{name}", fin), "the finalizer")
    ok(me("PATCH", f"{POLICIES}/{name}/status", {"status": {"namespace": NS}}), "the status")
    ok(me("PATCH", f"{POLICIES}/{name}", {"metadata": {"finalizers": []}}), "no finalizer")
    # Its Lease.
    lease = {"metadata": {"name": ACCOUNT}, "spec": {"holderIdentity": "secop"}}
    ok(me("POST", LEASES, lease), "create its Lease")
    held = ok(me("GET", f"{LEASES}/{ACCOUNT}"), "get its Lease")
    held["spec"]["leaseDurationSeconds"] = 15
    ok(me("PUT", f"{LEASES}/{ACCOUNT}", held), "renew its Lease")
    # The policy deleted: it takes the suite's keys off the nodes, waits for and removes the
    # controller's agent Jobs, the NodeDevices, posts an Event (docs/operator.md, "Delete").
    suite_keys = {
        "labels": {"lj_runtimekit_enable": "true", "lj-runtimekit.aliyun.com/count": "8"},
        "annotations": {"lj-runtimekit-controller/last-action-status": "{}"},
    }
    ok(op.root("PATCH", f"/api/v1/nodes/{op.node}", {"metadata": suite_keys}), "suite keys")
    ok(me("GET", "/api/v1/nodes"), "list nodes")
    off = {part: dict.fromkeys(keys) for part, keys in suite_keys.items()}
    ok(me("PATCH", f"/api/v1/nodes/{op.node}", {"metadata": off}), "the suite's keys off")
    ok(me("GET", f"/apis/batch/v1/namespaces/{NS}/jobs"), "list agent Jobs")
    ok(me("GET", "/apis/lj-runtimekit.aliyun.com/v1/nodedevices"), "list NodeDevices")
    event = {
        "metadata": {"generateName": "secop.", "namespace": "default"},
        "involvedObject": {"apiVersion": policy_mod.API_VERSION, "kind": policy_mod.KIND,
                           "name": name, "uid": op.policy["metadata"]["uid"]},
        "type": "Warning",
        "reason": "NodesNotDisabled",
        "message": "x",
    }  # fmt: skip
    ok(me("POST", "/api/v1/namespaces/default/events", event, query=DRY), "an Event")
    for obj in reversed(op.suite):
        meta = obj["metadata"]
        path = objects.resource(obj).path(meta.get("namespace", ""), meta["name"])
        got = me("DELETE", path, {"propagationPolicy": "Background"})
        assert got.status in (200, 202), (objects.key(obj), got.status, got.message)


# --- escapes: (what, how it is tried) → the refusal -------------------------------------------

Attempt = Callable[[OperatorRig], Reply]


def _daemonset(op: OperatorRig, bend: Callable[[Obj], None]) -> Reply:
    ds = op.find("DaemonSet", "lj-runtimekit-exporter")
    bend(ds["spec"]["template"]["spec"])
    return op.operator.apply(ds)


def _device_class(op: OperatorRig, bend: Callable[[Obj], None]) -> Reply:
    dc = op.find("DeviceClass", "gpu.lj-runtimekit.aliyun.com")
    bend(dc["spec"])
    return op.operator.apply(dc)


def _selector(expression: str) -> Callable[[Obj], None]:
    return lambda spec: spec.update(selectors=[{"cel": {"expression": expression}}])


OURS = 'device.driver == "lj-runtimekit.aliyun.com"'


def _bent(ds: Obj, bend: Callable[[Obj], None]) -> Obj:
    bend(ds["spec"]["template"]["spec"])
    return ds


def _container(pod: Obj) -> Obj:
    c: Obj = pod["containers"][0]
    return c


def _cluster_role(op: OperatorRig, rules: list[Obj], **extra: Any) -> Reply:
    role = op.find("ClusterRole", "lj-runtimekit-exporter")
    role["rules"] = rules
    role.update(extra)
    return op.operator.apply(role)


def _binding(op: OperatorRig, bend: Callable[[Obj], None]) -> Reply:
    crb = op.find("ClusterRoleBinding", "lj-runtimekit-exporter")
    bend(crb)
    return op.operator.apply(crb)


def _write_in(op: OperatorRig, namespace: str) -> Reply:
    dep = op.find("Deployment", "lj-runtimekit-controller")
    dep["metadata"]["namespace"] = namespace
    dep["metadata"].pop("ownerReferences", None)
    return op.operator.apply(dep)


def _renamed(op: OperatorRig, kind: str, name: str, new: str) -> Reply:
    obj = op.find(kind, name)
    obj["metadata"]["name"] = new
    return op.operator.apply(obj)


def _runtime_class(op: OperatorRig) -> Reply:
    # A handler cannot change once set: the attempt is a create (the one the suite test made is
    # gone at its end; gone here too, should that test have stopped half-way).
    path = objects.BY_KIND["RuntimeClass"].path(name="lj-runtime")
    if op.root("GET", path).status == 200:
        ok(op.root("DELETE", path), "the RuntimeClass of an earlier test")
    rc = op.find("RuntimeClass", "lj-runtime")
    rc["handler"] = "runc"
    return op.operator.apply(rc)


DRY = [("dryRun", "All")]


def _node(op: OperatorRig, meta: Obj) -> Reply:
    return op.operator("PATCH", f"/api/v1/nodes/{op.node}", {"metadata": meta}, query=DRY)


def _job_deleted(op: OperatorRig) -> Reply:
    """A Job of the suite's namespace that is not one of the controller's agent Jobs."""
    name = f"secop-job-{uuid.uuid4().hex[:6]}"
    pod = {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}
    job = {"metadata": {"name": name}, "spec": {"suspend": True, "template": {"spec": pod}}}
    path = f"/apis/batch/v1/namespaces/{NS}/jobs"
    ok(op.root("POST", path, job), "a Job")
    try:
        return op.operator("DELETE", f"{path}/{name}", query=DRY)
    finally:
        op.root("DELETE", f"{path}/{name}")


REFUSED: dict[str, tuple[Attempt, int, str]] = {
    # Reads it has no business with.
    "secret-in-kube-system": (
        lambda op: op.operator("GET", f"/api/v1/namespaces/{NS}/secrets"),
        403,
        "secrets",
    ),
    "secret-elsewhere": (
        lambda op: op.operator("GET", "/api/v1/secrets"),
        403,
        "secrets",
    ),
    "token-of-a-component": (
        lambda op: op.operator(
            "POST",
            f"/api/v1/namespaces/{NS}/serviceaccounts/lj-runtimekit-controller/token",
            {"spec": {"audiences": []}},
            query=DRY,
        ),
        403,
        "serviceaccounts/token",
    ),
    # Nodes, pods: the controller's and the kubelet's business.
    # It may take the suite's keys off a node (a deleted policy); its status never.
    "node-status-write": (
        lambda op: op.operator(
            "PATCH", f"/api/v1/nodes/{op.node}/status", {"status": {"capacity": {}}}, query=DRY
        ),
        403,
        "nodes/status",
    ),
    "pod-create": (
        lambda op: op.operator(
            "POST", f"/api/v1/namespaces/{NS}/pods", pod_body("secop-escape", None), query=DRY
        ),
        403,
        "pods",
    ),
    "crd-create": (
        lambda op: op.operator(
            "POST",
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            load_objects([DEPLOY / "crds" / "nodedevices.lj-runtimekit.aliyun.com.yaml"])[0],
            query=DRY,
        ),
        403,
        "customresourcedefinitions",
    ),
    # Names, kinds and namespaces RBAC knows: 403.
    "daemonset-of-another-name": (
        lambda op: _renamed(op, "DaemonSet", "lj-runtimekit-exporter", "lj-runtimekit-miner"),
        403,
        "daemonsets",
    ),
    "device-class-of-another-name": (
        lambda op: _renamed(op, "DeviceClass", "gpu.lj-runtimekit.aliyun.com", "gpu.nvidia.com"),
        403,
        "deviceclasses",
    ),
    "cluster-admin-for-itself": (
        lambda op: op.operator(
            "POST",
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            {
                "metadata": {"name": "secop-escape"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "cluster-admin",
                },
                "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": NS}],
            },
            query=DRY,
        ),
        403,
        "clusterrolebindings",
    ),
    "cluster-admin-under-a-suite-name": (
        lambda op: _binding(op, lambda b: b["roleRef"].update(name="cluster-admin")),
        403,
        "attempting to grant RBAC permissions not currently held",
    ),
    "workload-in-another-namespace": (
        lambda op: _write_in(op, op.victims),
        403,
        "deployments",
    ),
    "its-own-role": (
        lambda op: _renamed(op, "ClusterRole", "lj-runtimekit-exporter", ACCOUNT),
        403,
        "clusterroles",
    ),
    "its-own-admission-policy-deleted": (
        lambda op: op.operator(
            "DELETE",
            "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/"
            "lj-runtimekit-operator-writes",
            query=DRY,
        ),
        403,
        "validatingadmissionpolicies",
    ),
    # Content only the admission policy sees: 422.
    "unlabelled-configmap": (
        lambda op: op.operator.apply(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "lj-runtimekit-scheduler", "namespace": NS},
                "data": {"x": "y"},
            }
        ),
        422,
        "app.kubernetes.io/part-of=lj-runtimekit",
    ),
    "privileged-pod": (
        lambda op: _daemonset(
            op,
            lambda p: _container(p)["securityContext"].update(
                privileged=True, allowPrivilegeEscalation=True
            ),
        ),
        422,
        "no privileged container",
    ),
    "added-capability": (
        lambda op: _daemonset(
            op,
            lambda p: _container(p)["securityContext"].update(capabilities={"add": ["SYS_ADMIN"]}),
        ),
        422,
        "adds no capability",
    ),
    "another-image": (
        lambda op: _daemonset(op, lambda p: _container(p).update(image="busybox:1.36")),
        422,
        "lj-runtimekit-* images only",
    ),
    "containerd-config-mounted": (
        lambda op: _daemonset(
            op,
            lambda p: p["volumes"].append(
                {"name": "containerd", "hostPath": {"path": "/etc/containerd"}}
            ),
        ),
        422,
        "mounts of the node only",
    ),
    "host-root-mounted": (
        lambda op: _daemonset(
            op, lambda p: p["volumes"].append({"name": "root", "hostPath": {"path": "/"}})
        ),
        422,
        "mounts of the node only",
    ),
    "dra-plugin-mounts-the-kubelets-state": (
        lambda op: op.operator.apply(
            _bent(
                op.find("DaemonSet", "lj-runtimekit-dra-plugin"),
                lambda p: p["volumes"].append(
                    {"name": "kubelet", "hostPath": {"path": "/var/lib/kubelet"}}
                ),
            )
        ),
        422,
        "mounts of the node only",
    ),
    "device-class-of-another-driver": (
        lambda op: _device_class(op, _selector('device.driver == "gpu.nvidia.com"')),
        422,
        "lj-runtimekit.aliyun.com driver",
    ),
    "device-class-undoing-its-driver": (
        lambda op: _device_class(op, _selector(f"{OURS} || true")),
        422,
        "lj-runtimekit.aliyun.com driver",
    ),
    "device-class-of-every-device": (
        lambda op: _device_class(op, lambda spec: spec.pop("selectors")),
        422,
        "lj-runtimekit.aliyun.com driver",
    ),
    "device-class-configuring-another-driver": (
        lambda op: _device_class(
            op,
            lambda spec: spec.update(
                config=[{"opaque": {"driver": "gpu.nvidia.com", "parameters": {"a": "b"}}}]
            ),
        ),
        422,
        "configures that driver only",
    ),
    "device-class-for-another-resource": (
        lambda op: _device_class(
            op, lambda spec: spec.update(extendedResourceName="nvidia.com/gpu")
        ),
        422,
        "the suite's extended resources",
    ),
    "host-pid": (
        lambda op: _daemonset(op, lambda p: p.update(hostPID=True)),
        422,
        "without host PID or IPC",
    ),
    "runs-as-the-operator": (
        lambda op: _daemonset(op, lambda p: p.update(serviceAccountName=ACCOUNT)),
        422,
        "not the operator's",
    ),
    "secrets-in-a-suite-role": (
        lambda op: _cluster_role(
            op, [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]
        ),
        422,
        "no Secrets",
    ),
    "wildcard-in-a-suite-role": (
        lambda op: _cluster_role(op, [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]),
        422,
        "no wildcard",
    ),
    "aggregated-suite-role": (
        lambda op: _cluster_role(
            op,
            [],
            aggregationRule={"clusterRoleSelectors": [{"matchLabels": {"x": "y"}}]},
        ),
        422,
        "aggregates nothing",
    ),
    "suite-role-bound-to-the-operator": (
        lambda op: _binding(
            op,
            lambda b: b.update(
                subjects=[{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": NS}]
            ),
        ),
        422,
        "never to the operator",
    ),
    "suite-role-bound-to-another-namespace": (
        lambda op: _binding(
            op,
            lambda b: b.update(
                subjects=[
                    {
                        "kind": "ServiceAccount",
                        "name": "lj-runtimekit-exporter",
                        "namespace": op.victims,
                    }
                ]
            ),
        ),
        422,
        "in the operator's namespace only",
    ),
    "suite-role-bound-to-a-user": (
        lambda op: _binding(
            op,
            lambda b: b.update(
                subjects=[
                    {"kind": "User", "name": "mallory", "apiGroup": "rbac.authorization.k8s.io"}
                ]
            ),
        ),
        422,
        "suite's ServiceAccounts",
    ),
    "runtime-class-to-another-handler": (_runtime_class, 422, "lj-runtime handler"),
    # A deleted policy may only take the suite's keys off a node, and delete agent Jobs.
    "node-label-added": (
        lambda op: _node(op, {"labels": {"lj-runtimekit.aliyun.com/count": "99"}}),
        422,
        "take the suite's keys off a node",
    ),
    "node-other-label-removed": (
        lambda op: _node(op, {"labels": {"kubernetes.io/hostname": None}}),
        422,
        "take the suite's keys off a node",
    ),
    "node-cordoned": (
        lambda op: op.operator(
            "PATCH", f"/api/v1/nodes/{op.node}", {"spec": {"unschedulable": True}}, query=DRY
        ),
        422,
        "take the suite's keys off a node",
    ),
    "job-not-an-agents": (_job_deleted, 422, "agent Jobs"),
}


@pytest.mark.parametrize("case", list(REFUSED), ids=list(REFUSED))
def test_an_escape_of_the_operator_is_refused(op: OperatorRig, case: str) -> None:
    attempt, status, says = REFUSED[case]
    got = attempt(op)
    assert got.status == status, (got.status, got.message)
    assert says in got.message, got.message
