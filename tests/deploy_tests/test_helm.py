"""The Helm chart renders exactly the static manifests, object by object, and its values switch
components, registry, version and the node label as documented."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from lj_runtimekit_testkit.manifests import CHART, Obj, key, static_objects, tool_dir


@pytest.fixture(scope="module")
def helm() -> Path:
    return tool_dir() / "helm"


def render(helm: Path, *sets: str) -> list[Obj]:
    args = [str(helm), "template", "lj-runtimekit", str(CHART), "--include-crds"]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, check=True, capture_output=True, text=True, timeout=120).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def by_key(objs: list[Obj]) -> dict[tuple[str, str, str], Obj]:
    return {key(o): o for o in objs}


def test_default_values_render_the_static_manifests_object_by_object(helm: Path) -> None:
    chart = by_key(render(helm))
    static = by_key(static_objects())
    assert sorted(chart) == sorted(static)
    for k, obj in static.items():
        assert chart[k] == obj, f"{k} differs between deploy/ and the Helm chart"


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
