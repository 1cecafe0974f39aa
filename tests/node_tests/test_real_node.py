"""A real node (kubelet + containerd + runc in private namespaces) joined to the local control
plane: it is Ready, runs pods on the host network and on its bridge network, lets a pod reach the
apiserver through the ``kubernetes`` Service, runs ``lj-runtime`` pods through the
``xpu-container-runtime`` stand-in, survives restarts of containerd and the kubelet, and leaves
the host as it found it."""

from __future__ import annotations

import ipaddress
import json
import os
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from kubernetes import client

from lj_runtimekit_testkit.cluster.handle import Cluster
from lj_runtimekit_testkit.node import RealNode, seed
from lj_runtimekit_testkit.node.config import lj_runtime_handler

pytestmark = [pytest.mark.realnode, pytest.mark.cluster]

log = structlog.get_logger(__name__)

PROBE = "localhost/lj-runtimekit/probe:v1"


def wait_for(what: str, probe: Callable[[], bool], deadline_s: float = 60.0) -> None:
    deadline = time.monotonic() + deadline_s
    while not probe():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {deadline_s:.0f} s")
        time.sleep(0.1)


def probe_pod(
    name: str,
    node: RealNode,
    args: list[str],
    *,
    host_network: bool = False,
    runtime_class: str | None = None,
    restart: str = "Always",
    env: dict[str, str] | None = None,
) -> Any:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels={"app": "node-test"}),
        spec=client.V1PodSpec(
            node_name=node.name,
            host_network=host_network,
            runtime_class_name=runtime_class,
            restart_policy=restart,
            termination_grace_period_seconds=1,
            containers=[
                client.V1Container(
                    name="probe",
                    image=PROBE,
                    image_pull_policy="Never",
                    args=args,
                    env=[client.V1EnvVar(name=k, value=v) for k, v in (env or {}).items()],
                )
            ],
        ),
    )


def read_pod(core: client.CoreV1Api, ns: str, name: str) -> Any:
    """The pod (as Any: every field of the client's models is Optional)."""
    return core.read_namespaced_pod(name, ns)


def read_node(core: client.CoreV1Api, name: str) -> Any:
    return core.read_node(name)


def run_pod(core: client.CoreV1Api, ns: str, pod: Any, phase: str = "Running") -> Any:
    core.create_namespaced_pod(ns, pod)
    name = str(pod.metadata.name)
    wait_for(f"pod {name} {phase}", lambda: read_pod(core, ns, name).status.phase == phase, 90.0)
    return read_pod(core, ns, name)


def node_ready(core: client.CoreV1Api, name: str) -> bool:
    conditions = read_node(core, name).status.conditions or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


@pytest.fixture
def core(cluster: Cluster) -> Any:
    with cluster.api_client() as api:
        yield client.CoreV1Api(api)


def test_node_joins_and_is_ready(
    real_node: RealNode, core: client.CoreV1Api, record_property: Callable[[str, object], None]
) -> None:
    log.info("real_node_start", node=real_node.name, start_s=round(real_node.start_s, 2))
    record_property("node_start_to_ready_s", round(real_node.start_s, 2))
    assert node_ready(core, real_node.name)
    node = read_node(core, real_node.name)
    addresses = {a.type: a.address for a in node.status.addresses}
    assert addresses["InternalIP"] == real_node.ip
    assert node.status.node_info.container_runtime_version == "containerd://2.4.2"
    assert node.status.node_info.kubelet_version == "v1.37.2"
    # The guide's way to list pods: the kubelet's read-only port, on the node's own address.
    with urllib.request.urlopen(f"http://{real_node.ip}:10255/pods", timeout=5) as resp:
        assert json.load(resp)["kind"] == "PodList"


