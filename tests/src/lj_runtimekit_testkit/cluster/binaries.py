"""Where the test control plane's binaries are: the lookup of ``tests/cluster/build-binaries.sh``.

``KUBEBUILDER_ASSETS`` (the envtest convention) wins when it holds every binary; otherwise the
cache directory keyed by the versions pinned in ``tests/cluster/versions.env``.
"""

from __future__ import annotations

import os
from pathlib import Path

BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")

_VERSIONS_ENV = Path(__file__).resolve().parents[3] / "cluster" / "versions.env"


class BinariesMissing(RuntimeError):
    """The control plane binaries are not built yet."""


def pinned_versions(path: Path = _VERSIONS_ENV) -> dict[str, str]:
    """The ``KEY=value`` pins of versions.env (comments and blank lines skipped)."""
    versions: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            versions[key.strip()] = value.strip()
    return versions


def cache_dir(versions: dict[str, str] | None = None) -> Path:
    """The cache directory build-binaries.sh fills for the pinned versions."""
    v = versions if versions is not None else pinned_versions()
    root = os.environ.get("LJ_RUNTIMEKIT_CACHE") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lj-runtimekit"
    )
    key = f"k8s-{v['KUBERNETES_VERSION']}_etcd-{v['ETCD_VERSION']}_kwok-{v['KWOK_VERSION']}"
    return Path(root) / "k8s" / key


def _has_all(directory: Path) -> bool:
    return all(os.access(directory / name, os.X_OK) for name in BINARIES)


def binaries_dir() -> Path:
    """The directory holding every control plane binary, or :class:`BinariesMissing`."""
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets and _has_all(Path(assets)):
        return Path(assets)
    directory = cache_dir()
    if _has_all(directory):
        return directory
    missing = [name for name in BINARIES if not os.access(directory / name, os.X_OK)]
    raise BinariesMissing(
        f"control plane binaries {missing} not found in {directory}: run `make k8s-bin` "
        "(tests/cluster/build-binaries.sh) or point KUBEBUILDER_ASSETS at existing binaries"
    )
