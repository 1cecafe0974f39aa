"""The errors of the operator: what went wrong, and whether waiting helps."""

from __future__ import annotations


class OperatorError(Exception):
    """Base of every error the operator raises on purpose."""


class TemporaryError(OperatorError):
    """Retrying later may succeed (the apiserver restarting, a timeout, a conflict)."""

    def __init__(self, message: str, delay: float = 1.0) -> None:
        super().__init__(message)
        self.delay = delay


class PermanentError(OperatorError):
    """Retrying the same thing will fail the same way (bad input, bad config, refused)."""


class ConfigError(PermanentError):
    """The configuration (flags, environment or ConfigMap file) is invalid."""


class PolicyError(PermanentError):
    """The RuntimeKitPolicy's spec cannot be reconciled as written; the message says which field."""
