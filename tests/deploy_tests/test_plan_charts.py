"""The two deployment plans' charts (#23 item 2; docs/charts.md): the lean
``lj-runtimekit-extensions`` (device plugin and node labels only) and the full
``lj-runtimekit-operator`` (the operator and its policy, which then creates the rest). Both are
checked like the full chart (test_helm.py): lint, object by object against what they are made of,
values flowing where documented, the release namespace everywhere, the standard labels."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from lj_runtimekit_testkit.manifests import (
    CHART,
    DEPLOY,
    Obj,
    containers,
    key,
    load_objects,
    manifest_files,
    tool_dir,
)

from .test_helm import CLUSTER_SCOPED, STANDARD_LABELS

EXTENSIONS = DEPLOY / "helm" / "lj-runtimekit-extensions"
OPERATOR = DEPLOY / "helm" / "lj-runtimekit-operator"
#: The full chart's values the lean plan keeps: what its templates read.
LEAN_VALUES = (
    *("registry", "version", "imagePullSecrets", "nodeLabel", "resourceNames"),
    *("runtimeClass", "devicePlugin"),
)
OFF = [f"{c}.enabled=false" for c in ("scheduler", "exporter", "controller")]


def render(chart: Path, *sets: str, namespace: str = "kube-system") -> list[Obj]:
    args = [str(tool_dir() / "helm"), "template", "ljrk", str(chart), "--include-crds"]
    args += ["-n", namespace]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, check=True, capture_output=True, text=True, timeout=120).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def without_chart_label(obj: Obj) -> Obj:
    obj = json.loads(json.dumps(obj))
    obj["metadata"].get("labels", {}).pop("helm.sh/chart", None)
    return obj


@pytest.mark.parametrize("chart", [EXTENSIONS, OPERATOR], ids=lambda p: p.name)
def test_the_plan_charts_lint_clean(chart: Path) -> None:
    out = subprocess.run(
        [str(tool_dir() / "helm"), "lint", str(chart), "--strict"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("namespace", ["kube-system", "gpu-system"])
def test_the_extensions_chart_is_the_full_chart_with_only_the_device_plugin(namespace: str) -> None:
    lean = {key(o): without_chart_label(o) for o in render(EXTENSIONS, namespace=namespace)}
    full = {key(o): without_chart_label(o) for o in render(CHART, *OFF, namespace=namespace)}
    assert lean == full
    kinds = {k[0] for k in lean}
    assert {"DaemonSet", "RuntimeClass", "CustomResourceDefinition"} <= kinds
    assert "Deployment" not in kinds, "no scheduler, controller or operator in the lean plan"
    daemonsets = {o["metadata"]["name"] for k, o in lean.items() if k[0] == "DaemonSet"}
    assert daemonsets == {"lj-runtimekit-device-plugin", "lj-runtimekit-dra-plugin"}


def test_the_extensions_chart_takes_the_full_charts_values_for_what_it_runs() -> None:
    sets = ["registry=site.example/gpu", "version=v9.9.9", "nodeLabel.key=gpu-node"]
    for ds in (o for o in render(EXTENSIONS, *sets) if o["kind"] == "DaemonSet"):
        [c] = containers(ds)
        assert c["image"] == "site.example/gpu/lj-runtimekit-device-plugin:v9.9.9"
        dra = {"lj_runtimekit_device_mode": "dra"} if "dra" in ds["metadata"]["name"] else {}
        assert ds["spec"]["template"]["spec"]["nodeSelector"] == {"gpu-node": "true", **dra}
    bad = subprocess.run(
        [str(tool_dir() / "helm"), "template", "x", str(EXTENSIONS), "--set", "devicePlugn.x=1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert bad.returncode != 0
    assert "devicePlugn" in bad.stderr, "the full chart's schema refuses a typo here too"


def test_the_extensions_chart_is_a_chart_of_its_own() -> None:
    """Its own files (a symlink makes Helm warn on every command and breaks a checkout without
    symlinks), and of values only what it runs: each of the full chart's values it keeps, with
    the same default and the same schema, so the two charts mean the same by a key."""
    links = [str(p.relative_to(EXTENSIONS)) for p in EXTENSIONS.rglob("*") if p.is_symlink()]
    assert not links, f"symlinks into another chart: {links}"
    lint = subprocess.run(
        [str(tool_dir() / "helm"), "lint", str(EXTENSIONS)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "symlink" not in (lint.stdout + lint.stderr).lower(), lint.stdout + lint.stderr
    own = yaml.safe_load((EXTENSIONS / "values.yaml").read_text())
    full = yaml.safe_load((CHART / "values.yaml").read_text())
    assert sorted(own) == sorted(LEAN_VALUES), "the values of what the lean plan runs, no others"
    assert own == {k: full[k] for k in own}, "the full chart's defaults for the same keys"
    schema = json.loads((EXTENSIONS / "values.schema.json").read_text())
    full_schema = json.loads((CHART / "values.schema.json").read_text())
    assert sorted(schema["properties"]) == sorted([*own, "global"])
    for k in own:
        assert schema["properties"][k] == full_schema["properties"][k], k
    assert schema["additionalProperties"] is False
    assert schema["required"] == full_schema["required"]


@pytest.mark.parametrize(
    "other", ["scheduler.enabled=false", "exporter.config=x", "controller.tag=v1", "monitoring.x=1"]
)
def test_the_extensions_chart_refuses_the_values_of_what_it_does_not_run(other: str) -> None:
    bad = subprocess.run(
        [str(tool_dir() / "helm"), "template", "x", str(EXTENSIONS), "--set", other],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert bad.returncode != 0, f"{other} was accepted: the lean chart runs no such component"
    assert "additional properties" in bad.stderr, bad.stderr


def test_the_extensions_charts_crds_are_files_equal_to_deploys() -> None:
    assert not (EXTENSIONS / "crds").is_symlink()
    for crd in sorted((DEPLOY / "crds").glob("*.yaml")):
        copy = EXTENSIONS / "crds" / crd.name
        assert not copy.is_symlink()
        assert copy.read_text() == crd.read_text(), f"{crd.name}: copy the new CRD"


def test_no_chart_holds_a_symlink_and_the_operator_charts_copies_are_byte_equal() -> None:
    """A symlink makes Helm warn on every command and breaks a checkout without symlinks: each
    chart holds files; the operator chart's copies of deploy/ are held equal to it here."""
    links = [str(p.relative_to(DEPLOY)) for p in (DEPLOY / "helm").rglob("*") if p.is_symlink()]
    assert not links, f"symlinks in the charts: {links}"
    copies = {
        OPERATOR / "files" / "operator": DEPLOY / "operator",
        OPERATOR / "crds": DEPLOY / "crds",
    }
    for folder, source in copies.items():
        names = sorted(p.name for p in folder.iterdir())
        assert names == sorted(p.name for p in source.glob("*.yaml")), folder
        for name in names:
            assert (folder / name).read_bytes() == (source / name).read_bytes(), (
                f"{folder / name}: copy {source / name} again"
            )
    helpers = OPERATOR / "templates" / "_helpers.tpl"
    assert helpers.read_bytes() == (CHART / "templates" / "_helpers.tpl").read_bytes(), (
        "the operator chart's helpers are the full chart's (same names in an umbrella chart)"
    )


