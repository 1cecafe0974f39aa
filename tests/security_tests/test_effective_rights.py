"""What each ServiceAccount's token may really do, asked of the real apiserver with that token,
equals effective_rights.yaml exactly (issue 34 §1, docs/security.md "Exact rights").

test_least_privilege.py proves escapes are refused one attack at a time; this proves there is
nothing left to attack: a right an account gains later (a verb added to a role, a new binding)
fails here, and so does one it loses. Two views, both with the account's own token:

- SelfSubjectRulesReview in the suite's namespace, in ``default`` and in another tenant's
  namespace: the rules RBAC holds for the token there (complete for these accounts);
- SelfSubjectAccessReview at cluster scope for every resource and verb discovery serves (and
  the verbs RBAC knows beyond discovery's), and for each object a right names: the decisions of
  every authorizer the apiserver runs, not only of RBAC's rule list.

Its own module rig: the ServiceAccounts and RBAC of deploy/ (the four components, the job agent
and the operator; no admission policies, which decide nothing here), the suite's CRDs (so that
discovery serves them), a pod per account on a KWOK node to bind each token to, and one account
bound to nothing, which holds only the apiserver's defaults. All removed at the end.
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
import yaml

from lj_runtimekit_testkit.cluster.handle import Cluster
from lj_runtimekit_testkit.manifests import DEPLOY, FOLDERS, Obj, load_objects, manifest_files

from .conftest import NS, Caller, caller_with, kubectl, ok, pod_body, token_for
from .rights import Right, UrlRight, from_review, load, rights, url_rights

pytestmark = pytest.mark.cluster

ALLOW = load()
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
REVIEWS = "/apis/authorization.k8s.io/v1"
#: Verbs RBAC checks that discovery does not list, by (group, resource) — served or not.
SPECIAL_VERBS: dict[tuple[str, str], tuple[str, ...]] = {
    ("rbac.authorization.k8s.io", "roles"): ("bind", "escalate"),
    ("rbac.authorization.k8s.io", "clusterroles"): ("bind", "escalate"),
    ("", "serviceaccounts"): ("impersonate",),
    ("", "users"): ("impersonate",),
    ("", "groups"): ("impersonate",),
    ("authentication.k8s.io", "uids"): ("impersonate",),
    ("authentication.k8s.io", "userextras/scopes"): ("impersonate",),
    ("certificates.k8s.io", "signers"): ("approve", "sign", "attest"),
}


@dataclass(frozen=True)
class Served:
    group: str
    resource: str
    """With its subresource: ``pods/exec``."""
    namespaced: bool
    verbs: frozenset[str]


@dataclass
class Tokens:
    root: Caller
    callers: dict[str, Caller]
    """Account name → a caller with its token, bound to a pod of that account on a node."""
    nobody: Caller
    """An account of the suite's namespace bound to no role."""
    other: str
    """A namespace of another tenant."""
    served: list[Served]


def _access_objects() -> list[Obj]:
    folders = [*FOLDERS.values(), "operator"]
    return [o for f in folders for o in load_objects(manifest_files(f)) if o["kind"] in RBAC_KINDS]


def _discovery(root: Caller) -> list[Served]:
    """Every resource and subresource the apiserver serves, over all groups and versions."""
    paths = ["/api/v1"]
    for g in ok(root("GET", "/apis"), "API groups")["groups"]:
        paths += [f"/apis/{v['groupVersion']}" for v in g["versions"]]
    out: dict[tuple[str, str], Served] = {}
    for path in paths:
        group = "" if path == "/api/v1" else path.split("/")[2]
        for r in ok(root("GET", path), path)["resources"]:
            key = (group, r["name"])
            verbs = frozenset(r.get("verbs") or []) | (out[key].verbs if key in out else set())
            out[key] = Served(group, r["name"], bool(r["namespaced"]), verbs)
    return list(out.values())


