"""Lifecycle of the scheduler."""

from __future__ import annotations

from .settings import Settings


def run(settings: Settings) -> int:
    raise SystemExit("lj-runtimekit-scheduler: not built yet")
