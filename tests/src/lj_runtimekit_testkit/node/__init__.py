"""Real nodes for the harness: kubelet + containerd 2.x + runc, each in its own mount, UTS, IPC,
network and PID namespace, joined to the local control plane.

A node is one ``unshare`` whose child, :mod:`~lj_runtimekit_testkit.node.supervisor`, is PID 1 of
the node: it mounts the node's private /etc (a copy of the host's), /run, /var/lib, /var/log and
/usr/local (an overlay holding ``/usr/local/bin/systemctl`` and the ``xpu-container-runtime``
stand-in), fake kernel sysctl files, optionally a private /dev with fake accelerators; then runs
containerd, the runtime simulator and the kubelet. The node's network is a veth on the control
plane's host bridge (``ljrk<K>``, 10.213.<K>.0/24, no way out) with a DNAT of the ``kubernetes``
Service to the apiserver in the node's own iptables. Stopping a node leaves the host as it was.

    nodes = RealNodes(control_plane)        # control_plane = ControlPlane(node_network=True)
    node = nodes.add(inventory="gpu-8x-nvlink")
    node.exec(["ctr", "-n", "k8s.io", "containers", "ls"])
    node.restart("containerd"); node.runtime_records(); nodes.stop()
"""

from lj_runtimekit_testkit.node.binaries import host_support, node_binaries_dir
from lj_runtimekit_testkit.node.hostcmd import RealNodeError, RealNodeUnavailable
from lj_runtimekit_testkit.node.layout import FakeDevice, accelerator_devices
from lj_runtimekit_testkit.node.node import RealNode
from lj_runtimekit_testkit.node.pool import RealNodes

__all__ = [
    "FakeDevice",
    "RealNode",
    "RealNodeError",
    "RealNodeUnavailable",
    "RealNodes",
    "accelerator_devices",
    "host_support",
    "node_binaries_dir",
]