@pytest.fixture(scope="module")
def tokens(cluster: Cluster) -> Iterator[Tokens]:
    crds = sorted((DEPLOY / "crds").glob("*.yaml"))
    kubectl(cluster, "apply", "--server-side", "--force-conflicts", *(f"-f={p}" for p in crds))
    kubectl(cluster, "wait", "--for=condition=Established", "--timeout=60s",
            *(f"-f={p}" for p in crds))  # fmt: skip
    objs = _access_objects()
    run = uuid.uuid4().hex[:6]
    nobody = f"lj-rights-nobody-{run}"
    objs.append(
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": nobody, "namespace": NS},
        }
    )
    kubectl(cluster, "apply", "--server-side", "--force-conflicts", "-f", "-",
            stdin=yaml.safe_dump_all(objs))  # fmt: skip
    admin = cluster.api_client()
    root = Caller(admin)
    other = f"rights-other-{run}"
    (node,) = cluster.create_gpu_nodes(1, prefix=f"rights-{run}")
    holders: list[str] = []
    try:
        ok(root("POST", "/api/v1/namespaces", {"metadata": {"name": other}}), "tenant namespace")
        bound: dict[str, Caller] = {}
        for account in [*ALLOW.accounts, nobody]:
            name = f"rights-{account.removeprefix('lj-')}-{run}"
            body = pod_body(
                name, node, serviceAccountName=account, automountServiceAccountToken=False
            )
            pod = ok(root("POST", f"/api/v1/namespaces/{NS}/pods", body), f"{account}'s pod")
            holders.append(pod["metadata"]["name"])
            bound[account] = caller_with(admin, token_for(root, account, pod))
        nobody_caller = bound.pop(nobody)
        yield Tokens(root, bound, nobody_caller, other, _discovery(root))
    finally:
        for name in holders:
            root("DELETE", f"/api/v1/namespaces/{NS}/pods/{name}", {"gracePeriodSeconds": 0})
        root("DELETE", f"/api/v1/namespaces/{other}")
        for o in reversed(objs):
            ns = o["metadata"].get("namespace")
            where = [f"-n={ns}"] if ns else []
            kubectl(cluster, "delete", o["kind"].lower(), o["metadata"]["name"], *where,
                    "--ignore-not-found", "--wait=false")  # fmt: skip
        root("DELETE", f"/api/v1/nodes/{node}")
        # The CRDs too: the worker's cluster is shared with the next test file.
        kubectl(cluster, "delete", "--ignore-not-found", "--wait=false", *(f"-f={p}" for p in crds))
        admin.close()  # type: ignore[no-untyped-call]


def _rules(caller: Caller, namespace: str) -> tuple[frozenset[Right], frozenset[UrlRight]]:
    """What a SelfSubjectRulesReview in ``namespace`` says the caller's token may do."""
    body = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectRulesReview",
        "spec": {"namespace": namespace},
    }
    status = ok(caller("POST", f"{REVIEWS}/selfsubjectrulesreviews", body), "rules review")[
        "status"
    ]
    assert status.get("incomplete") is False, status.get("evaluationError")
    return from_review(status)


def _settled(
    get: Callable[[], tuple[frozenset[Right], frozenset[UrlRight]]],
    want: frozenset[Right],
    deadline_s: float = 20.0,
) -> tuple[frozenset[Right], frozenset[UrlRight]]:
    """The review once it equals ``want``, or the last one after ``deadline_s``: RBAC's
    authorizer reads roles and bindings from its informers, a moment behind their creation."""
    deadline = time.monotonic() + deadline_s
    while True:
        got = get()
        if got[0] == want or time.monotonic() > deadline:
            return got
        time.sleep(0.5)


def _diff(want: frozenset[Right], got: frozenset[Right]) -> str:
    return (
        f"granted, not in effective_rights.yaml: {sorted(got - want)}; "
        f"in effective_rights.yaml, not granted: {sorted(want - got)}"
    )


Ask = tuple[str, str, str, str, str]
"""(group, resource, verb, namespace or "" for cluster scope, name or "" for any)."""


