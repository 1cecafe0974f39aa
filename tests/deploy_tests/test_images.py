"""The images, checked as far as a machine without a Docker engine allows: the bake file parses
and covers all five components with their own versions, every Dockerfile COPY source exists, and
each image runs its component's console script with only that component installed."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tarfile
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hcl2
import pytest

from lj_runtimekit_testkit.manifests import IMAGES, REPO, component_version

COMPONENTS = list(IMAGES)


def unquote(v: str) -> str:
    return v[1:-1] if len(v) >= 2 and v[0] == v[-1] == '"' else v


def bake() -> dict[str, Any]:
    """The bake file as variables (defaults resolved), groups and targets."""
    with (REPO / "docker-bake.hcl").open() as f:
        raw = hcl2.load(f)
    variables: dict[str, str] = {}
    for block in raw["variable"]:
        ((name, body),) = block.items()
        default = body["default"]
        # A default is a string or another variable's name.
        variables[unquote(name)] = (
            unquote(default) if default.startswith('"') else variables[default]
        )
    groups = {
        unquote(n): [unquote(t) for t in b["targets"]] for g in raw["group"] for n, b in g.items()
    }
    targets = {unquote(n): b for t in raw["target"] for n, b in t.items()}
    return {"variables": variables, "groups": groups, "targets": targets}


def interpolate(text: str, variables: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}", lambda m: variables[m.group(1)], unquote(text))


def test_default_group_builds_every_component() -> None:
    assert sorted(bake()["groups"]["default"]) == sorted(COMPONENTS)


@pytest.mark.parametrize("component", COMPONENTS)
def test_bake_target_tags_the_image_with_the_component_version(component: str) -> None:
    b = bake()
    target = b["targets"][component]
    assert unquote(target["dockerfile"]) == f"components/{component}/Dockerfile"
    assert [unquote(i) for i in target["inherits"]] == ["_common"]
    (tag,) = [interpolate(t, b["variables"]) for t in target["tags"]]
    registry = b["variables"]["REGISTRY"]
    assert tag == f"{registry}/{IMAGES[component]}:v{component_version(component)}"


def test_make_docker_passes_each_component_version_to_bake() -> None:
    out = subprocess.run(
        ["make", "-n", "docker"], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout
    for c in COMPONENTS:
        var = c.upper().replace("-", "_") + "_VERSION"
        assert f"{var}=v{component_version(c)}" in out
    assert "docker buildx bake " + " ".join(["device-plugin", "scheduler"]) in out


def dockerfile(component: str) -> list[list[str]]:
    """The instructions of a Dockerfile, continuation lines joined, comments dropped."""
    text = (REPO / "components" / component / "Dockerfile").read_text()
    text = re.sub(r"\\\n", " ", text)
    lines = [ln.strip() for ln in text.splitlines()]
    return [ln.split() for ln in lines if ln and not ln.startswith("#")]


@pytest.mark.parametrize("component", COMPONENTS)
def test_every_copy_source_exists_in_the_build_context(component: str) -> None:
    copies = [ins for ins in dockerfile(component) if ins[0] == "COPY"]
    assert copies
    for ins in copies:
        args = [a for a in ins[1:] if not a.startswith("--")]
        if any(a.startswith("--from") for a in ins[1:]):
            continue  # from another stage or image
        for src in args[:-1]:
            assert (REPO / src).exists(), f"{component}: COPY {src} does not exist"


@pytest.mark.parametrize("component", COMPONENTS)
def test_image_runs_the_component_console_script_with_only_that_component(component: str) -> None:
    instructions = dockerfile(component)
    script = f"lj-runtimekit-{component}"
    pyproject = tomllib.loads((REPO / "components" / component / "pyproject.toml").read_text())
    assert script in pyproject["project"]["scripts"]
    (entrypoint,) = [" ".join(i[1:]) for i in instructions if i[0] == "ENTRYPOINT"]
    assert entrypoint == f'["{script}"]'
    runs = " ".join(" ".join(i[1:]) for i in instructions if i[0] == "RUN")
    assert f"--package lj-runtimekit-{component}" in runs
    assert "--no-dev" in runs
    assert "--locked" in runs
    froms = [i[1] for i in instructions if i[0] == "FROM"]
    args = {
        i[1].split("=")[0]: i[1].split("=", 1)[1]
        for i in instructions
        if i[0] == "ARG" and "=" in i[1]
    }
    base = args["PYTHON_IMAGE"]
    assert re.fullmatch(r"python:\d+\.\d+\.\d+-slim-\w+", base), "the base image is pinned"
    assert froms[-1] == "${PYTHON_IMAGE}"


def test_dockerfiles_are_the_same_shape() -> None:
    """One shape for every component (only its name differs), so none drifts."""
    shapes = {
        c: (REPO / "components" / c / "Dockerfile").read_text().replace(c, "<c>")
        for c in COMPONENTS
    }
    reference = shapes["exporter"]
    for c, shape in shapes.items():
        assert shape == reference, f"components/{c}/Dockerfile differs from the exporter's"


# ------------------------------------------------------------ make images (buildah, no Docker)

IMAGES_SCRIPT = REPO / "tests" / "images" / "build-images.sh"
DEFAULT_REGISTRY = bake()["variables"]["REGISTRY"]


def make_n(target: str) -> str:
    return subprocess.run(
        ["make", "-n", target], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout


def test_make_images_builds_the_same_versions_as_make_docker() -> None:
    docker, images = make_n("docker"), make_n("images")
    for c in COMPONENTS:
        assignment = c.upper().replace("-", "_") + f"_VERSION=v{component_version(c)}"
        assert assignment in docker
        assert assignment in images
    assert "tests/images/build-images.sh" in images


@pytest.mark.parametrize("component", COMPONENTS)
def test_dockerfile_takes_the_base_and_uv_from_build_args_with_pinned_defaults(
    component: str,
) -> None:
    """A site with its own mirror, or none, builds the same file; Docker users get the pins."""
    instructions = dockerfile(component)
    args = {
        i[1].split("=")[0]: i[1].split("=", 1)[1]
        for i in instructions
        if i[0] == "ARG" and "=" in i[1]
    }
    makefile = (REPO / "Makefile").read_text()
    (uv_version,) = re.findall(r"^UV_VERSION := (\S+)$", makefile, re.M)
    assert args["UV_IMAGE"] == f"ghcr.io/astral-sh/uv:{uv_version}", "one uv pin: the Makefile's"
    froms = [i[1:] for i in instructions if i[0] == "FROM"]
    assert ["${UV_IMAGE}", "AS", "uv"] in froms
    assert all(f[0] in ("${UV_IMAGE}", "${PYTHON_IMAGE}") for f in froms), "no image named inline"
    copies_from = [
        a for i in instructions if i[0] == "COPY" for a in i[1:] if a.startswith("--from=")
    ]
    assert all(a in ("--from=uv", "--from=build") for a in copies_from)


def buildah_available() -> bool:
    return shutil.which("buildah") is not None or shutil.which("apt-get") is not None


def build_images(out: Path, registry: str, components: list[str]) -> list[dict[str, str]]:
    """Runs the `make images` script (incremental: unchanged images are not rebuilt)."""
    env = {
        **os.environ,
        "REGISTRY": registry,
        "COMPONENTS": " ".join(components),
        "OUT": str(out),
        "UV": str(REPO / ".venv" / "bin" / "uv"),
    }
    for name in ("PYTHON_IMAGE", "UV_IMAGE"):
        env.pop(name, None)
    done = subprocess.run(
        [str(IMAGES_SCRIPT)],
        check=False,
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, f"make images failed:\n{done.stderr[-4000:]}"
    entries: list[dict[str, str]] = json.loads((out / "index.json").read_text())
    return [e for e in entries if e["component"] in components]


@pytest.fixture(scope="module")
def built() -> dict[str, dict[str, str]]:
    """The images `make images` makes (build/images), brought up to date with the sources."""
    if os.geteuid() != 0 or not buildah_available():
        pytest.fail("make images needs root and buildah (or apt-get to install it)")
    registry = os.environ.get("REGISTRY", DEFAULT_REGISTRY)
    entries = build_images(REPO / "build" / "images", registry, COMPONENTS)
    return {e["component"]: e for e in entries}


class Rootfs:
    """An image archive unpacked as a container runtime would: layers in order, whiteouts
    applied; with the image's config."""

    def __init__(self, archive: Path, root: Path) -> None:
        self.root = root
        root.mkdir(exist_ok=True)
        root.chmod(0o755)  # as a runtime makes a container's root; layers carry no "./"
        with tarfile.open(archive) as oci:
            index = self._json(oci, "index.json")
            (self.descriptor,) = index["manifests"]
            manifest = self._json(oci, blob(self.descriptor["digest"]))
            self.config = self._json(oci, blob(manifest["config"]["digest"]))
            for layer in manifest["layers"]:
                member = oci.extractfile(blob(layer["digest"]))
                assert member is not None
                with tarfile.open(fileobj=member, mode="r|*") as tar:
                    for entry in tar:
                        self._apply(tar, entry)

    @staticmethod
    def _json(tar: tarfile.TarFile, name: str) -> Any:
        f = tar.extractfile(name)
        assert f is not None
        return json.load(f)

    def _apply(self, tar: tarfile.TarFile, entry: tarfile.TarInfo) -> None:
        path = Path(os.path.normpath(self.root / entry.name))
        # Nothing lands outside the rootfs, even through a symlink of an earlier layer.
        parent = Path(os.path.realpath(path.parent))
        assert parent == self.root or self.root in parent.parents, entry.name
        name = path.name
        if name == ".wh..wh..opq":
            for child in path.parent.iterdir():
                remove(child)
        elif name.startswith(".wh."):
            remove(path.parent / name[len(".wh.") :])
        else:
            if path.is_symlink() or (path.exists() and not (path.is_dir() and entry.isdir())):
                remove(path)
            tar.extract(entry, self.root, filter="fully_trusted")

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        """The entrypoint with args, as the image's user, with only the image's environment."""
        cfg = self.config["config"]
        env = dict(e.split("=", 1) for e in cfg.get("Env", []))
        # runc sets HOME from the user's passwd entry, "/" for a uid without one (65532).
        env.setdefault("HOME", "/")
        return subprocess.run(
            ["chroot", f"--userspec={cfg['User']}", str(self.root), *cfg["Entrypoint"], *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )


def blob(digest: str) -> str:
    algorithm, hexdigest = digest.split(":")
    return f"blobs/{algorithm}/{hexdigest}"


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


Unpack = Callable[[str], Rootfs]


@pytest.fixture(scope="module")
def unpacked(built: dict[str, dict[str, str]], tmp_path_factory: pytest.TempPathFactory) -> Unpack:
    """A component's image unpacked (once per module)."""
    cache: dict[str, Rootfs] = {}

    def unpack(component: str) -> Rootfs:
        if component not in cache:
            root = tmp_path_factory.mktemp(f"rootfs-{component}").resolve()
            cache[component] = Rootfs(REPO / built[component]["archive"], root)
        return cache[component]

    return unpack


# A cold build (the base image, then five images) takes minutes; the module's fixtures count
# against the first test's timeout.
BUILD_TIMEOUT = pytest.mark.timeout(1800)


@pytest.mark.images
@BUILD_TIMEOUT
def test_make_images_tags_each_image_as_deploy_expects(built: dict[str, dict[str, str]]) -> None:
    registry = os.environ.get("REGISTRY", DEFAULT_REGISTRY)
    assert sorted(built) == sorted(COMPONENTS)
    for c, entry in built.items():
        assert entry["image"] == f"{registry}/{IMAGES[c]}:v{component_version(c)}"
        assert entry["archive"] == f"build/images/{c}.tar"
        assert (REPO / entry["archive"]).is_file()


@pytest.mark.images
@BUILD_TIMEOUT
@pytest.mark.parametrize("component", COMPONENTS)
def test_archive_names_its_image_in_full_for_ctr_import(
    component: str, built: dict[str, dict[str, str]]
) -> None:
    """`ctr images import` takes the name from io.containerd.image.name; the CRI rewrites a name
    without a domain to docker.io, so the name has one."""
    entry = built[component]
    with tarfile.open(REPO / entry["archive"]) as oci:
        assert oci.extractfile("oci-layout") is not None
        (descriptor,) = Rootfs._json(oci, "index.json")["manifests"]
    assert descriptor["digest"] == entry["digest"]
    annotations = descriptor["annotations"]
    assert annotations["io.containerd.image.name"] == entry["image"]
    assert annotations["org.opencontainers.image.ref.name"] == f"v{component_version(component)}"
    domain = entry["image"].split("/")[0]
    assert "." in domain or ":" in domain or domain == "localhost"


@pytest.mark.images
@BUILD_TIMEOUT
@pytest.mark.parametrize("component", COMPONENTS)
def test_image_runs_its_console_script_as_user_65532(component: str, unpacked: Unpack) -> None:
    image = unpacked(component)
    cfg = image.config["config"]
    assert cfg["User"] == "65532:65532"
    assert cfg["Entrypoint"] == [f"lj-runtimekit-{component}"]
    assert cfg["Labels"]["org.opencontainers.image.version"] == f"v{component_version(component)}"
    helped = image.run("--help")
    assert helped.returncode == 0, helped.stderr
    assert f"usage: lj-runtimekit-{component}" in helped.stdout
    version = image.run("--version")
    assert version.returncode == 0, version.stderr
    assert component_version(component) in version.stdout


@pytest.mark.images
@BUILD_TIMEOUT
@pytest.mark.parametrize("component", COMPONENTS)
def test_image_holds_only_its_component_and_the_interface(component: str, unpacked: Unpack) -> None:
    (site,) = (unpacked(component).root / "opt" / "venv" / "lib").glob("python3.*/site-packages")
    ours = sorted(
        p.name for p in site.iterdir() if p.name.startswith("lj_runtimekit_") and "." not in p.name
    )
    own = "lj_runtimekit_" + component.replace("-", "_")
    pyproject = tomllib.loads((REPO / "components" / component / "pyproject.toml").read_text())
    talks_to_the_runtime = "lj-runtimekit-interface" in pyproject["project"]["dependencies"]
    assert ours == sorted([own, *(["lj_runtimekit_interface"] if talks_to_the_runtime else [])])
    assert not (site.parent.parent.parent / "bin" / "pytest").exists(), "no dev dependencies"


@pytest.mark.images
@BUILD_TIMEOUT
def test_images_build_and_run_under_a_localhost_registry(
    tmp_path: Path, built: dict[str, dict[str, str]]
) -> None:
    """REGISTRY=localhost/lj-runtimekit: what the test nodes import (a name with a domain)."""
    (entry,) = build_images(tmp_path, "localhost/lj-runtimekit", ["job-agent"])
    assert (
        entry["image"]
        == f"localhost/lj-runtimekit/{IMAGES['job-agent']}:v{component_version('job-agent')}"
    )
    image = Rootfs(Path(entry["archive"]), (tmp_path / "rootfs").resolve())
    done = image.run("--help")
    assert done.returncode == 0, done.stderr
