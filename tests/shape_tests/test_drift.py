"""Every component's copy of a shape file is byte-identical to the reference (docs/shape.md).

The five components share no library, only this shape: a change to a shape file is made in
``tests/shape_tests/canonical/`` and copied to every component in the same commit. Copies are
found by file name in ``components/*/src/*/``.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CANONICAL = ROOT / "tests" / "shape_tests" / "canonical"
SHAPE_FILES = sorted(p.name for p in CANONICAL.glob("*.py") if p.name != "__init__.py")
#: Files of a shape name that phase 2 of issue 21 brings to the shape (docs/shape.md, "Phase 2"):
#: exempt while they are their component's own (no shape marker); a copy that carries the marker
#: is the shape and must be identical. Phase 2 removes the entries.
MARKER = "Shape file (docs/shape.md)"
PENDING: set[tuple[str, str]] = set()


def copies(name: str) -> list[Path]:
    return sorted(ROOT.glob(f"components/*/src/*/{name}"))


def component(path: Path) -> str:
    return path.relative_to(ROOT / "components").parts[0]


@pytest.mark.parametrize("name", SHAPE_FILES)
def test_every_copy_of_a_shape_file_is_the_reference(name: str) -> None:
    reference = (CANONICAL / name).read_text()
    differing = []
    for path in copies(name):
        text = path.read_text()
        if (component(path), name) in PENDING and MARKER not in text:
            continue
        if text != reference:
            diff = difflib.unified_diff(
                reference.splitlines(),
                text.splitlines(),
                f"tests/shape_tests/canonical/{name}",
                str(path.relative_to(ROOT)),
                lineterm="",
            )
            differing.append("\n".join(list(diff)[:40]))
    assert not differing, (
        f"copies of the shape file {name} differ from the reference; change the reference and "
        "copy it to every component:\n" + "\n\n".join(differing)
    )


def test_the_shape_is_carried_where_it_is_claimed() -> None:
    # the components brought to the shape (phase 1); phase 2 adds scheduler, controller, job-agent
    for owner in ("device-plugin", "exporter", "job-agent"):
        for name in ("cli.py", "config.py", "lifecycle.py", "logs.py", "runtime_channel.py"):
            assert any(component(p) == owner for p in copies(name)), f"{owner} lacks {name}"
    # issue 33: the informer, Kubernetes names, the leader-elected host, the atomic write
    claims = {
        "informer.py": ("scheduler", "controller", "operator", "exporter", "device-plugin"),
        "k8s_names.py": ("scheduler", "controller", "operator", "job-agent", "device-plugin"),
        "manager.py": ("controller", "operator"),
        "files.py": ("job-agent", "device-plugin"),
    }
    for name, owners in claims.items():
        for owner in owners:
            assert any(component(p) == owner for p in copies(name)), f"{owner} lacks {name}"
    # the operator (issue 23): leader-elected, rate-limited, no Runtime channel
    for name in ("cli.py", "config.py", "lifecycle.py", "logs.py", "leader.py", "ratelimit.py"):
        assert any(component(p) == "operator" for p in copies(name)), f"operator lacks {name}"
