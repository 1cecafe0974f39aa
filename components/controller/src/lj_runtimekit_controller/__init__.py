"""The controller: node label lj_runtimekit_enable → job-agent Jobs."""

from importlib.metadata import version as _version

__version__ = _version("lj-runtimekit-controller")
