"""The job agent: enables or disables Runtime Kit on its node."""

from importlib.metadata import version as _version

__version__ = _version("lj-runtimekit-job-agent")
