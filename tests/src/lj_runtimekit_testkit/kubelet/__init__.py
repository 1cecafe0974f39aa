"""The kubelet part of the harness: :class:`KubeletEmulator` for one node's device plugins."""

from lj_runtimekit_testkit.kubelet.emulator import AllocationRecord, KubeletEmulator

__all__ = ["AllocationRecord", "KubeletEmulator"]
