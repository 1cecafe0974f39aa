"""The device plugin: the node's accelerators as kubelet extended resources."""

from importlib.metadata import version as _version

__version__ = _version("lj-runtimekit-device-plugin")
