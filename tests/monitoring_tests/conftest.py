"""Fixtures of the monitoring kit's tests: Debian's promtool and prometheus, fetched into the
harness' cache by tests/tools/debian-tool.sh (no install, no service started)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def debian_binary(package: str, binary: str) -> Path:
    """The binary from Debian's package; skips, saying why, when it cannot be had here."""
    tool = REPO / "tests" / "tools" / "debian-tool.sh"
    out = subprocess.run(
        [str(tool), package, binary], capture_output=True, text=True, check=False, timeout=600
    )
    if out.returncode != 0:
        pytest.skip(
            f"{binary} missing and Debian's {package} package cannot be fetched here "
            f"({out.stderr.strip()}): apt-get install {package}"
        )
    return Path(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def promtool() -> Path:
    return debian_binary("prometheus", "usr/bin/promtool")


@pytest.fixture(scope="session")
def prometheus_bin() -> Path:
    return debian_binary("prometheus", "usr/bin/prometheus")
