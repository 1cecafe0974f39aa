"""The images, checked as far as a machine without a Docker engine allows: the bake file parses
and covers all five components with their own versions, every Dockerfile COPY source exists, and
each image runs its component's console script with only that component installed."""

from __future__ import annotations

import re
import subprocess
import tomllib
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


def test_default_group_builds_all_five() -> None:
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
    args = {i[1].split("=")[0]: i[1].split("=", 1)[1] for i in instructions if i[0] == "ARG"}
    base = args["PYTHON_IMAGE"]
    assert re.fullmatch(r"python:\d+\.\d+\.\d+-slim-\w+", base), "the base image is pinned"
    assert froms[-1] == "${PYTHON_IMAGE}"


def test_dockerfiles_are_the_same_shape() -> None:
    """One shape for all five (only the component name differs), so none drifts."""
    shapes = {
        c: (REPO / "components" / c / "Dockerfile").read_text().replace(c, "<c>")
        for c in COMPONENTS
    }
    reference = shapes["exporter"]
    for c, shape in shapes.items():
        assert shape == reference, f"components/{c}/Dockerfile differs from the exporter's"
