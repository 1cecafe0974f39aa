"""What the RBAC files' comments deny, held against their rules (#39: deploy/scheduler/02-rbac.yaml
said "it never patches pods" above a ``pods/status`` patch rule). Every "never <verb> <resources>"
and "writes nothing" of a comment of deploy/<folder>/02-rbac.yaml — and of the charts' RBAC
templates, which carry the same comments over the same rules (their own tests hold them equal to
deploy/) — must be true of the ServiceAccount's roles in that file: no rule grants the verb on
the resource or on a subresource of it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lj_runtimekit_testkit.manifests import DEPLOY, load_objects

from .rights import Right, rights

WRITES = frozenset({"create", "update", "patch", "delete", "deletecollection"})
VERBS = {
    "reads": frozenset({"get", "list", "watch"}),
    "writes": WRITES,
    "patches": frozenset({"patch"}),
    "updates": frozenset({"update"}),
    "creates": frozenset({"create"}),
    "deletes": frozenset({"delete", "deletecollection"}),
}
#: how a comment names a resource, where that is not the resource's own (plural) name
ALIASES = {
    "crds": "customresourcedefinitions",
    "bindings": "pods/binding",
    "pvs": "persistentvolumes",
}
RBAC_FILES = sorted(DEPLOY.glob("*/02-rbac.yaml"))
#: a chart's RBAC template → the deploy/ folder whose rules it renders
CHART_RBAC = {
    p: DEPLOY / p.name.removesuffix("-rbac.yaml").replace("device-plugin", "deviceplugin")
    for p in sorted(DEPLOY.glob("helm/*/templates/*-rbac.yaml"))
}
#: "never <verb> <a list>": the list runs to the next "never" or the end of the clause
CLAIM = re.compile(
    r"\bnever (" + "|".join(VERBS) + r") ([^.;:()]+?)(?=,?\s+never\b|[.;:()]|$)", re.IGNORECASE
)
NOTHING = re.compile(r"\bwrites nothing\b", re.IGNORECASE)


def comment_text(path: Path) -> str:
    """The file's comments, one line of prose (a sentence may run over several lines)."""
    lines = [line.strip() for line in path.read_text().splitlines()]
    return " ".join(line.lstrip("#").strip() for line in lines if line.startswith("#"))


def denials(text: str, vocabulary: set[str]) -> list[tuple[str, frozenset[str], str]]:
    """(claim, verbs, resource) for every resource a comment says is never read or written."""
    out: list[tuple[str, frozenset[str], str]] = []
    for m in CLAIM.finditer(text):
        for word in re.split(r",\s*|\s+or\s+|\s+and\s+|\s+nor\s+", m.group(2)):
            name = word.strip().strip("`").lower()
            name = ALIASES.get(name, name)
            if name in vocabulary:
                out.append((m.group(0), VERBS[m.group(1).lower()], name))
    if NOTHING.search(text):
        out += [("writes nothing", WRITES, r) for r in sorted(vocabulary)]
    return out


def granted(folder: Path) -> frozenset[Right]:
    objs = load_objects([folder / "02-rbac.yaml"])
    return rights(r for o in objs if o["kind"] in ("ClusterRole", "Role") for r in o["rules"])


def vocabulary() -> set[str]:
    names = {"secrets", "customresourcedefinitions", "nodes", "pods", "events", "configmaps"}
    for path in RBAC_FILES:
        names |= {res.split("/")[0] for (_, res, _, _) in granted(path.parent)}
    return names


def contradictions(comments: Path, folder: Path) -> list[str]:
    held = granted(folder)
    found = []
    for claim, verbs, resource in denials(comment_text(comments), vocabulary()):
        broken = sorted(
            f"{verb} {res}"
            for (_, res, verb, _) in held
            if verb in verbs and (res == resource or res.startswith(resource + "/"))
        )
        if broken:
            found.append(f"{claim!r}, yet it grants {', '.join(broken)}")
    return found


@pytest.mark.parametrize(
    ("comments", "folder"),
    [(p, p.parent) for p in RBAC_FILES] + list(CHART_RBAC.items()),
    ids=lambda p: str(p.relative_to(DEPLOY)) if isinstance(p, Path) else "",
)
def test_what_an_rbac_comment_denies_no_rule_grants(comments: Path, folder: Path) -> None:
    assert not contradictions(comments, folder), contradictions(comments, folder)


def test_the_comments_are_read_the_way_they_are_written() -> None:
    """The reader finds the denials the files make (so the test above checks something)."""
    ours = {p.parent.name: denials(comment_text(p), vocabulary()) for p in RBAC_FILES}
    operator = {(tuple(sorted(v)), r) for _, v, r in ours["operator"]}
    assert (tuple(sorted(VERBS["reads"])), "secrets") in operator
    # Nodes and Events left the list when a deleted policy came to disable nodes (#39).
    assert {r for _, r in operator} >= {"secrets", "pods"}
    assert "customresourcedefinitions" in {r for _, r in operator}
    assert {r for _, v, r in ours["exporter"] if v == WRITES} >= {"pods", "nodes"}
    said = "It never patches pods: the policy keeps it so."
    assert denials(said, vocabulary()) == [("never patches pods", VERBS["patches"], "pods")]
