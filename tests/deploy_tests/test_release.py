"""Release hygiene (docs/release.md): one version per component in every place it is written, a
changelog whose newest release is that version, and the licence the docs state."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPONENTS = ["device-plugin", "scheduler", "exporter", "controller", "job-agent"]
FOLDER = {
    "device-plugin": "deviceplugin",
    "scheduler": "scheduler",
    "exporter": "exporter",
    "controller": "controller",
}


def _version(component: str) -> str:
    data = tomllib.loads((ROOT / "components" / component / "pyproject.toml").read_text())
    return str(data["project"]["version"])


def _images(path: Path) -> list[str]:
    out = []
    for doc in yaml.safe_load_all(path.read_text()):
        spec = (doc or {}).get("spec", {}).get("template", {}).get("spec", {})
        out += [c["image"] for c in spec.get("containers", [])]
    return out


def test_the_licence_is_apache_2() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text
    assert "Version 2.0, January 2004" in text
    assert "Apache License, Version 2.0" in (ROOT / "docs" / "release.md").read_text()


@pytest.mark.parametrize("component", COMPONENTS)
def test_changelog_names_the_package_version(component: str) -> None:
    """main carries the next version: its changelog section is ``## Unreleased (next: X.Y.Z)``
    until the release moves it under ``## X.Y.Z`` (docs/release.md)."""
    text = (ROOT / "components" / component / "CHANGELOG.md").read_text()
    sections = re.findall(r"^## (?:Unreleased \(next: )?(\d+\.\d+\.\d+)\)?\s*$", text, flags=re.M)
    released = re.findall(r"^## (\d+\.\d+\.\d+)\s*$", text, flags=re.M)
    assert released, f"{component}/CHANGELOG.md has no released section '## X.Y.Z'"
    assert sections[0] == _version(component)
    # every version in the file is written once, newest first
    keys = [tuple(int(p) for p in v.split(".")) for v in released]
    assert keys == sorted(set(keys), reverse=True)


@pytest.mark.parametrize("component", sorted(FOLDER))
def test_manifest_image_tag_is_the_package_version(component: str) -> None:
    folder = ROOT / "deploy" / FOLDER[component]
    images = [i for f in sorted(folder.glob("03-*.yaml")) for i in _images(f)]
    assert images, f"no workload image in deploy/{FOLDER[component]}"
    for image in images:
        assert image.rsplit(":", 1)[1] == f"v{_version(component)}", image


def test_controller_job_image_is_the_job_agents_version() -> None:
    text = (ROOT / "deploy" / "controller" / "03-deployment.yaml").read_text()
    tags = re.findall(r"--job-image=\S+:(v[\d.]+)", text)
    assert tags == [f"v{_version('job-agent')}"]


def test_chart_app_version_follows_the_components() -> None:
    chart = yaml.safe_load((ROOT / "deploy" / "helm" / "lj-runtimekit" / "Chart.yaml").read_text())
    versions = {_version(c) for c in COMPONENTS}
    assert len(versions) == 1, (
        f"components disagree: {versions} (docs/release.md: one suite version)"
    )
    assert chart["appVersion"] == f"v{versions.pop()}"


def test_the_bake_files_default_tag_is_the_suites_version() -> None:
    text = (ROOT / "docker-bake.hcl").read_text()
    default = re.search(r'variable "lj_runtimekit_version" \{\s*default = "([^"]+)"', text)
    assert default is not None
    assert default.group(1) == f"v{_version('scheduler')}"
