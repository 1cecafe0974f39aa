"""The bundle's charts as OCI artifacts (#23 items 2 and 3): ``helm push`` into a real registry,
``helm template`` from ``oci://`` renders what the chart folder renders, pointing at the images
the installer pushed there (same digests as MANIFEST.json); and one ``helm install`` from
``oci://`` onto the harness control plane."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from lj_runtimekit_testkit.cluster.handle import Cluster
from lj_runtimekit_testkit.manifests import DEPLOY, containers, tool_dir
from lj_runtimekit_testkit.registry import LocalRegistry

from .conftest import PROJECT, Bundle, helm

pytestmark = pytest.mark.images

NS = "lj-oci-install"
RELEASE = "ljrk-oci"
CHART_REPO = "charts"


def rendered_images(objs: list[dict[str, Any]]) -> set[str]:
    """Every image a rendered chart runs: its containers' and the job agent's (--job-image)."""
    found = set()
    for obj in objs:
        for c in containers(obj):
            found.add(str(c["image"]))
            found |= {a.split("=", 1)[1] for a in c.get("args", []) if a.startswith("--job-image=")}
    return found


def objects(text: str) -> list[dict[str, Any]]:
    return [o for o in yaml.safe_load_all(text) if o]


@pytest.fixture(scope="module")
def charts_pushed(
    bundle: Bundle,
    registry: LocalRegistry,
    pushed: subprocess.CompletedProcess[str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    """Every chart .tgz of the bundle pushed with helm to oci://<registry>/charts (after the
    images); returns helm's home for the module."""
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    home = tmp_path_factory.mktemp("helm-home")
    for chart in bundle.charts():
        done = helm(
            home, "push", str(chart), f"oci://{registry.address}/{CHART_REPO}", "--plain-http"
        )
        assert done.returncode == 0, f"helm push {chart.name}: {done.stdout}{done.stderr}"
    return home


def test_every_chart_renders_from_the_registry_as_from_its_folder_with_the_pushed_images(
    bundle: Bundle, registry: LocalRegistry, charts_pushed: Path
) -> None:
    site = f"{registry.address}/{PROJECT}"
    digests = {f"{site}/{i['name']}:{i['tag']}": i["digest"] for i in bundle.manifest["images"]}
    for chart in bundle.manifest["charts"]:
        name, version = chart["name"], chart["version"]
        # What a registry stores for a chart is an OCI artifact under <repo>/<chart>:<version>.
        assert registry.manifest_digest(f"{CHART_REPO}/{name}", version), name
        values = ["-n", NS, "--set", f"registry={site}"]
        remote = helm(
            charts_pushed, "template", RELEASE, f"oci://{registry.address}/{CHART_REPO}/{name}",
            "--version", version, "--plain-http", *values,
        )  # fmt: skip
        assert remote.returncode == 0, remote.stderr
        local = helm(charts_pushed, "template", RELEASE, str(DEPLOY / "helm" / name), *values)
        assert local.returncode == 0, local.stderr
        assert objects(remote.stdout) == objects(local.stdout), name
        images = rendered_images(objects(remote.stdout))
        assert images, f"chart {name} runs no image"
        # Offline, a chart can run only what the bundle carries: every image it names is one the
        # installer pushed, and the registry serves it under the bundle's digest.
        assert images <= set(digests), f"chart {name} needs images the bundle lacks"
        for ref in images:
            repository, tag = ref[len(registry.address) + 1 :].rsplit(":", 1)
            assert registry.manifest_digest(repository, tag) == digests[ref], ref


@pytest.mark.cluster
@pytest.mark.parametrize("name", ["lj-runtimekit", "lj-runtimekit-extensions"])
def test_helm_install_from_oci_onto_the_control_plane(
    bundle: Bundle, registry: LocalRegistry, charts_pushed: Path, cluster: Cluster, name: str
) -> None:
    """The full chart and the lean plan's, each installed from oci:// (the operator's chart is
    installed from oci:// onto a real node in tests/guide_tests/test_operator_on_real_nodes.py)."""
    site = f"{registry.address}/{PROJECT}"
    chart = next(c for c in bundle.manifest["charts"] if c["name"] == name)
    env = {"KUBECONFIG": cluster.kubeconfig}
    ns = NS if name == "lj-runtimekit" else f"{NS}-lean"  # the other may still be terminating

    def kubectl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(tool_dir() / "kubectl"), *args],
            # HOME: kubectl's discovery cache goes there; without it, into the working directory.
            env={"PATH": "/usr/bin:/bin", "HOME": str(charts_pushed), **env},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    # --skip-crds: the session's cluster is shared; the CRDs are deploy-all's and the deploy
    # tests' to create and purge (a CRD made here outlived its cleanup and raced their purge).
    done = helm(
        charts_pushed, "install", RELEASE, f"oci://{registry.address}/{CHART_REPO}/{name}",
        "--version", chart["version"], "--plain-http", "-n", ns, "--create-namespace",
        "--skip-crds", "--set", f"registry={site}", **env,
    )  # fmt: skip
    try:
        assert done.returncode == 0, done.stdout + done.stderr
        listed = helm(charts_pushed, "list", "-n", ns, "-o", "json", **env)
        assert listed.returncode == 0, listed.stderr
        (release,) = json.loads(listed.stdout)
        assert release["name"] == RELEASE
        assert release["status"] == "deployed"
        assert release["chart"] == f"{name}-{chart['version']}"
        got = kubectl(
            "-n", ns, "get", "deployments,daemonsets", "-o",
            "jsonpath={range .items[*]}{.spec.template.spec.containers[*].image}{'\\n'}{end}",
        )  # fmt: skip
        assert got.returncode == 0, got.stderr
        images = set(got.stdout.split())
        assert images, got.stdout
        assert all(i.startswith(f"{site}/") for i in images), images
    finally:
        helm(charts_pushed, "uninstall", RELEASE, "-n", ns, "--wait", **env)
        kubectl("delete", "namespace", ns, "--wait=false")
