"""The README, CONTRIBUTING.md and docs/ say what the tree builds (#39: they still said "five
daemons" and left the operator out of the README's table while six images were built; the
architecture page still drew the first wave). Counted from the tree itself: the components are
the workspace members under components/ (and docker-bake.hcl's images), the daemons those whose
image a Deployment or DaemonSet of deploy/ runs."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

from lj_runtimekit_testkit.manifests import DEPLOY, containers, load_objects

REPO = DEPLOY.parent
COMPONENTS = sorted(p.parent.name for p in (REPO / "components").glob("*/pyproject.toml"))
DIGITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
NUMBERS = {w: n for n, w in enumerate(DIGITS)}
#: "<number> [up to three words] daemons|components|images", e.g. "six small Python components"
COUNT = re.compile(
    r"\b(" + "|".join(NUMBERS) + r")"
    r"((?:\s+(?!(?:" + "|".join(NUMBERS) + r")\b)[\w-]+){0,3}?)\s+(daemons|components|images)\b",
    re.IGNORECASE,
)
PAGES = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md"))]


def bake_images() -> list[str]:
    bake = (REPO / "docker-bake.hcl").read_text()
    m = re.search(r'group "default" \{\s*targets = \[([^\]]*)\]', bake)
    assert m, "docker-bake.hcl's default group"
    return sorted(re.findall(r'"([^"]+)"', m.group(1)))


@functools.cache
def daemons() -> list[str]:
    """Components whose image a workload of deploy/ runs (the job agent's runs in Jobs)."""
    images: set[str] = set()
    for path in sorted(DEPLOY.glob("*/0*.yaml")):
        for o in load_objects([path]):
            if o["kind"] in ("Deployment", "DaemonSet"):
                images |= {c["image"].rsplit("/", 1)[-1].split(":")[0] for c in containers(o)}
    return sorted(c for c in COMPONENTS if f"lj-runtimekit-{c}" in images)


def test_the_tree_builds_one_image_per_component() -> None:
    assert bake_images() == COMPONENTS
    assert "operator" in COMPONENTS
    assert daemons() == sorted(set(COMPONENTS) - {"job-agent"})


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_count_of_components_daemons_and_images_is_the_trees(page: Path) -> None:
    want = {"components": len(COMPONENTS), "images": len(COMPONENTS), "daemons": len(daemons())}
    wrong = [
        m.group(0)
        for m in COUNT.finditer(page.read_text())
        if NUMBERS[m.group(1).lower()] != want[m.group(3).lower()]
    ]
    assert not wrong, f"{page.name} counts {wrong}; the tree has {want}"


def test_the_readmes_table_has_a_row_per_component() -> None:
    readme = (REPO / "README.md").read_text()
    rows = re.findall(r"^\| `components/([\w-]+)` \|", readme, re.MULTILINE)
    assert sorted(rows) == COMPONENTS


def test_contributings_tree_names_every_component() -> None:
    text = (REPO / "CONTRIBUTING.md").read_text()
    [line] = re.findall(r"^components/<name>/ +one [^\n]*(?:\n {20,}[^\n]*)*", text, re.MULTILINE)
    named = set(re.findall(r"[\w-]+", line.split(":", 1)[1]))
    assert named >= set(COMPONENTS), sorted(set(COMPONENTS) - named)


def test_the_architecture_page_draws_what_is_there() -> None:
    """Its diagram holds every component and the parts added since the first wave (the DRA
    driver, its NRI plugin, partitioning, the operator's policy); a bullet describes each."""
    text = (REPO / "docs" / "architecture.md").read_text()
    diagram = text.split("```", 2)[1]
    for part in [*COMPONENTS, "DRA", "NRI", "partition", "RuntimeKitPolicy", "ResourceSlices"]:
        assert part in diagram, f"docs/architecture.md's diagram lacks {part}"
    bullets = " ".join(re.findall(r"^- \*\*([^*]+)\*\*", text, re.MULTILINE))
    for c in COMPONENTS:
        assert c in bullets, f"docs/architecture.md has no bullet for {c}"
