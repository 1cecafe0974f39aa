"""The Helm chart renders the static manifests, object by object, and its values switch
components, registry, version, namespace, the node label and resource names as documented.

What the chart adds to deploy/ is checked, not ignored: Helm's standard labels (with their
values), the explicit `--namespace` of the scheduler and controller, and config.yaml compared as
the YAML the components read (the chart writes the shared keys first, with its own comments)."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path

import pytest
import yaml

from lj_runtimekit_testkit.manifests import CHART, Obj, containers, key, static_objects, tool_dir


@pytest.fixture(scope="module")
def helm() -> Path:
    return tool_dir() / "helm"


STANDARD_LABELS = {
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/component",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
}


def render(helm: Path, *sets: str, namespace: str = "kube-system") -> list[Obj]:
    args = [str(helm), "template", "lj-runtimekit", str(CHART), "--include-crds", "-n", namespace]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, check=True, capture_output=True, text=True, timeout=120).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def by_key(objs: list[Obj]) -> dict[tuple[str, str, str], Obj]:
    return {key(o): o for o in objs}


def without_chart_additions(obj: Obj, static: Obj) -> Obj:
    """The chart's object less what the chart adds on purpose, each addition checked here."""
    obj = copy.deepcopy(obj)
    for meta, want in ((obj["metadata"], static["metadata"]), *_templates(obj, static)):
        labels = meta.get("labels", {})
        extra = set(labels) - set(want.get("labels", {}))
        assert extra <= STANDARD_LABELS, (key(obj), extra - STANDARD_LABELS)
        for k in extra:
            del labels[k]
    for c in containers(obj):
        if c["name"] in {"lj-runtimekit-scheduler", "lj-runtimekit-controller"}:
            assert "--namespace=kube-system" in c["args"], c["name"]
            want_args = next(x for x in containers(static) if x["name"] == c["name"])["args"]
            if "--namespace=kube-system" not in want_args:
                c["args"].remove("--namespace=kube-system")
    if obj["kind"] == "ConfigMap":
        obj["data"] = {k: yaml.safe_load(v) for k, v in obj["data"].items()}
    return obj


def _templates(obj: Obj, static: Obj) -> list[tuple[Obj, Obj]]:
    if "template" not in obj.get("spec", {}):
        return []
    return [(obj["spec"]["template"]["metadata"], static["spec"]["template"]["metadata"])]


def test_default_values_render_the_static_manifests_object_by_object(helm: Path) -> None:
    chart = by_key(render(helm))
    static = by_key(static_objects())
    assert sorted(chart) == sorted(static)
    for k, obj in static.items():
        if obj["kind"] == "ConfigMap":
            obj = {**obj, "data": {n: yaml.safe_load(v) for n, v in obj["data"].items()}}
        assert without_chart_additions(chart[k], obj) == obj, f"{k} differs: deploy/ and chart"


def test_chart_lints_clean(helm: Path) -> None:
    subprocess.run([str(helm), "lint", "--strict", str(CHART)], check=True, capture_output=True)


def test_a_disabled_component_renders_none_of_its_objects(helm: Path) -> None:
    objs = render(helm, "exporter.enabled=false")
    names = {o["metadata"]["name"] for o in objs}
    assert "lj-runtimekit-exporter" not in names
    assert "lj-runtimekit-device-plugin" in names


def test_registry_version_and_node_label_flow_into_every_workload(helm: Path) -> None:
    objs = render(
        helm,
        "registry=registry.example/ljrk",
        "version=v1.14.0",
        "exporter.tag=v1.14.1",
        "nodeLabel.key=example.com/gpu-node",
    )
    images: dict[str, str] = {}
    for o in objs:
        spec = o.get("spec", {}).get("template", {}).get("spec", {})
        for c in spec.get("containers", []):
            images[o["metadata"]["name"]] = c["image"]
            for a in c.get("args", []):
                if a.startswith("--job-image="):
                    images["job-agent"] = a.split("=", 1)[1]
        if o["kind"] == "DaemonSet":
            assert spec["nodeSelector"] == {"example.com/gpu-node": "true"}
    assert images == {
        "lj-runtimekit-device-plugin": "registry.example/ljrk/lj-runtimekit-device-plugin:v1.14.0",
        "lj-runtimekit-exporter": "registry.example/ljrk/lj-runtimekit-exporter:v1.14.1",
        "lj-runtimekit-scheduler": "registry.example/ljrk/lj-runtimekit-scheduler:v1.14.0",
        "lj-runtimekit-controller": "registry.example/ljrk/lj-runtimekit-controller:v1.14.0",
        "job-agent": "registry.example/ljrk/lj-runtimekit-controller-job-agent:v1.14.0",
    }
