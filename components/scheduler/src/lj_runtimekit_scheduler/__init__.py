"""A Kubernetes scheduler in the shape of the Scheduler Framework: GPU fit, choice, gangs."""

from importlib.metadata import version as _version

__version__ = _version("lj-runtimekit-scheduler")
