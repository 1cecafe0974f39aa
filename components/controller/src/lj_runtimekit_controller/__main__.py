"""``lj-runtimekit-controller``: flags → settings → app.run; nothing else."""

from __future__ import annotations

import sys

from . import app, settings
from .errors import ConfigError


def main(argv: list[str] | None = None) -> int:
    try:
        config = settings.load(argv)
    except ConfigError as e:
        print(f"lj-runtimekit-controller: {e}", file=sys.stderr)
        return 2
    return app.run(config)


if __name__ == "__main__":
    sys.exit(main())
