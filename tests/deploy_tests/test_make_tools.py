"""Which tools each make target installs (#39 item 3): ``make images`` — and so ``make demo`` and
``make bundle``, which build on it — asks apt for buildah only (debootstrap when it makes the base
image), never for skopeo or podman, which only the bundle tests use; those ask for exactly them.
Run against a PATH that holds every command of this machine but the tools and apt-get, with an
apt-get that records what it is asked and installs nothing."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
INSTALL_TOOLS = REPO / "tests" / "images" / "install-tools.sh"
TOOLS = {"buildah", "debootstrap", "skopeo", "podman"}
APT_GET = """#!/bin/sh
echo "$*" >> "{log}"
case "$1" in update) exit 0 ;; *) exit 1 ;; esac
"""


@pytest.fixture
def bare_path(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """An environment whose PATH lacks the four tools, and whose apt-get only logs to the file."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for system in (Path("/usr/local/bin"), Path("/usr/bin"), Path("/bin")):
        for command in system.iterdir():
            link = folder / command.name
            if command.name in TOOLS | {"apt-get", "sudo"} or link.exists() or link.is_symlink():
                continue
            if os.access(command, os.X_OK) and not command.is_dir():
                link.symlink_to(command)
    log = tmp_path / "apt-get.log"
    apt = folder / "apt-get"
    apt.write_text(APT_GET.format(log=log))
    apt.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in {"MAKEFLAGS", "MFLAGS", "MAKELEVEL"}}
    env.pop("LJ_RUNTIMEKIT_INSTALL_TOOLS", None)
    env["PATH"] = str(folder)
    return env, log


def asked(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_make_images_asks_apt_for_buildah_and_nothing_the_bundle_tests_use(
    bare_path: tuple[dict[str, str], Path], tmp_path: Path
) -> None:
    env, log = bare_path
    done = subprocess.run(
        ["make", "--no-print-directory", "-C", str(REPO), "images", "SETUP=",
         f"BUILD={tmp_path / 'build'}"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode != 0, "the build stops: apt-get installed nothing"
    installs = [line for line in asked(log) if line.startswith("install")]
    assert installs == ["install -y -qq buildah"], (installs, done.stderr[-2000:])
    assert "LJ_RUNTIMEKIT_INSTALL_TOOLS=no" in done.stderr, "it says how to refuse"


def test_with_install_tools_no_nothing_is_installed_and_the_missing_tools_are_named(
    bare_path: tuple[dict[str, str], Path],
) -> None:
    env, log = bare_path
    done = subprocess.run(
        [str(INSTALL_TOOLS), "buildah", "debootstrap"],
        env={**env, "LJ_RUNTIMEKIT_INSTALL_TOOLS": "no"},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert asked(log) == [], "apt-get not even asked"
    assert "need buildah debootstrap" in done.stderr, done.stderr


def test_the_bundle_tests_ask_for_skopeo_and_podman_only(
    bare_path: tuple[dict[str, str], Path],
) -> None:
    conftest = (REPO / "tests" / "bundle_tests" / "conftest.py").read_text()
    assert 'PACKAGED_TOOLS = ("skopeo", "podman")' in conftest
    assert "[str(INSTALL_TOOLS), *PACKAGED_TOOLS]" in conftest, "the fixture names its tools"
    env, log = bare_path
    subprocess.run(
        [str(INSTALL_TOOLS), "skopeo", "podman"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert [line for line in asked(log) if line.startswith("install")] == [
        "install -y -qq skopeo podman"
    ]


def test_install_tools_installs_only_what_it_is_named(
    bare_path: tuple[dict[str, str], Path],
) -> None:
    env, log = bare_path
    done = subprocess.run(
        [str(INSTALL_TOOLS)], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2, "no tool named: no default list"
    assert "usage" in done.stderr
    assert asked(log) == []


def test_the_readme_says_what_each_target_needs() -> None:
    """A row per target an operator runs first, and the apt tools it names for `make images` are
    the ones the image build asks for (and not the bundle tests' skopeo and podman)."""
    readme = (REPO / "README.md").read_text()
    rows = dict(re.findall(r"^\| `make (\w+)` \| (.*) \|$", readme, re.MULTILINE))
    assert {"test", "demo", "docker", "bundle", "images"} <= set(rows), sorted(rows)
    scripts = " ".join(
        (REPO / "tests" / "images" / name).read_text()
        for name in ("build-images.sh", "base-image.sh")
    )
    named = set(re.findall(r'"\$here/install-tools\.sh" ([\w ]+)', scripts))
    wanted = {tool for line in named for tool in line.split()}
    assert wanted == {"buildah", "debootstrap"}
    for tool in wanted:
        assert f"{tool} (*apt*" in rows["images"], (tool, rows["images"])
    for tool in ("skopeo", "podman"):
        assert f"{tool} (*apt*" not in rows["images"] + rows["demo"] + rows["bundle"]
        assert tool in rows["test"]
