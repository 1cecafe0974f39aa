"""Lifecycle of the controller."""

from __future__ import annotations

from .settings import Settings


def run(settings: Settings) -> int:
    raise SystemExit("lj-runtimekit-controller: not built yet")
