"""The operator: one cluster-scoped RuntimeKitPolicy → the suite's components, installed, configured
and upgraded in a safe order."""

from importlib.metadata import version as _version

__version__ = _version("lj-runtimekit-operator")
