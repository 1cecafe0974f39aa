"""Each daemon's README documents exactly the flags its ``--help`` shows, with the same defaults,
environment variables and meaning (issue 21: "documented in each README from the code").

Phase 2 adds the scheduler, the controller and the job agent to ``DAEMONS`` when they carry the
shape (docs/shape.md).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DAEMONS = {
    "controller": "lj_runtimekit_controller",
    "device-plugin": "lj_runtimekit_device_plugin",
    "exporter": "lj_runtimekit_exporter",
    "job-agent": "lj_runtimekit_job_agent",
    "operator": "lj_runtimekit_operator",
    "scheduler": "lj_runtimekit_scheduler",
}
BUILTIN = {"--help", "--version"}


@dataclass(frozen=True)
class Row:
    default: str
    env: str
    meaning: str


def _norm(text: str) -> str:
    return " ".join(text.replace("`", "").split())


def help_rows(module: str) -> tuple[dict[str, Row], dict[str, str]]:
    """(flag → row, deprecated flag → its help) from the daemon's own ``--help``."""
    out = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "100000"},
    ).stdout
    blocks: list[tuple[str, str, str]] = []  # (section, invocation, help)
    section = ""
    for line in out.splitlines():
        if line and not line.startswith(" "):
            section = line
        elif line.startswith("  -"):
            invocation, _, text = line.strip().partition("  ")
            blocks.append((section, invocation, text.strip()))
        elif line.startswith("   ") and blocks:
            s, invocation, text = blocks[-1]
            blocks[-1] = (s, invocation, f"{text} {line.strip()}".strip())
    rows: dict[str, Row] = {}
    deprecated: dict[str, str] = {}
    for section, invocation, text in blocks:
        flag = next(w.rstrip(",") for w in reversed(invocation.split()) if w.startswith("--"))
        if flag in BUILTIN:
            continue
        if section.startswith("deprecated"):
            deprecated[flag] = _norm(text)
            continue
        m = re.fullmatch(r"(.*) \(default: (.*); env (\S+)\)", text)
        assert m, f"{module} --help of {flag} does not end in (default: ...; env ...): {text}"
        rows[flag] = Row(m[2], m[3], _norm(m[1]))
    return rows, deprecated


def readme_rows(component: str) -> tuple[dict[str, Row], dict[str, str]]:
    """The README's flag table (| flag | env | ConfigMap key | default | meaning |) and its
    deprecated-spellings table (| old flag | use instead |)."""
    rows: dict[str, Row] = {}
    deprecated: dict[str, str] = {}
    for line in (ROOT / "components" / component / "README.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("| `-") or not cells:
            continue
        flag = cells[0].strip("`").split("`, `")[-1]
        if len(cells) == 5:
            rows[flag] = Row(cells[3].strip("`"), cells[1].strip("`"), _norm(cells[4]))
        elif len(cells) == 2:
            deprecated[flag] = _norm(cells[1])
    return rows, deprecated


@pytest.mark.parametrize("component", sorted(DAEMONS))
def test_readme_flag_table_is_the_help(component: str) -> None:
    helped, helped_old = help_rows(DAEMONS[component])
    documented, documented_old = readme_rows(component)
    assert sorted(documented) == sorted(helped), "README flags differ from --help"
    for flag, row in helped.items():
        assert documented[flag] == row, f"{component} README row of {flag} differs from --help"
    assert documented_old == helped_old, "README deprecated spellings differ from --help"


@pytest.mark.parametrize("component", sorted(DAEMONS))
def test_every_flag_names_its_environment_variable_and_configmap_key(component: str) -> None:
    prefix = "LJ_RUNTIMEKIT_" + component.upper().replace("-", "_") + "_"
    helped, _ = help_rows(DAEMONS[component])
    for flag, row in helped.items():
        assert row.env == prefix + flag.removeprefix("--").replace("-", "_").upper(), flag
