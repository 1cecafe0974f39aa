"""The repository's deploy manifests and Helm chart, loaded as objects, for the deploy tests."""

from __future__ import annotations

import functools
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[3]
DEPLOY = REPO / "deploy"
CHART = DEPLOY / "helm" / "lj-runtimekit"
#: component → its manifest folder, in the order deploy-all.sh applies them.
FOLDERS = {
    "device-plugin": "deviceplugin",
    "exporter": "exporter",
    "scheduler": "scheduler",
    "controller": "controller",
}
#: component → its image name (the job agent ships with the controller).
IMAGES = {
    "device-plugin": "lj-runtimekit-device-plugin",
    "scheduler": "lj-runtimekit-scheduler",
    "exporter": "lj-runtimekit-exporter",
    "controller": "lj-runtimekit-controller",
    "job-agent": "lj-runtimekit-controller-job-agent",
    "operator": "lj-runtimekit-operator",
}

Obj = dict[str, Any]


def load_objects(paths: list[Path]) -> list[Obj]:
    """Every object of the YAML files, in order; empty documents dropped."""
    objs: list[Obj] = []
    for path in paths:
        objs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return objs


def manifest_files(folder: str) -> list[Path]:
    return sorted((DEPLOY / folder).glob("[0-9]*.yaml"))


def shared_files() -> list[Path]:
    """The objects every deploy applies: the suite's CRDs and the RuntimeClass."""
    return sorted((DEPLOY / "crds").glob("*.yaml")) + manifest_files("common")


def static_objects(components: list[str] | None = None) -> list[Obj]:
    """What `deploy-all.sh deploy` applies for these components (default all)."""
    paths = shared_files()
    for c in components or list(FOLDERS):
        paths += manifest_files(FOLDERS[c])
    return load_objects(paths)


def key(obj: Obj) -> tuple[str, str, str]:
    """Kind, namespace and name: what identifies an object in a cluster."""
    meta = obj["metadata"]
    return (obj["kind"], meta.get("namespace", ""), meta["name"])


def pod_spec(obj: Obj) -> Obj:
    spec: Obj = obj.get("spec", {}).get("template", {}).get("spec", {})
    return spec


def containers(obj: Obj) -> Iterator[Obj]:
    spec = pod_spec(obj)
    yield from spec.get("initContainers", [])
    yield from spec.get("containers", [])


def component_version(component: str) -> str:
    """The version in a component's pyproject.toml."""
    import tomllib

    data = tomllib.loads((REPO / "components" / component / "pyproject.toml").read_text())
    return str(data["project"]["version"])


@functools.cache
def tool_dir() -> Path:
    """The folder of the test binaries (kubectl, helm, ...), built on first use; looked up once
    per process (the real-node tests call kubectl hundreds of times)."""
    out = subprocess.run(
        [str(REPO / "tests/cluster/build-binaries.sh")],
        check=True,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    return Path(out.stdout.strip().splitlines()[-1])
