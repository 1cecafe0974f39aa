"""The allow-list of effective rights (effective_rights.yaml) against what deploy/ grants and
what docs/security.md says, without a cluster (test_effective_rights.py asks the apiserver).
A right added to a role, or to the list, and not to the other, fails here first; a doc row
that names a right the account lacks, or misses one it holds, fails too."""

from __future__ import annotations

import re

import pytest

from lj_runtimekit_testkit.manifests import FOLDERS, load_objects, manifest_files

from .conftest import NS
from .rights import (
    DEPLOY_DOC,
    DOC,
    SUMMARY_BEGIN,
    SUMMARY_END,
    AllowList,
    Right,
    granted_by_manifests,
    load,
    render,
    render_summary,
    replace_block,
    rights,
)

RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
#: every deploy/ folder that holds a ServiceAccount: the four components' and the operator's.
ACCESS_FOLDERS = [*FOLDERS.values(), "operator"]
VERBS = {
    "get", "list", "watch", "create", "update", "patch", "delete", "deletecollection",
    "escalate", "bind", "impersonate", "approve", "sign",
}  # fmt: skip
ALLOW = load()


def _diff(want: frozenset[Right], got: frozenset[Right]) -> str:
    return f"granted, not listed: {sorted(got - want)}; listed, not granted: {sorted(want - got)}"


def test_the_allow_list_is_exactly_what_deploy_grants() -> None:
    objs = [
        o
        for f in ACCESS_FOLDERS
        for o in load_objects(manifest_files(f))
        if o["kind"] in RBAC_KINDS
    ]
    granted = granted_by_manifests(objs, NS)
    assert sorted(granted) == sorted(ALLOW.accounts), "every ServiceAccount deploy/ makes, listed"
    for name, got in granted.items():
        want = ALLOW.accounts[name]
        for scope in ("everywhere", "suite_namespace"):
            w, g = rights(getattr(want, scope)), rights(getattr(got, scope))
            assert g == w, f"{name} {scope}: {_diff(w, g)}"


# ---- docs/security.md


def _lines(text: str, heading: str) -> list[str]:
    """The lines under the heading that starts with ``heading``, to the next of its level."""
    lines = text.splitlines()
    (start,) = (i for i, line in enumerate(lines) if line.startswith(heading))
    level = heading.split(" ", maxsplit=1)[0]
    out = []
    for line in lines[start + 1 :]:
        if re.match(r"#+ ", line) and len(line.split(" ")[0]) <= len(level):
            break
        out.append(line)
    return out


def _tables(lines: list[str]) -> list[list[list[str]]]:
    """Each markdown table in ``lines``: its rows (the header first), each a list of cells."""
    tables: list[list[list[str]]] = []
    previous = False
    for line in lines:
        is_row = line.startswith("|")
        if is_row and not re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", line):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            if not previous:
                tables.append([])
            tables[-1].append(cells)
        previous = is_row
    return tables


def _words(cell: str) -> set[str]:
    return {w.strip("./") for w in re.split(r"[^a-z0-9./-]+", cell.lower()) if w}


def test_the_stolen_token_table_has_one_row_per_account_each_naming_its_rights_test() -> None:
    lines = _lines(DOC.read_text(), "## What a stolen token can do")
    header, *rows = _tables(lines)[0]
    assert header[0] == "ServiceAccount"
    named = [re.fullmatch(r"`([a-z-]+)`", r[0]) for r in rows]
    assert [m.group(1) if m else r[0] for m, r in zip(named, rows, strict=True)] == list(
        ALLOW.accounts
    ), "one row per account of effective_rights.yaml, in its order"
    for row, a in zip(rows, ALLOW.accounts.values(), strict=True):
        assert f"`test_token_holds_exactly_its_listed_rights[{a.id}]`" in row[-1], row


def _documented(allow: AllowList, account: str) -> set[tuple[str, str]]:
    """(resource, verb) pairs the account's "may | on" table of docs/security.md names: each
    row's verbs × the resources its "on" cell names (the allow-list's own resource names)."""
    vocabulary = {r for a in allow.accounts.values() for (_, r, _, _) in a.granted(True)}
    lines = _lines(DOC.read_text(), f"### `{account}`")
    tables = [t for t in _tables(lines) if t[0][:2] == ["may", "on"]]
    pairs: set[tuple[str, str]] = set()
    for table in tables[:1]:
        for may, on, *_ in table[1:]:
            verbs = _words(may) & VERBS
            pairs |= {(r, v) for r in _words(on) & vocabulary for v in verbs}
    return pairs


@pytest.mark.parametrize(
    "account", list(ALLOW.accounts), ids=[a.id for a in ALLOW.accounts.values()]
)
def test_each_accounts_table_names_exactly_its_listed_rights(account: str) -> None:
    want = {(r, v) for (_, r, v, _) in ALLOW.accounts[account].granted(True)}
    got = _documented(ALLOW, account)
    assert got == want, (
        f"docs/security.md, {account}: named, not held: {sorted(got - want)}; "
        f"held, not named: {sorted(want - got)}"
    )


def test_the_exact_rights_block_is_rendered_from_the_allow_list() -> None:
    text = DOC.read_text()
    assert replace_block(text, render(ALLOW)) == text, (
        "docs/security.md's exact-rights block differs from effective_rights.yaml: run "
        "`python tests/security_tests/rights.py`"
    )


def test_deploy_mds_table_of_what_each_component_may_do_is_rendered_from_the_allow_list() -> None:
    """docs/deploy.md's summary is the allow-list's too (#39: it named rights long removed and
    none of the DRA ones): one row per account, in its order, every resource it reads or writes."""
    text = DEPLOY_DOC.read_text()
    section = "\n".join(_lines(text, "## What each component may do"))
    assert SUMMARY_BEGIN in section, "the table sits in its section"
    summary = render_summary(ALLOW)
    assert replace_block(text, summary, SUMMARY_BEGIN, SUMMARY_END) == text, (
        "docs/deploy.md's rights-summary block differs from effective_rights.yaml: run "
        "`python tests/security_tests/rights.py`"
    )
    [table] = _tables(summary.splitlines())
    assert [row[0] for row in table[1:]] == [f"`{a}`" for a in ALLOW.accounts]
    for row, account in zip(table[1:], ALLOW.accounts.values(), strict=True):
        for _, resource, verb, _ in account.granted(True):
            cell = row[1] if verb in ("get", "list", "watch") else row[2]
            assert f"`{resource}`" in cell, (account.name, resource, verb)
