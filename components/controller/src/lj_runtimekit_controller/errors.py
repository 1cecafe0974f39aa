"""The errors of the controller: what went wrong, and whether waiting helps."""

from __future__ import annotations


class ControllerError(Exception):
    """Base of every error the controller raises on purpose."""


class TemporaryError(ControllerError):
    """Retrying later may succeed (a peer restarting, a timeout)."""

    def __init__(self, message: str, delay: float = 1.0) -> None:
        super().__init__(message)
        self.delay = delay


class PermanentError(ControllerError):
    """Retrying the same thing will fail the same way (bad input, bad config)."""


class ConfigError(PermanentError):
    """The configuration (flags, environment or ConfigMap file) is invalid."""
