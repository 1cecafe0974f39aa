"""``lj-runtimekit-operator``: flags → settings → app.run; nothing else."""

from __future__ import annotations

import sys

from . import app, lifecycle, settings
from .errors import ConfigError


def main(argv: list[str] | None = None) -> int:
    try:
        config, deprecations = settings.load_noting(argv)
    except ConfigError as e:
        print(f"lj-runtimekit-operator: {e}", file=sys.stderr)
        return lifecycle.EXIT_USAGE
    return app.run(config, deprecations)


if __name__ == "__main__":
    sys.exit(main())
