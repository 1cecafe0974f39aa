"""Structured logging: JSON in a cluster, readable on a terminal."""

from __future__ import annotations

import logging
import sys

import structlog


def configure(level: str = "info", log_format: str = "auto") -> None:
    """Route structlog and stdlib logging to stderr at ``level``, in ``log_format``.

    ``log_format`` is the ``--log-format`` value: ``text``, ``json``, or ``auto`` (JSON when
    stderr is not a terminal, as in a pod).
    """
    if log_format == "auto":
        use_json = not sys.stderr.isatty()
    elif log_format in ("text", "json"):
        use_json = log_format == "json"
    else:
        raise ValueError(f"log format {log_format!r}: expected auto, text or json")
    numeric = logging.getLevelNamesMapping()[level.upper()]
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    logging.basicConfig(level=max(numeric, logging.WARNING), stream=sys.stderr)
