"""Settings of the controller: flag > environment > ConfigMap file > default."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from . import __version__


@dataclass(frozen=True)
class Settings:
    """The effective configuration, fixed at start."""

    log_level: str = "info"
    """Log level: debug, info, warning or error."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lj-runtimekit-controller", description=__doc__)
    p.add_argument("--version", action="version", version=f"lj-runtimekit-controller {__version__}")
    p.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="log level (default: info)",
    )
    return p


def load(argv: list[str] | None = None) -> Settings:
    args = parser().parse_args(argv)
    return Settings(log_level=args.log_level)
