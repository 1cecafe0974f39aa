"""The exporter: Prometheus metrics from the Runtime, attributed to pods."""

from importlib.metadata import version as _version

__version__ = _version("lj-runtimekit-exporter")
