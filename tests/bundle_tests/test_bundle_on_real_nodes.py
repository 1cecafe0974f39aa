"""The bundle on real nodes (#23 "Done when"): ``<run> load`` on a node with no registry, with the
node's ctr and with a real nerdctl put on its PATH, puts every image into its containerd (namespace
k8s.io) under the bundle's digests and a pod runs from one with nothing pulled; and a node pulls
an image the installer pushed into a registry on the node network (the host's bridge address,
containerd told through hosts.toml to use plain HTTP)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from lj_runtimekit_testkit.cluster.fixtures import RealNodeFactory
from lj_runtimekit_testkit.cluster.handle import Cluster
from lj_runtimekit_testkit.node import RealNode
from lj_runtimekit_testkit.registry import LocalRegistry, RegistryUnavailable, pull_through

from .conftest import PROJECT, Bundle, pushed_ref

pytestmark = [pytest.mark.realnode, pytest.mark.images, pytest.mark.cluster]

#: The image the pods run: its entrypoint with --version prints the version and exits 0.
POD_IMAGE = "lj-runtimekit-controller-job-agent"


def node_images(node: RealNode) -> dict[str, str]:
    """``ctr -n k8s.io images ls`` on the node: reference → manifest digest."""
    out = node.exec(["ctr", "-n", "k8s.io", "images", "ls"]).stdout
    rows = [ln.split() for ln in out.splitlines()[1:] if ln.strip()]
    return {r[0]: r[2] for r in rows}


def wait_for(what: str, probe: Callable[[], bool], deadline_s: float = 120.0) -> None:
    deadline = time.monotonic() + deadline_s
    while not probe():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {deadline_s:.0f} s")
        time.sleep(0.5)


def run_version_pod(
    cluster: Cluster, namespace: str, node: RealNode, *, name: str, image: str, pull: str
) -> tuple[str, list[Any]]:
    """A pod on ``node`` running ``image --version`` to completion: its log and its events."""
    core = cluster.core()
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(
            node_name=node.name,
            restart_policy="Never",
            termination_grace_period_seconds=1,
            automount_service_account_token=False,
            containers=[
                client.V1Container(
                    name="main", image=image, image_pull_policy=pull, args=["--version"]
                )
            ],
        ),
    )
    core.create_namespaced_pod(namespace, pod)

    def done() -> bool:
        read: Any = core.read_namespaced_pod(name, namespace)
        phase = read.status.phase if read.status else None
        if phase == "Failed":
            raise AssertionError(f"pod {name} failed: {read.status}")
        return bool(phase == "Succeeded")

    try:
        wait_for(f"pod {name} Succeeded", done)
    except TimeoutError as e:
        events = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}")
        raise AssertionError(f"{e}: {[(v.reason, v.message) for v in events.items]}") from e
    log = core.read_namespaced_pod_log(name, namespace)
    events = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}")
    return str(log), list(events.items)


#: The load tools run for real on a node: ctr (the node's own, beside containerd) and nerdctl
#: (built from Go modules by tests/cluster/build-nerdctl.sh, put on the node's PATH here).
LOAD_TOOLS = ("ctr", "nerdctl")


@pytest.mark.parametrize("tool", LOAD_TOOLS)
def test_load_on_a_node_without_registry_and_a_pod_runs_from_a_loaded_image(  # noqa: PLR0917
    bundle: Bundle,
    cluster: Cluster,
    namespace: str,
    real_nodes: RealNodeFactory,
    request: pytest.FixtureRequest,
    tool: str,
) -> None:
    node = real_nodes.add()
    images = bundle.manifest["images"]
    assert not {i["image"] for i in images} & set(node_images(node))
    args = [str(bundle.run), "load"]
    if tool == "nerdctl":
        # As an operator installs it: the static binary in /usr/local/bin (the node's own
        # overlay), talking to the node's containerd on its default socket. ctr stays on PATH,
        # and would be picked first: --tool names nerdctl.
        on_path = node.host_path("/usr/local/bin/nerdctl")
        shutil.copyfile(request.getfixturevalue("nerdctl_binary"), on_path)
        on_path.chmod(0o755)
        args.append("--tool=nerdctl")
    # As an operator would on the node: the installer from the unpacked bundle, the tool on PATH.
    done = node.exec(args, check=False, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"loading into this node with {tool} (namespace k8s.io)" in done.stdout
    for image in images:
        said = f"loaded  {image['image']} ({image['digest']}) with {tool} (namespace k8s.io)"
        assert said in done.stdout
    on_node = node_images(node)
    assert {i["image"]: on_node.get(i["image"]) for i in images} == {
        i["image"]: i["digest"] for i in images
    }

    (agent,) = [i for i in images if i["name"] == POD_IMAGE]
    # IfNotPresent: a missing image would be pulled from its registry, which this node cannot
    # reach (its network ends at the host bridge) — the pod runs only from the loaded one.
    log, events = run_version_pod(
        cluster, namespace, node, name="from-loaded", image=agent["image"], pull="IfNotPresent"
    )
    assert log.strip() == f"lj-runtimekit-job-agent {agent['tag'].removeprefix('v')}"
    reasons = {e.reason: e.message for e in events}
    assert "Pulling" not in reasons
    assert "already present on machine" in reasons.get("Pulled", ""), reasons


def test_a_node_pulls_what_the_installer_pushed_to_a_registry_on_the_node_network(  # noqa: PLR0917
    bundle: Bundle,
    cluster: Cluster,
    namespace: str,
    real_nodes: RealNodeFactory,
    crane_dir: Path,
    tmp_path: Path,
) -> None:
    bridge = cluster.control_plane.bridge if cluster.control_plane else None
    assert bridge is not None, "the control plane has no node network"
    # A node has its own network namespace: it reaches the host only at the bridge's address.
    site = LocalRegistry(tmp_path / "registry", host=bridge.ip)
    try:
        site.start()
    except RegistryUnavailable as e:
        pytest.fail(str(e), pytrace=False)
    try:
        pushed = bundle.installer(
            "push", f"{site.address}/{PROJECT}", "--tool=crane", "--insecure", path=[crane_dir]
        )
        assert pushed.returncode == 0, pushed.stdout + pushed.stderr

        node = real_nodes.add()
        pull_through(node, site.address)

        (agent,) = [i for i in bundle.manifest["images"] if i["name"] == POD_IMAGE]
        ref = pushed_ref(site.address, agent)
        log, events = run_version_pod(
            cluster, namespace, node, name="from-registry", image=ref, pull="Always"
        )
        assert log.strip() == f"lj-runtimekit-job-agent {agent['tag'].removeprefix('v')}"
        assert "Pulled" in {e.reason for e in events}
        assert node_images(node).get(ref) == agent["digest"]
    finally:
        site.stop()
