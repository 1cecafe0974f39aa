"""Lifecycle of the exporter."""

from __future__ import annotations

from .settings import Settings


def run(settings: Settings) -> int:
    raise SystemExit("lj-runtimekit-exporter: not built yet")