def test_pods_run_on_the_host_network_and_the_bridge_network(
    real_node: RealNode, core: client.CoreV1Api, namespace: str
) -> None:
    host = run_pod(core, namespace, probe_pod("on-host", real_node, ["sleep"], host_network=True))
    bridged = run_pod(core, namespace, probe_pod("on-bridge", real_node, ["sleep"]))
    assert host.status.pod_ip == real_node.ip
    assert ipaddress.ip_address(bridged.status.pod_ip) in ipaddress.ip_network("10.245.0.0/16")
    tasks = real_node.exec(["ctr", "-n", "k8s.io", "tasks", "ls"]).stdout
    assert tasks.count("RUNNING") >= 4  # two sandboxes, two containers


def test_a_bridge_network_pod_reaches_the_apiserver_through_the_kubernetes_service(
    real_node: RealNode, core: client.CoreV1Api, namespace: str
) -> None:
    pod = probe_pod("reach-api", real_node, ["apiserver"], restart="Never")
    run_pod(core, namespace, pod, phase="Succeeded")
    out = core.read_namespaced_pod_log("reach-api", namespace)
    assert "https://10.96.0.1:443/version: 200" in out, out


@pytest.fixture
def lj_runtime_class(cluster: Cluster) -> Iterator[str]:
    """The RuntimeClass ``lj-runtime`` for one test, deleted after it (the cluster is shared)."""
    with cluster.api_client() as api:
        node_api = client.NodeV1Api(api)
        node_api.create_runtime_class(
            client.V1RuntimeClass(
                metadata=client.V1ObjectMeta(name="lj-runtime"), handler="lj-runtime"
            )
        )
        try:
            yield "lj-runtime"
        finally:
            node_api.delete_runtime_class("lj-runtime")


def test_an_lj_runtime_pod_runs_through_the_standin_which_records_it(
    real_node: RealNode, core: client.CoreV1Api, lj_runtime_class: str, namespace: str
) -> None:
    config = real_node.host_path("/etc/containerd/config.toml")
    if "runtimes.lj-runtime]" not in config.read_text():
        real_node.add_containerd_config(lj_runtime_handler())
        real_node.exec(["systemctl", "restart", "containerd"])  # as the job agent does
    dump = real_node.exec(["containerd", "config", "dump"]).stdout
    assert "/usr/local/harp/kitC/xpu-container-runtime" in dump
    pod = probe_pod(
        "lj-runtime-pod",
        real_node,
        ["sleep"],
        runtime_class=lj_runtime_class,
        env={"MARK": namespace},
    )
    running = run_pod(core, namespace, pod)
    uid = running.metadata.uid
    records = [
        r
        for r in real_node.runtime_records()
        if r.get("annotations", {}).get("io.kubernetes.cri.sandbox-uid") == uid
    ]
    kinds = sorted(r["annotations"]["io.kubernetes.cri.container-type"] for r in records)
    assert kinds == ["container", "sandbox"], records
    container = next(
        r for r in records if r["annotations"]["io.kubernetes.cri.container-type"] == "container"
    )
    assert f"MARK={namespace}" in container["env"]
    assert container["annotations"]["io.kubernetes.cri.container-name"] == "probe"
    assert container["command"] == "create"


def test_running_pods_survive_a_containerd_restart(
    real_node: RealNode, core: client.CoreV1Api, namespace: str
) -> None:
    before = run_pod(core, namespace, probe_pod("survivor", real_node, ["sleep"]))
    container_id = before.status.container_statuses[0].container_id
    restarts = real_node.status()["services"]["containerd"]["restarts"]
    # What the job agent runs from a hostPID pod: PID 1 of the node is its supervisor.
    real_node.exec(
        ["nsenter", "--target", "1", "--mount", "--uts", "--ipc", "--net", "--pid", "--",
         "systemctl", "restart", "containerd"]
    )  # fmt: skip
    assert real_node.exec(["systemctl", "is-active", "containerd"]).stdout.strip() == "active"
    assert real_node.status()["services"]["containerd"]["restarts"] == restarts
    after = read_pod(core, namespace, "survivor")
    assert after.status.phase == "Running"
    assert after.status.container_statuses[0].container_id == container_id
    assert after.status.container_statuses[0].restart_count == 0
    tasks = real_node.exec(["ctr", "-n", "k8s.io", "tasks", "ls"]).stdout
    assert container_id.removeprefix("containerd://") in tasks


