"""Release hygiene (docs/release.md): one version per component in every place it is written, a
changelog whose newest release is that version, and the licence the docs state."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPONENTS = ["device-plugin", "scheduler", "exporter", "controller", "job-agent", "operator"]
FOLDER = {
    "device-plugin": "deviceplugin",
    "scheduler": "scheduler",
    "exporter": "exporter",
    "controller": "controller",
    "operator": "operator",
}
CHARTS = ["lj-runtimekit", "lj-runtimekit-extensions", "lj-runtimekit-operator"]


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


def _suite_version() -> str:
    versions = {_version(c) for c in COMPONENTS}
    assert len(versions) == 1, (
        f"components disagree: {versions} (docs/release.md: one suite version)"
    )
    return versions.pop()


@pytest.mark.parametrize("chart", CHARTS)
def test_every_chart_s_app_version_follows_the_components(chart: str) -> None:
    meta = yaml.safe_load((ROOT / "deploy" / "helm" / chart / "Chart.yaml").read_text())
    assert meta["appVersion"] == f"v{_suite_version()}", chart
    # the chart moves with the suite; a chart-only fix bumps its iteration (docs/release.md)
    assert meta["version"].rsplit(".", 1)[0] == _suite_version().rsplit(".", 1)[0], chart


def _bake_images() -> dict[str, str]:
    """docker-bake.hcl's target → image name (the tag's repository without the registry)."""
    text = (ROOT / "docker-bake.hcl").read_text()
    found = re.findall(
        r'target "([a-z-]+)" \{[^}]*?tags\s*=\s*\["\$\{REGISTRY\}/([a-z-]+):', text, flags=re.S
    )
    return dict(found)


def test_the_bake_file_builds_every_component() -> None:
    assert sorted(_bake_images()) == sorted(COMPONENTS)
    text = (ROOT / "docker-bake.hcl").read_text()
    group = re.search(r'group "default" \{\s*targets = \[([^\]]*)\]', text)
    assert group is not None
    assert sorted(re.findall(r'"([a-z-]+)"', group.group(1))) == sorted(COMPONENTS)


def _mapping() -> tuple[list[str], dict[str, str]]:
    """The README's version-mapping table: its version columns, and image (or ``chart <name>``)
    → tag."""
    text = (ROOT / "README.md").read_text()
    head = re.search(r"^\| component \| image \|(.*)\|\s*$", text, flags=re.M)
    assert head is not None, "README.md has no version-mapping table (guide §2.2)"
    columns = [c.strip() for c in head.group(1).split("|")]
    rows: dict[str, str] = {}
    for line in text[head.end() :].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip().strip("`") for c in line.strip("|").split("|")]
        chart = re.match(r"^chart `?([a-z-]+)`?", cells[0])
        rows[f"chart {chart.group(1)}" if chart else cells[1]] = cells[-1]
    return columns, rows


def test_the_readme_maps_every_image_and_chart_to_the_version() -> None:
    columns, rows = _mapping()
    version = _suite_version()
    assert columns[-1] == f"v{version}", "the table's newest column is the suite's version"
    for component, image in _bake_images().items():
        assert rows.get(image) == f"v{_version(component)}", (component, image, rows)
    for chart in CHARTS:
        meta = yaml.safe_load((ROOT / "deploy" / "helm" / chart / "Chart.yaml").read_text())
        assert rows.get(f"chart {chart}") == meta["version"], (chart, rows)


def test_the_bake_files_default_tag_is_the_suites_version() -> None:
    text = (ROOT / "docker-bake.hcl").read_text()
    default = re.search(r'variable "lj_runtimekit_version" \{\s*default = "([^"]+)"', text)
    assert default is not None
    assert default.group(1) == f"v{_suite_version()}"
