"""What a real node's daemons read, rendered from plain data: containerd's config (version 3), the
kubelet's KubeletConfiguration and kubeconfig, the bridge CNI network, and the ``lj-runtime``
handler a test adds the way the job agent would. Pure functions, no I/O."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import yaml

CONTAINERD_SOCKET = "/run/containerd/containerd.sock"
NRI_SOCKET = "/var/run/nri/nri.sock"
"""containerd's NRI socket, the device plugin's default --nri-socket (the node's /run)."""
CNI_CONF_DIR = "/etc/cni/net.d"
RUNC = "/usr/local/bin/runc"
XPU_RUNTIME = "/usr/local/harp/kitC/xpu-container-runtime"
DRIVER_LIBS = "/usr/local/harp/kitC/lib"
"""Where the Runtime's driver libraries are (the simulator's injection bind-mounts it)."""
RUNTIME_RECORDS = "/var/log/xpu-container-runtime/records.jsonl"
KUBELET_DIR = "/etc/kubernetes"
KUBELET_HEALTHZ_PORT = 10248

# What the kubelet asks of the kernel with protectKernelDefaults (it refuses to start otherwise);
# the node sees these values through files bind-mounted over /proc/sys, the host keeps its own.
KUBELET_SYSCTLS = {
    "vm/overcommit_memory": "1",
    "vm/panic_on_oom": "0",
    "kernel/panic": "10",
    "kernel/panic_on_oops": "1",
    "kernel/keys/root_maxkeys": "1000000",
    "kernel/keys/root_maxbytes": "25000000",
}


@dataclass(frozen=True)
class NodeConfig:
    """The facts the rendered files depend on."""

    name: str
    ip: str
    apiserver: str
    """URL the node reaches the apiserver at (the host bridge address)."""
    pod_subnet: str
    cgroup_root: str
    pause_image: str
    cni_bin_dir: str
    cluster_domain: str = "cluster.local"
    read_only_port: int = 10255
    """The kubelet's read-only port; 0 closes it (guide §3.2 step 3 lets a cluster refuse it)."""


def containerd_config(c: NodeConfig) -> str:
    """containerd 2.x config, version 3: CRI with runc on cgroupfs (the node has no systemd),
    ``restrict_oom_score_adj`` (root here lacks CAP_SYS_RESOURCE), our pause image, and nothing
    written outside the node's private /etc, /run and /var/lib (opt plugin moved; NRI on, its
    socket in the node's /run where the DRA plugin's NRI plugin connects, its plugin directories
    in the node's /var/lib and /etc: with no plugin connected it changes nothing)."""
    cri_runtime = "plugins.'io.containerd.cri.v1.runtime'"
    return f"""\
version = 3
root = "/var/lib/containerd"
state = "/run/containerd"

[plugins.'io.containerd.server.v1.grpc']
  address = "{CONTAINERD_SOCKET}"

[plugins.'io.containerd.server.v1.ttrpc']
  address = "{CONTAINERD_SOCKET}.ttrpc"

[plugins.'io.containerd.internal.v1.opt']
  path = "/var/lib/containerd/opt"

[plugins.'io.containerd.nri.v1.nri']
  disable = false
  socket_path = "{NRI_SOCKET}"
  plugin_path = "/var/lib/containerd/nri/plugins"
  plugin_config_path = "/etc/nri/conf.d"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"

  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{c.pause_image}"

[{cri_runtime}]
  restrict_oom_score_adj = true

  [{cri_runtime}.containerd]
    default_runtime_name = "runc"

    [{cri_runtime}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [{cri_runtime}.containerd.runtimes.runc.options]
        BinaryName = "{RUNC}"
        SystemdCgroup = false

  [{cri_runtime}.cni]
    bin_dirs = ["{c.cni_bin_dir}"]
    conf_dir = "{CNI_CONF_DIR}"
"""


def lj_runtime_handler(binary: str = XPU_RUNTIME, *, systemd_cgroup: bool = False) -> str:
    """The guide's ``lj-runtime`` handler for this node's containerd (cgroupfs: the guide's
    ``SystemdCgroup = true`` is for its systemd nodes), appended as the job agent would."""
    section = "plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.lj-runtime"
    return f"""
[{section}]
  runtime_type = "io.containerd.runc.v2"
  container_annotations = ["xdm.amp.com*"]

  [{section}.options]
    BinaryName = "{binary}"
    SystemdCgroup = {"true" if systemd_cgroup else "false"}
"""


def cni_conflist(c: NodeConfig) -> str:
    """A bridge network for pod-network pods inside the node's netns; masquerade there lets pods
    reach the apiserver through the node's address (the host sees only node addresses)."""
    conf: dict[str, Any] = {
        "cniVersion": "1.0.0",
        "name": "ljrk-pods",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                "ipMasq": True,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": c.pod_subnet}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }
    return json.dumps(conf, indent=2) + "\n"


def kubelet_config(c: NodeConfig) -> str:
    """KubeletConfiguration for a node on this machine's hybrid cgroups, without systemd, leaving
    the host's iptables, sysctls and directories alone."""
    config: dict[str, Any] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": c.cgroup_root,
        "cgroupsPerQOS": True,
        "makeIPTablesUtilChains": False,
        "protectKernelDefaults": True,
        "readOnlyPort": c.read_only_port,
        "port": 10250,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": KUBELET_HEALTHZ_PORT,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": f"{KUBELET_DIR}/pki/ca.crt"},
        },
        "authorization": {"mode": "Webhook"},
        "tlsCertFile": f"{KUBELET_DIR}/pki/kubelet-serving.crt",
        "tlsPrivateKeyFile": f"{KUBELET_DIR}/pki/kubelet-serving.key",
        "containerRuntimeEndpoint": f"unix://{CONTAINERD_SOCKET}",
        "staticPodPath": "",
        "failSwapOn": False,
        "volumePluginDir": "/var/lib/kubelet/volume-plugins",
        "resolvConf": "/etc/resolv.conf",
        "clusterDomain": c.cluster_domain,
        "clusterDNS": [],
        "registerNode": True,
        "serializeImagePulls": False,
        "evictionHard": {
            "memory.available": "50Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "shutdownGracePeriod": "0s",
        "logging": {"format": "text"},
    }
    return yaml.safe_dump(config, sort_keys=False)


def node_kubeconfig(server: str, ca_file: str, cert_file: str, key_file: str) -> str:
    """The kubelet's kubeconfig: its ``system:node:<name>`` client certificate, by path."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "lj-runtimekit",
                "cluster": {"server": server, "certificate-authority": ca_file},
            }
        ],
        "users": [
            {"name": "node", "user": {"client-certificate": cert_file, "client-key": key_file}}
        ],
        "contexts": [{"name": "node", "context": {"cluster": "lj-runtimekit", "user": "node"}}],
        "current-context": "node",
    }
    return yaml.safe_dump(config, sort_keys=False)
