"""The errors of the scheduler: what went wrong, and whether waiting helps."""

from __future__ import annotations


class SchedulerError(Exception):
    """Base of every error the scheduler raises on purpose."""


class TemporaryError(SchedulerError):
    """Retrying later may succeed (a peer restarting, a timeout)."""

    def __init__(self, message: str, delay: float = 1.0) -> None:
        super().__init__(message)
        self.delay = delay


class PermanentError(SchedulerError):
    """Retrying the same thing will fail the same way (bad input, bad config)."""


class ConfigError(PermanentError):
    """The configuration (flags, environment or ConfigMap file) is invalid."""
