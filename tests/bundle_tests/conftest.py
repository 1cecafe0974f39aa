"""Fixtures of the offline-bundle tests: the bundle ``make bundle`` would make, built once per
session from ``build/images`` (``make images`` runs first, once, when they are missing) with the
bundle's own builder, unpacked as an operator unpacks it; a way to run its installer (with the
system's commands and no push or load tool but those a test names); the harness' loopback registry
(``registry``, module scope); and skopeo and podman from the machine's packages."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from lj_runtimekit_testkit.manifests import DEPLOY, REPO, tool_dir
from lj_runtimekit_testkit.registry import LocalRegistry, registry_binaries
from lj_runtimekit_testkit.suite import INDEX, ImagesMissing, built_images

BUILDER = DEPLOY / "bundle" / "build-bundle.py"
#: Where the tests push the bundle's images: <registry>/site/lj-runtimekit/<image>:<tag>.
PROJECT = "site/lj-runtimekit"
#: The installer's exit codes (its --help lists them).
E_USAGE, E_INTEGRITY, E_TOOL, E_IMAGE = 2, 3, 4, 5
#: Every tool the installer may pick for push or load: hidden from ``only_path`` runs.
SITE_TOOLS = frozenset({"docker", "podman", "skopeo", "crane", "ctr", "nerdctl"})
#: The push tools the tests run for real from the machine's packages: ``install-tools.sh skopeo
#: podman`` installs them when missing (these tests are the only ones that need them).
PACKAGED_TOOLS = ("skopeo", "podman")
INSTALL_TOOLS = REPO / "tests" / "images" / "install-tools.sh"
#: Builds (first time) the real nerdctl the real-node load test puts on a node's PATH.
BUILD_NERDCTL = REPO / "tests" / "cluster" / "build-nerdctl.sh"


@dataclass(frozen=True)
class Bundle:
    tarball: Path
    folder: Path
    """The unpacked top folder ``lj-runtimekit-k8s-package.<V>/``."""
    run: Path
    manifest: dict[str, Any]
    system_bin: Path
    """The system's own commands (/usr/bin, /bin) without any push or load tool (see
    :data:`SITE_TOOLS`): what ``only_path`` runs the installer with."""

    @property
    def version(self) -> str:
        return str(self.manifest["version"])

    def charts(self) -> list[Path]:
        return [self.folder / c["file"] for c in self.manifest["charts"]]

    def installer(
        self,
        *args: str,
        run: Path | None = None,
        path: Sequence[Path | str] = (),
        only_path: bool = False,
        env: Mapping[str, str] | None = None,
        timeout: float = 300.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run the installer (``run``: another copy of it) with ``path`` put first on PATH
        (``only_path``: PATH is ``path`` plus :attr:`system_bin`, so of the push and load tools
        only those in ``path`` are found, even where this machine has podman or skopeo in
        /usr/bin). ``env`` is added to the environment."""
        base = str(self.system_bin) if only_path else os.environ["PATH"]
        environ = {**os.environ, **(env or {}), "PATH": os.pathsep.join([*map(str, path), base])}
        return subprocess.run(
            [str(run or self.run), *args],
            env=environ,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


def _ensure_images() -> None:
    """``make images`` once when build/images is missing or incomplete."""
    try:
        built_images()
        return
    except ImagesMissing as e:
        reason = str(e)
    done = subprocess.run(
        ["make", "images"], cwd=REPO, capture_output=True, text=True, timeout=1200, check=False
    )
    if done.returncode != 0:
        pytest.fail(f"{reason}; `make images` failed:\n{done.stderr[-3000:]}", pytrace=False)


@pytest.fixture(scope="session")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    _ensure_images()
    out = tmp_path_factory.mktemp("bundle")
    done = subprocess.run(
        [
            "python3",  # the builder needs only the standard library, like `make bundle`
            str(BUILDER),
            "--images", str(INDEX),
            "--charts", str(DEPLOY / "helm"),
            "--out", str(out / "dist"),
            "--helm", str(tool_dir() / "helm"),
        ],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"build-bundle.py failed:\n{done.stdout}{done.stderr}"
    tarball = Path(done.stdout.strip().splitlines()[-1])
    # Unpacked the way docs/offline-bundle.md tells an operator to.
    site = out / "site"
    site.mkdir()
    subprocess.run(["tar", "-xzf", str(tarball), "-C", str(site)], check=True, timeout=300)
    (folder,) = site.iterdir()
    manifest = json.loads((folder / "MANIFEST.json").read_text())
    run = folder / manifest["installer"]["file"]
    return Bundle(tarball, folder, run, manifest, system_commands(out / "system-bin"))


def system_commands(folder: Path) -> Path:
    """``folder`` with a link to each command of /usr/bin and /bin but :data:`SITE_TOOLS`."""
    folder.mkdir()
    for system in (Path("/usr/bin"), Path("/bin")):
        for command in system.iterdir():
            link = folder / command.name
            if command.name in SITE_TOOLS or link.is_symlink() or not os.access(command, os.X_OK):
                continue
            link.symlink_to(command)
    return folder


@pytest.fixture(scope="session")
def packaged_tools() -> dict[str, Path]:
    """skopeo and podman from the machine's packages (installed by install-tools.sh when
    missing; only these tests need them, so no make target installs them): name → path."""
    if not all(shutil.which(t) for t in PACKAGED_TOOLS):
        done = subprocess.run(
            [str(INSTALL_TOOLS), *PACKAGED_TOOLS],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        if done.returncode != 0:
            pytest.fail(f"{INSTALL_TOOLS} failed:\n{done.stderr[-3000:]}", pytrace=False)
    found = {t: shutil.which(t) for t in PACKAGED_TOOLS}
    missing = [t for t, p in found.items() if p is None]
    if missing:
        pytest.fail(f"{' and '.join(missing)} not on PATH after {INSTALL_TOOLS}", pytrace=False)
    return {t: Path(p) for t, p in found.items() if p}


@pytest.fixture(scope="session")
def crane_dir() -> Path:
    """The folder holding the harness' crane (put it on PATH to push with it)."""
    return registry_binaries()


@pytest.fixture(scope="session")
def nerdctl_binary() -> Path:
    """nerdctl built from Go modules by ``tests/cluster/build-nerdctl.sh`` (``make k8s-bin``),
    static, cached under ~/.cache/lj-runtimekit/nerdctl/<version>."""
    done = subprocess.run(
        [str(BUILD_NERDCTL)], capture_output=True, text=True, timeout=1800, check=False
    )
    if done.returncode != 0:
        pytest.fail(f"{BUILD_NERDCTL} failed:\n{done.stderr[-3000:]}", pytrace=False)
    return Path(done.stdout.strip().splitlines()[-1]) / "nerdctl"


def helm_env(home: Path) -> dict[str, str]:
    """helm's own state (registry logins, cache) in ``home``, not the user's."""
    return {
        **os.environ,
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }


def helm(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(tool_dir() / "helm"), *args],
        env={**helm_env(home), **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def stub_tool(folder: Path, name: str, script: str) -> Path:
    """An executable ``folder/name`` running the shell ``script`` (a stand-in for a site tool
    this machine lacks); each call appends its arguments to ``folder/calls.log``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    log = folder / "calls.log"
    path.write_text(f'#!/bin/sh\necho "{name} $*" >> "{log}"\n{script}\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def copy_run(bundle: Bundle, dest: Path) -> Path:
    shutil.copyfile(bundle.run, dest)
    dest.chmod(0o755)
    return dest


def pushed_ref(address: str, image: dict[str, str]) -> str:
    """Where ``push <address>/site/lj-runtimekit`` puts a MANIFEST.json image."""
    return f"{address}/{PROJECT}/{image['name']}:{image['tag']}"


@pytest.fixture(scope="module")
def pushed(
    bundle: Bundle, registry: LocalRegistry, crane_dir: Path
) -> subprocess.CompletedProcess[str]:
    """``<run> push <registry>/site/lj-runtimekit --tool=crane --insecure``, once per module
    (each module has a registry of its own)."""
    return bundle.installer(
        "push", f"{registry.address}/{PROJECT}", "--tool=crane", "--insecure", path=[crane_dir]
    )
