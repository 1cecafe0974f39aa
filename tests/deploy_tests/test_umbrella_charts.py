"""Each of our three charts as a subchart of an umbrella chart (#39 item 4): a site's own chart
that depends on ours through ``file://``, as ``helm dependency update`` fetches it, lints and
renders with the umbrella's ``global`` values (which Helm hands every subchart, so each schema
must accept the key) and with the subchart's own values under its name."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from lj_runtimekit_testkit.manifests import CHART, DEPLOY, Obj, containers, tool_dir

CHARTS = [
    CHART,
    DEPLOY / "helm" / "lj-runtimekit-extensions",
    DEPLOY / "helm" / "lj-runtimekit-operator",
]
#: The workload each chart runs, and the image it runs.
WORKLOAD = {
    "lj-runtimekit": ("DaemonSet", "lj-runtimekit-device-plugin"),
    "lj-runtimekit-extensions": ("DaemonSet", "lj-runtimekit-device-plugin"),
    "lj-runtimekit-operator": ("Deployment", "lj-runtimekit-operator"),
}


def helm(home: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """helm with its config, cache and data in ``home``: no repository of this machine's."""
    env = {
        **os.environ,
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    return subprocess.run(
        [str(tool_dir() / "helm"), *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def umbrella(tmp_path: Path, sub: Path) -> Path:
    """A site's umbrella chart depending on ``sub`` by file://, its dependency fetched."""
    chart = yaml.safe_load((sub / "Chart.yaml").read_text())
    site = tmp_path / "site-gpu"
    (site / "templates").mkdir(parents=True)
    (site / "Chart.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v2",
                "name": "site-gpu",
                "version": "0.1.0",
                "dependencies": [
                    {
                        "name": chart["name"],
                        "version": chart["version"],
                        "repository": f"file://{sub}",
                    }
                ],
            }
        )
    )
    # The umbrella's own object, which reads the global value it shares with the subcharts.
    (site / "templates" / "site.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: site-gpu\n"
        "data:\n  owner: {{ .Values.global.owner | quote }}\n"
    )
    (site / "values.yaml").write_text(
        yaml.safe_dump(
            {
                "global": {"owner": "gpu-team", "imageRegistry": "ignored.example"},
                chart["name"]: {"registry": "site.example/gpu", "version": "v9.9.9"},
            }
        )
    )
    ok(helm(tmp_path, "dependency", "update", str(site)))
    [fetched] = (site / "charts").iterdir()
    assert fetched.name == f"{chart['name']}-{chart['version']}.tgz"
    return site


@pytest.mark.parametrize("chart", CHARTS, ids=lambda p: p.name)
def test_every_charts_schema_accepts_an_umbrellas_global_values(
    chart: Path, tmp_path: Path
) -> None:
    ok(helm(tmp_path, "template", "x", str(chart), "--set", "global.owner=gpu-team"))
    typo = helm(tmp_path, "template", "x", str(chart), "--set", "globl.owner=gpu-team")
    assert typo.returncode != 0, "only `global` is let through, not any key"
    assert "globl" in typo.stderr, typo.stderr


@pytest.mark.parametrize("chart", CHARTS, ids=lambda p: p.name)
def test_each_chart_lints_and_renders_as_a_subchart_of_an_umbrella(
    chart: Path, tmp_path: Path
) -> None:
    site = umbrella(tmp_path, chart)
    lint = ok(helm(tmp_path, "lint", str(site), "--strict", "--with-subcharts"))
    assert "symlink" not in lint.lower(), lint
    out = ok(helm(tmp_path, "template", "site", str(site), "-n", "gpu-system", "--include-crds"))
    objs: list[Obj] = [d for d in yaml.safe_load_all(out) if d]
    [own] = [o for o in objs if o["metadata"]["name"] == "site-gpu"]
    assert own["data"] == {"owner": "gpu-team"}
    kind, name = WORKLOAD[chart.name]
    [workload] = [o for o in objs if (o["kind"], o["metadata"]["name"]) == (kind, name)]
    assert workload["metadata"]["namespace"] == "gpu-system"
    [c] = containers(workload)
    assert c["image"] == f"site.example/gpu/{name}:v9.9.9", "the subchart's values reach it"
