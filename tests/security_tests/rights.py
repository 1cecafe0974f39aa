"""The allow-list of effective rights (effective_rights.yaml) as data: every right one
(group, resource, verb, name) at a time, the rights RBAC manifests and the apiserver's reviews
grant in the same shape, and the block of docs/security.md rendered from the list.

and the summary table of docs/deploy.md ("What each component may do") rendered from the same list.

Run as a script, it rewrites both blocks: ``python tests/security_tests/rights.py``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
ALLOW_LIST = HERE / "effective_rights.yaml"
DOC = HERE.parents[1] / "docs" / "security.md"
BEGIN = "<!-- BEGIN exact-rights: rendered from tests/security_tests/effective_rights.yaml -->"
END = "<!-- END exact-rights -->"
DEPLOY_DOC = HERE.parents[1] / "docs" / "deploy.md"
SUMMARY_BEGIN = (
    "<!-- BEGIN rights-summary: rendered from tests/security_tests/effective_rights.yaml -->"
)
SUMMARY_END = "<!-- END rights-summary -->"
READ_VERBS = ("get", "list", "watch")

Right = tuple[str, str, str, str]
"""(API group, resource with its subresource, verb, object name or "" for any)."""
UrlRight = tuple[str, str]
"""(non-resource URL, verb)."""


def rights(rules: Iterable[Mapping[str, Any]]) -> frozenset[Right]:
    """Every right the RBAC-shaped ``rules`` grant (apiGroups × resources × verbs × names)."""
    out: set[Right] = set()
    for r in rules:
        names = list(r.get("resourceNames") or []) or [""]
        for group in r.get("apiGroups") or []:
            for resource in r.get("resources") or []:
                for verb in r["verbs"]:
                    out.update((group, resource, verb, n) for n in names)
    return frozenset(out)


def url_rights(rules: Iterable[Mapping[str, Any]]) -> frozenset[UrlRight]:
    return frozenset(
        (url, verb) for r in rules for url in r.get("nonResourceURLs") or [] for verb in r["verbs"]
    )


@dataclass(frozen=True)
class Default:
    """One of the apiserver's bootstrap ClusterRoles that every account holds."""

    role: str
    bound_to: str
    rules: list[dict[str, Any]]
    non_resource_rules: list[dict[str, Any]]


@dataclass(frozen=True)
class Account:
    name: str
    id: str
    """Its id in test names (``test_...[<id>]``)."""
    fenced_by: list[str]
    everywhere: list[dict[str, Any]]
    """Rules of a ClusterRole bound by a ClusterRoleBinding: every namespace, cluster scope."""
    suite_namespace: list[dict[str, Any]]
    """Rules of a Role bound in the suite's namespace, there only."""

    def granted(self, in_suite_namespace: bool) -> frozenset[Right]:
        """The suite's grants in a namespace (the defaults not included)."""
        extra = self.suite_namespace if in_suite_namespace else []
        return rights([*self.everywhere, *extra])


@dataclass(frozen=True)
class AllowList:
    defaults: list[Default]
    accounts: dict[str, Account]

    @property
    def default_rights(self) -> frozenset[Right]:
        return rights(r for d in self.defaults for r in d.rules)

    @property
    def default_url_rights(self) -> frozenset[UrlRight]:
        return url_rights(r for d in self.defaults for r in d.non_resource_rules)

    def expected(self, account: str, in_suite_namespace: bool) -> frozenset[Right]:
        """What a token of ``account`` may do in a namespace: the defaults and its grants."""
        return self.default_rights | self.accounts[account].granted(in_suite_namespace)

    def by_id(self, account_id: str) -> Account:
        (a,) = (a for a in self.accounts.values() if a.id == account_id)
        return a


def load(path: Path = ALLOW_LIST) -> AllowList:
    doc = yaml.safe_load(path.read_text())
    if doc.get("version") != "v1":
        raise ValueError(f"{path}: version {doc.get('version')!r}, expected v1")
    defaults = [
        Default(d["role"], d["boundTo"], d.get("rules", []), d.get("nonResourceRules", []))
        for d in doc["defaults"]
    ]
    accounts = {
        name: Account(name, a["id"], a["fenced_by"], a["everywhere"], a["suite_namespace"])
        for name, a in doc["accounts"].items()
    }
    return AllowList(defaults, accounts)


def from_review(status: Mapping[str, Any]) -> tuple[frozenset[Right], frozenset[UrlRight]]:
    """The rights a SelfSubjectRulesReview's status lists."""
    return rights(status.get("resourceRules") or []), url_rights(
        status.get("nonResourceRules") or []
    )