def _may(caller: Caller, ask: Ask) -> bool:
    """A SelfSubjectAccessReview: may the caller's token do that."""
    group, resource, verb, ns, name = ask
    base, _, sub = resource.partition("/")
    attributes = {"group": group, "resource": base, "subresource": sub, "verb": verb}
    attributes |= {"namespace": ns, "name": name}
    body = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": attributes},
    }
    got = ok(caller("POST", f"{REVIEWS}/selfsubjectaccessreviews", body), "access review")
    return bool(got["status"].get("allowed"))


def _at_cluster_scope(t: Tokens, caller: Caller, want: frozenset[Right]) -> list[str]:
    """Every served resource × verb (and every one ``want`` names) asked at cluster scope, and
    each object ``want`` names asked by name: what the apiserver's answers differ in."""
    asks: set[Ask] = set()
    for s in t.served:
        for verb in s.verbs | set(SPECIAL_VERBS.get((s.group, s.resource), ())):
            asks.add((s.group, s.resource, verb, "", ""))
    for (group, resource), verbs in SPECIAL_VERBS.items():
        asks |= {(group, resource, v, "", "") for v in verbs}
    namespaced = {(s.group, s.resource) for s in t.served if s.namespaced}
    for group, resource, verb, name in want:
        ns = NS if name and (group, resource) in namespaced else ""
        asks.add((group, resource, verb, ns, name))
    ordered = sorted(asks)
    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(lambda a: _may(caller, a), ordered))
    wrong = []
    for (group, resource, verb, ns, name), allowed in zip(ordered, answers, strict=True):
        listed = (group, resource, verb, name) in want
        if allowed != listed:
            where = f" {name!r} in {ns or 'cluster scope'}" if name else ""
            what = "allowed, not listed" if allowed else "listed, refused"
            wrong.append(f"{what}: {verb} {group or 'core'}/{resource}{where}")
    return wrong


@pytest.mark.parametrize(
    "account", list(ALLOW.accounts), ids=[a.id for a in ALLOW.accounts.values()]
)
def test_token_holds_exactly_its_listed_rights(tokens: Tokens, account: str) -> None:
    caller = tokens.callers[account]
    for ns in (NS, "default", tokens.other):
        want = ALLOW.expected(account, in_suite_namespace=ns == NS)
        got, urls = _settled(functools.partial(_rules, caller, ns), want)
        assert got == want, f"{account} in {ns}: {_diff(want, got)}"
        assert urls == ALLOW.default_url_rights, f"{account}: non-resource URLs {sorted(urls)}"
    wrong = _at_cluster_scope(tokens, caller, ALLOW.expected(account, in_suite_namespace=False))
    assert not wrong, f"{account} at cluster scope: {wrong}"


def test_an_account_bound_to_nothing_holds_exactly_the_apiservers_defaults(tokens: Tokens) -> None:
    """The defaults are the apiserver's, not the suite's: an account the suite never bound holds
    them all, and exactly them; they are the rules of the bootstrap roles named in the list,
    bound to the groups named there."""
    for ns in (NS, "default", tokens.other):
        got, urls = _rules(tokens.nobody, ns)
        assert got == ALLOW.default_rights, f"in {ns}: {_diff(ALLOW.default_rights, got)}"
        assert urls == ALLOW.default_url_rights, sorted(urls ^ ALLOW.default_url_rights)
    wrong = _at_cluster_scope(tokens, tokens.nobody, ALLOW.default_rights)
    assert not wrong, wrong
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    for d in ALLOW.defaults:
        role = ok(tokens.root("GET", f"{rbac}/clusterroles/{d.role}"), d.role)
        assert rights(role.get("rules") or []) == rights(d.rules), d.role
        assert url_rights(role.get("rules") or []) == url_rights(d.non_resource_rules), d.role
        binding = ok(tokens.root("GET", f"{rbac}/clusterrolebindings/{d.role}"), d.role)
        assert binding["roleRef"]["name"] == d.role
        assert {"kind": "Group", "name": d.bound_to} in [
            {"kind": s["kind"], "name": s["name"]} for s in binding["subjects"]
        ], binding["subjects"]