def test_the_node_stays_ready_across_a_kubelet_restart(
    real_node: RealNode, core: client.CoreV1Api, namespace: str
) -> None:
    run_pod(core, namespace, probe_pod("steady", real_node, ["sleep"]))
    real_node.restart("kubelet")
    wait_for("node Ready after the kubelet restart", lambda: node_ready(core, real_node.name))
    pod = read_pod(core, namespace, "steady")
    assert pod.status.phase == "Running"
    assert pod.status.container_statuses[0].restart_count == 0


def test_the_runtime_simulator_serves_the_node_and_restarts(real_node: RealNode) -> None:
    sockets = real_node.exec(["ls", "/run/amp/eKitC/xdm/sockets"]).stdout.split()
    assert {"device-daemon.sock", "config-daemon.sock", "control.sock"} <= set(sockets)
    real_node.restart("runtime")
    assert real_node.is_active("runtime")
    # The Runtime's device nodes exist in the node's private /dev (what Allocate injects).
    assert real_node.exec(["test", "-c", "/dev/nvidia0"]).returncode == 0
    assert real_node.exec(["test", "-c", "/dev/nvidiactl"]).returncode == 0


def test_a_host_pid_pod_shares_the_node_pid_namespace_whose_pid_1_is_the_supervisor(
    real_node: RealNode, core: client.CoreV1Api, namespace: str
) -> None:
    """What the job agent relies on: from a hostPID pod, PID 1 is the node's supervisor, so
    `nsenter --target 1 --mount ... systemctl restart containerd` reaches the node's systemctl."""
    pod = probe_pod("host-pid", real_node, ["sleep"])
    pod.spec.host_pid = True
    running = run_pod(core, namespace, pod)
    node_ns = os.readlink(f"/proc/{real_node.pid}/ns/pid")
    in_node_ns = [
        pid
        for pid in real_node.host_pids().get("probe", [])
        if os.readlink(f"/proc/{pid}/ns/pid") == node_ns
    ]
    assert in_node_ns, f"no probe of {running.metadata.name} in the node's PID namespace"
    status = Path(f"/proc/{in_node_ns[0]}/status").read_text()
    nspid = next(line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:"))
    assert len(nspid) == 2  # host pid, node pid: no PID namespace of its own
    assert Path(real_node.live_path("/usr/local/bin/systemctl")).exists()
    assert (
        real_node.exec(["cat", "/proc/1/cmdline"]).stdout.split("\0")[1].endswith("supervisor.py")
    )


def test_nodes_start_with_the_image_seed_linked_and_their_own_databases(
    real_node: RealNode, real_nodes: Any, core: client.CoreV1Api, namespace: str
) -> None:
    """The seed (lj_runtimekit_testkit.node.seed) gives each node the images without an import:
    blobs and layers are the seed's files, the databases containerd writes in place are the
    node's own, and what one node deletes stays on the others."""
    other = real_nodes.add(inventory="gpu-1x", private_dev=True)
    root, other_root = (n.host_path("/var/lib/containerd") for n in (real_node, other))
    blobs = sorted((root / "io.containerd.content.v1.content/blobs/sha256").iterdir())
    assert blobs
    assert all(b.stat().st_ino == (other_root / b.relative_to(root)).stat().st_ino for b in blobs)
    for rel in seed.WRITTEN_IN_PLACE:
        assert (root / rel).stat().st_ino != (other_root / rel).stat().st_ino, rel
    other.exec(["ctr", "-n", "k8s.io", "images", "rm", "--sync", PROBE])
    assert PROBE not in other.exec(["ctr", "-n", "k8s.io", "images", "ls", "-q"]).stdout
    assert PROBE in real_node.exec(["ctr", "-n", "k8s.io", "images", "ls", "-q"]).stdout
    assert all(b.exists() for b in blobs)
    # The node that kept it still runs a pod from it.
    running = run_pod(core, namespace, probe_pod("after-seed-rm", real_node, ["sleep"]))
    assert running.status.phase == "Running"
