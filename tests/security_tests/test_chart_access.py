"""The Helm chart grants exactly what deploy/ grants (docs/security.md): the same ServiceAccounts,
RBAC rules, subjects and admission policies, in the release's namespace. Rendered into another
namespace, the policies follow it (a policy that still named kube-system would match no request
and let every escape through)."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
import yaml

from lj_runtimekit_testkit.manifests import (
    CHART,
    FOLDERS,
    Obj,
    load_objects,
    manifest_files,
    tool_dir,
)

from .conftest import ACCESS_KINDS


def _access(objs: list[Obj], namespace: str) -> dict[tuple[str, str], Any]:
    """kind/name → what grants or refuses: rules, roleRef, subjects, policy spec, with the
    namespace written as NS."""
    out: dict[tuple[str, str], Any] = {}
    for o in objs:
        if o["kind"] not in ACCESS_KINDS:
            continue
        body = {k: v for k, v in o.items() if k not in ("apiVersion", "kind", "metadata")}
        body["namespace"] = o["metadata"].get("namespace")
        out[(o["kind"], o["metadata"]["name"])] = json.loads(
            json.dumps(body).replace(namespace, "NS")
        )
    return out


def _render(namespace: str) -> list[Obj]:
    args = [str(tool_dir() / "helm"), "template", "lj-runtimekit", str(CHART), "-n", namespace]
    out = subprocess.run(args, check=True, capture_output=True, text=True, timeout=120).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def _static() -> list[Obj]:
    return [o for f in FOLDERS.values() for o in load_objects(manifest_files(f))]


@pytest.mark.parametrize("namespace", ["kube-system", "gpu-system"])
def test_chart_grants_and_refuses_what_deploy_does(namespace: str) -> None:
    want = _access(_static(), "kube-system")
    got = _access(_render(namespace), namespace)
    assert sorted(got) == sorted(want)
    for k, body in want.items():
        assert got[k] == body, f"{k}: the chart's differs from deploy/'s"


def test_every_component_account_is_checked_by_name_in_its_policy() -> None:
    """Each policy matches its ServiceAccount by the username the apiserver gives its token."""
    for o in _render("gpu-system"):
        if o["kind"] == "ValidatingAdmissionPolicy":
            (cond,) = o["spec"]["matchConditions"]
            assert "'system:serviceaccount:gpu-system:lj-runtimekit-" in cond["expression"]