def _static_operator() -> dict[tuple[str, str, str], Obj]:
    return {key(o): o for o in load_objects(manifest_files("operator"))}


@pytest.mark.parametrize("namespace", ["kube-system", "gpu-system"])
def test_the_operator_chart_renders_deploys_operator_in_the_release_namespace(
    namespace: str,
) -> None:
    objs = render(OPERATOR, namespace=namespace)
    static = _static_operator()
    rendered = {}
    for o in objs:
        if o["kind"] in ("CustomResourceDefinition", "RuntimeKitPolicy"):
            continue
        k = (
            o["kind"],
            "kube-system" if o["metadata"].get("namespace") else "",
            o["metadata"]["name"],
        )
        rendered[k] = o
    assert sorted(rendered) == sorted(static)
    for k, want in static.items():
        got = json.loads(json.dumps(rendered[k]))
        meta = got["metadata"]
        if "namespace" in meta:
            assert meta["namespace"] == namespace
            meta["namespace"] = "kube-system"
        extra = set(meta.get("labels", {})) - set(want["metadata"].get("labels", {}))
        assert extra <= STANDARD_LABELS, extra
        for label in extra:
            del meta["labels"][label]
        for s in got.get("subjects", []):
            assert s["namespace"] == namespace
            s["namespace"] = "kube-system"
        if got["kind"] == "ValidatingAdmissionPolicy":
            for cond in got["spec"]["matchConditions"]:
                user = f"'system:serviceaccount:{namespace}:lj-runtimekit-operator'"
                assert user in cond["expression"], cond
                cond["expression"] = cond["expression"].replace(
                    user, "'system:serviceaccount:kube-system:lj-runtimekit-operator'"
                )
        if got["kind"] == "Deployment":
            tmpl = got["spec"]["template"]["metadata"]["labels"]
            for label in set(tmpl) - set(want["spec"]["template"]["metadata"]["labels"]):
                assert label in STANDARD_LABELS
                del tmpl[label]
            [c] = containers(got)
            lease = c["env"].pop()
            assert lease == {
                "name": "LJ_RUNTIMEKIT_OPERATOR_LEADER_ELECT_RESOURCE_NAMESPACE",
                "value": namespace,
            }
        assert got == want, f"{k}: the chart's differs from deploy/operator's"
    for o in objs:
        if o["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in o["metadata"], key(o)


@pytest.mark.parametrize(
    ("typo", "where"),
    [
        ("operater.tag=v1", "at '': additional properties 'operater'"),
        (
            "operator.imagePulPolicy=Always",
            "at '/operator': additional properties 'imagePulPolicy'",
        ),
        ("operator.imagePullPolicy=Sometimes", "at '/operator/imagePullPolicy'"),
        ("policy.creat=false", "at '/policy': additional properties 'creat'"),
        (
            "policy.spec.components.exportr.enabled=false",
            "at '/policy/spec/components': additional properties 'exportr'",
        ),
        (
            "policy.spec.components.exporter.enabeld=false",
            "at '/policy/spec/components/exporter': additional properties 'enabeld'",
        ),
        # The suite lives in the release namespace: the only one the operator may write.
        (
            "policy.spec.namespace=gpu-system",
            "at '/policy/spec': additional properties 'namespace'",
        ),
    ],
    ids=lambda v: v.split("=")[0] if "=" in v else "",
)
def test_a_typo_in_the_operator_charts_values_is_refused_by_its_schema(
    typo: str, where: str
) -> None:
    bad = subprocess.run(
        [str(tool_dir() / "helm"), "template", "x", str(OPERATOR), "--set", typo],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert bad.returncode != 0, f"{typo} was accepted"
    assert "values don't meet the specifications of the schema" in bad.stderr, bad.stderr
    assert where in bad.stderr, bad.stderr


def test_the_operator_charts_documented_values_pass_its_schema() -> None:
    sets = [
        "operator.tag=v9.9.7",
        "operator.imagePullPolicy=Always",
        "operator.resources.requests.cpu=10m",
        "imagePullSecrets[0].name=site-registry",
        "policy.spec.registry=mirror.example/gpu",
        "policy.spec.components.controller.jobAgentImage=lj-runtimekit-controller-job-agent",
        "policy.spec.components.exporter.nodeSelector.gpu=yes",
    ]
    objs = render(OPERATOR, *sets)
    [dep] = [o for o in objs if o["kind"] == "Deployment"]
    [c] = containers(dep)
    assert c["image"].endswith("/lj-runtimekit-operator:v9.9.7")
    assert c["resources"] == {"requests": {"cpu": "10m"}}
    [policy] = [o for o in objs if o["kind"] == "RuntimeKitPolicy"]
    assert policy["spec"]["registry"] == "mirror.example/gpu"


def test_the_operator_chart_lets_its_admission_policy_take_renamed_keys_off_nodes() -> None:
    # a renamed feature label or device plugin prefix: the chart's values, not a hand edit
    objs = render(
        OPERATOR,
        "operator.extraFeatureLabels[0]=site.example/gpu",
        "operator.extraLabelPrefixes[0]=gpu.site.example",
    )
    [vap] = [o for o in objs if o["kind"] == "ValidatingAdmissionPolicy"]
    variables = {v["name"]: v["expression"] for v in vap["spec"]["variables"]}
    assert variables["featureLabels"] == """['lj_runtimekit_enable'] + ["site.example/gpu"]"""
    assert variables["labelPrefixes"] == """['lj-runtimekit.aliyun.com/'] + ["gpu.site.example/"]"""
    [plain] = [o for o in render(OPERATOR) if o["kind"] == "ValidatingAdmissionPolicy"]
    assert {v["name"]: v["expression"] for v in plain["spec"]["variables"]}["labelPrefixes"] == (
        "['lj-runtimekit.aliyun.com/']"
    )
    bad = subprocess.run(
        [
            *(str(tool_dir() / "helm"), "template", "x", str(OPERATOR)),
            *("--set", "operator.extraLabelPrefixes[0]=gpu.site.example/"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert bad.returncode != 0, "a prefix with its / was accepted"
    assert "/operator/extraLabelPrefixes/0" in bad.stderr, bad.stderr


def test_the_operator_charts_crds_are_deploys() -> None:
    crds = {
        o["metadata"]["name"]: o
        for o in render(OPERATOR)
        if o["kind"] == "CustomResourceDefinition"
    }
    for path in sorted((DEPLOY / "crds").glob("*.yaml")):
        [want] = load_objects([path])
        assert crds[want["metadata"]["name"]] == want, path.name


def test_the_policy_takes_registry_version_namespace_and_the_operators_overrides() -> None:
    sets = [
        "registry=site.example/gpu",
        "version=v9.9.9",
        "policy.spec.components.exporter.enabled=false",
        "policy.spec.components.scheduler.version=v9.9.8",
    ]
    objs = render(OPERATOR, *sets, namespace="gpu-system")
    [policy] = [o for o in objs if o["kind"] == "RuntimeKitPolicy"]
    spec: dict[str, Any] = policy["spec"]
    assert (spec["registry"], spec["namespace"]) == ("site.example/gpu", "gpu-system")
    components = spec["components"]
    assert components["exporter"]["enabled"] is False
    assert components["scheduler"]["version"] == "v9.9.8"
    assert components["controller"]["version"] == components["devicePlugin"]["version"] == "v9.9.9"
    [dep] = [o for o in objs if o["kind"] == "Deployment"]
    [c] = containers(dep)
    assert c["image"] == "site.example/gpu/lj-runtimekit-operator:v9.9.9"
    [want] = load_objects([DEPLOY / "operator" / "runtimekitpolicy.yaml"])
    default = next(o for o in render(OPERATOR) if o["kind"] == "RuntimeKitPolicy")
    assert default["spec"] == want["spec"], "the defaults are deploy/operator/runtimekitpolicy.yaml"
    assert not [
        o for o in render(OPERATOR, "policy.create=false") if o["kind"] == "RuntimeKitPolicy"
    ]


@pytest.mark.parametrize("chart", [EXTENSIONS, OPERATOR], ids=lambda p: p.name)
def test_every_object_of_a_plan_chart_carries_the_standard_labels(chart: Path) -> None:
    for o in render(chart):
        if o["kind"] == "CustomResourceDefinition":
            continue
        labels = o["metadata"].get("labels", {})
        assert labels.get("app.kubernetes.io/part-of") == "lj-runtimekit", key(o)
        assert labels.get("app.kubernetes.io/managed-by") == "Helm", key(o)
        assert labels.get("helm.sh/chart", "").startswith(chart.name), key(o)
