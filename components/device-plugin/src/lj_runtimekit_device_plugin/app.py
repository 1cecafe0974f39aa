"""Lifecycle of the device-plugin."""

from __future__ import annotations

from .settings import Settings


def run(settings: Settings) -> int:
    raise SystemExit("lj-runtimekit-device-plugin: not built yet")
