"""Lifecycle of the job-agent."""

from __future__ import annotations

from .settings import Settings


def run(settings: Settings) -> int:
    raise SystemExit("lj-runtimekit-job-agent: not built yet")