def _key(o: Mapping[str, Any]) -> tuple[str, str, str]:
    return (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"])


def granted_by_manifests(objs: list[dict[str, Any]], namespace: str) -> dict[str, Account]:
    """ServiceAccount name → what the RBAC objects ``objs`` grant it, shaped as an Account:
    ClusterRoleBindings give ``everywhere``, RoleBindings in ``namespace`` ``suite_namespace``.
    A RoleBinding elsewhere, or a subject that is not one of ``objs``' accounts, is an error."""
    roles = {_key(o): o for o in objs}
    out = {
        o["metadata"]["name"]: Account(o["metadata"]["name"], "", [], [], [])
        for o in objs
        if o["kind"] == "ServiceAccount"
    }
    for b in objs:
        if b["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        ns = b["metadata"].get("namespace", "")
        if b["kind"] == "RoleBinding" and ns != namespace:
            raise ValueError(f"RoleBinding {b['metadata']['name']} outside {namespace}: {ns}")
        ref = b["roleRef"]
        role = roles[(ref["kind"], ns if ref["kind"] == "Role" else "", ref["name"])]
        for s in b["subjects"]:
            if (
                s["kind"] != "ServiceAccount"
                or s.get("namespace") != namespace
                or (s["name"] not in out)
            ):
                raise ValueError(f"{b['kind']} {b['metadata']['name']} binds {s}")
            a = out[s["name"]]
            (a.everywhere if b["kind"] == "ClusterRoleBinding" else a.suite_namespace).extend(
                role["rules"]
            )
    return out


# ---- the block of docs/security.md


def _cell(items: Iterable[str]) -> str:
    return ", ".join(f"`{i}`" for i in items)


def _resources(rule: Mapping[str, Any]) -> str:
    groups = [g for g in rule.get("apiGroups") or [] if g]
    where = f" (`{'`, `'.join(groups)}`)" if groups else ""
    return ", ".join(rule.get("resources") or []) + where


def _rows(where: str, rules: list[dict[str, Any]]) -> list[str]:
    return [
        f"| {where} | {', '.join(r['verbs'])} | {_resources(r)} | "
        f"{_cell(r.get('resourceNames') or []) or 'any'} |"
        for r in rules
    ]


def render(allow: AllowList) -> str:
    """The block "Exact rights" of docs/security.md, between its markers."""
    out = [
        BEGIN,
        "",
        "Every account first holds the apiserver's own defaults, granted to every authenticated",
        "caller or every ServiceAccount by kube-apiserver's bootstrap ClusterRoles, not by the",
        "suite (`test_an_account_bound_to_nothing_holds_exactly_the_apiservers_defaults`):",
        "",
        "| role | bound to | verbs | on |",
        "|---|---|---|---|",
    ]
    for d in allow.defaults:
        who = f"| `{d.role}` | `{d.bound_to}` |"
        out += [f"{who} {', '.join(r['verbs'])} | {_resources(r)} |" for r in d.rules]
        out += [
            f"{who} {', '.join(r['verbs'])} | {_cell(r['nonResourceURLs'])} |"
            for r in d.non_resource_rules
        ]
    for a in allow.accounts.values():
        fence = f"; writes fenced by {_cell(a.fenced_by)}" if a.fenced_by else ""
        test = f"`test_token_holds_exactly_its_listed_rights[{a.id}]`"
        out += ["", f"`{a.name}` ({test}{fence}):", ""]
        if not a.everywhere and not a.suite_namespace:
            out.append("nothing beyond the defaults.")
            continue
        out += ["| where | verbs | on | objects |", "|---|---|---|---|"]
        out += _rows("everywhere", a.everywhere)
        out += _rows("suite's namespace", a.suite_namespace)
    return "\n".join([*out, "", END])


def _summary_items(a: Account, reads: bool) -> str:
    """What ``a`` reads (``reads``) or writes: the resources (with their subresource) per verb
    (reads: per set of read verbs), each tagged "named" where its rule names the objects and
    "suite's namespace" where a Role grants it there only. The names themselves are in
    docs/security.md's "Exact rights"."""
    verbs: dict[str, list[str]] = {}
    for in_ns, rules in ((False, a.everywhere), (True, a.suite_namespace)):
        for r in rules:
            tags = [
                t
                for t, on in (("named", r.get("resourceNames")), ("suite's namespace", in_ns))
                if on
            ]
            tag = f" ({', '.join(tags)})" if tags else ""
            for verb in r["verbs"]:
                if (verb in READ_VERBS) == reads:
                    items = verbs.setdefault(verb, [])
                    items += [
                        f"`{res}`{tag}"
                        for res in r.get("resources") or []
                        if f"`{res}`{tag}" not in items
                    ]
    if reads:
        held: dict[str, list[str]] = {}
        for verb, items in verbs.items():
            for item in items:
                held.setdefault(item, []).append(verb)
        groups: dict[str, list[str]] = {}
        for item, vs in held.items():
            groups.setdefault(", ".join(v for v in READ_VERBS if v in vs), []).append(item)
        return "; ".join(f"{vs}: {', '.join(items)}" for vs, items in groups.items()) or "nothing"
    return "; ".join(f"{verb}: {', '.join(items)}" for verb, items in verbs.items()) or "nothing"


def render_summary(allow: AllowList) -> str:
    """The table "What each component may do" of docs/deploy.md, between its markers."""
    out = [
        SUMMARY_BEGIN,
        "",
        "| ServiceAccount | reads | writes | writes fenced by |",
        "|---|---|---|---|",
    ]
    for a in allow.accounts.values():
        if not a.everywhere and not a.suite_namespace:
            out.append(f"| `{a.name}` | nothing | nothing | — |")
            continue
        fence = _cell(a.fenced_by) or "—"
        out.append(
            f"| `{a.name}` | {_summary_items(a, True)} | {_summary_items(a, False)} | {fence} |"
        )
    return "\n".join([*out, "", SUMMARY_END])


def replace_block(text: str, block: str, begin: str = BEGIN, end: str = END) -> str:
    head, sep, rest = text.partition(begin)
    _, sep2, tail = rest.partition(end)
    if not sep or not sep2:
        raise ValueError(f"the document lacks the markers {begin!r} … {end!r}")
    return head + block + tail


def main() -> int:
    allow = load()
    DOC.write_text(replace_block(DOC.read_text(), render(allow)))
    print(f"rewrote the exact-rights block of {DOC}")
    summary = render_summary(allow)
    DEPLOY_DOC.write_text(
        replace_block(DEPLOY_DOC.read_text(), summary, SUMMARY_BEGIN, SUMMARY_END)
    )
    print(f"rewrote the rights-summary block of {DEPLOY_DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
