"""The suite as an operator runs it on the harness' real nodes: the images ``make images`` built,
imported into each node's containerd, ``deploy/deploy-all.sh`` driven with the harness' kubectl,
and what the guide says to check afterwards (§3.4), read back the way an operator would.

Used by the real-node tests (``tests/guide_tests``) and by ``make demo``; nothing here does a
component's job — it only deploys, submits workloads and looks.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from lj_runtimekit_testkit.manifests import DEPLOY, IMAGES, REPO, tool_dir
from lj_runtimekit_testkit.node import RealNode

INDEX = REPO / "build" / "images" / "index.json"
NS = "kube-system"
FEATURE_LABEL = "lj_runtimekit_enable"
LAST_ACTION = "lj-runtimekit-controller/last-action-status"
PROBE_IMAGE = "localhost/lj-runtimekit/probe:v1"
RUNTIME_SOCKETS = "/run/amp/eKitC/xdm/sockets"
WORKLOADS = {
    "device-plugin": "daemonset/lj-runtimekit-device-plugin",
    "exporter": "daemonset/lj-runtimekit-exporter",
    "scheduler": "deployment/lj-runtimekit-scheduler",
    "controller": "deployment/lj-runtimekit-controller",
}

T = TypeVar("T")


class ImagesMissing(RuntimeError):
    """``make images`` has not been run (or did not finish)."""


@dataclass(frozen=True)
class BuiltImage:
    component: str
    ref: str
    archive: Path


def built_images(index: Path = INDEX) -> list[BuiltImage]:
    """The images of ``build/images/index.json``, one per component, archives present."""
    if not index.is_file():
        raise ImagesMissing(f"{index} not found: run `make images` (buildah) first")
    entries = json.loads(index.read_text())
    items = entries["images"] if isinstance(entries, dict) else entries
    images = []
    for item in items:
        archive = Path(item["archive"])
        if not archive.is_absolute():
            archive = REPO / archive
        if not archive.is_file():
            raise ImagesMissing(f"image archive {archive} is missing: run `make images` again")
        ref = item.get("ref") or item["image"]
        images.append(BuiltImage(str(item["component"]), str(ref), archive))
    missing = set(IMAGES) - {i.component for i in images}
    if missing:
        raise ImagesMissing(f"{index} lacks {sorted(missing)}: run `make images` again")
    return images


def registry_of(images: list[BuiltImage]) -> str:
    """The registry part every built image ref shares (``<registry>/lj-runtimekit-x:tag``)."""
    registries = {i.ref.rsplit("/", 1)[0] for i in images}
    if len(registries) != 1:
        raise ImagesMissing(f"the built images name several registries: {sorted(registries)}")
    return registries.pop()


def load_images(node: RealNode, images: list[BuiltImage]) -> None:
    """Put every image on the node, as ``crictl pull`` would from a registry (guide §3.3)."""
    for image in images:
        node.import_image(image.archive)


def wait_for(what: str, probe: Callable[[], T | None], deadline_s: float, every: float = 1.0) -> T:
    """Poll ``probe`` until it returns something truthy; TimeoutError naming ``what`` otherwise."""
    deadline = time.monotonic() + deadline_s
    last: T | None = None
    while True:
        last = probe()
        if last:
            return last
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {deadline_s:.0f} s")
        time.sleep(every)


@dataclass
class Operator:
    """kubectl and deploy-all.sh against the harness' cluster, as an operator types them."""

    kubeconfig: str
    log_dir: Path
    registry: str = ""
    deploy_dir: Path = DEPLOY

    def env(self) -> dict[str, str]:
        env = {
            **os.environ,
            "KUBECONFIG": self.kubeconfig,
            "KUBECTL": str(tool_dir() / "kubectl"),
            "LJ_RUNTIMEKIT_LOG_DIR": str(self.log_dir),
            "ROLLOUT_TIMEOUT": "240s",
        }
        env.pop("lj_runtimekit_version", None)
        if self.registry:
            env["LJ_RUNTIMEKIT_REGISTRY"] = self.registry
        else:
            env.pop("LJ_RUNTIMEKIT_REGISTRY", None)
        return env

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(
            [str(tool_dir() / "kubectl"), *args],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if check and out.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} exited {out.returncode}: {out.stderr}")
        return out

    def json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json").stdout)

    def deploy_all(
        self, *args: str, check: bool = True, **env: str
    ) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(
            [str(self.deploy_dir / "deploy-all.sh"), *args],
            env={**self.env(), **env},
            stdin=subprocess.DEVNULL,  # a question the script asks fails the call, never waits
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        if check and out.returncode != 0:
            raise AssertionError(
                f"deploy-all.sh {' '.join(args)} exited {out.returncode}:\n{out.stdout}{out.stderr}"
            )
        return out

    def label(self, node: str, enable: bool) -> None:
        value = f"{FEATURE_LABEL}=true" if enable else f"{FEATURE_LABEL}-"
        self.kubectl("label", "node", node, value, "--overwrite")

    def suite_pods(self) -> list[dict[str, Any]]:
        apps = ",".join(w.split("/", 1)[1] for w in WORKLOADS.values())
        pods: list[dict[str, Any]] = self.json("-n", NS, "get", "pods", "-l", f"app in ({apps})")[
            "items"
        ]
        return pods

    def node(self, name: str) -> dict[str, Any]:
        node: dict[str, Any] = self.json("get", "node", name)
        return node

    def events(self, reason: str, involved: str) -> list[dict[str, Any]]:
        selector = f"reason={reason},involvedObject.name={involved}"
        items: list[dict[str, Any]] = self.json(
            "get", "events", "-A", "--field-selector", selector
        )["items"]
        return items


def all_running(pods: list[dict[str, Any]]) -> bool:
    """Every pod Running with every container ready (``1/1`` in kubectl's READY column)."""
    return bool(pods) and all(
        p["status"].get("phase") == "Running"
        and all(c.get("ready") for c in p["status"].get("containerStatuses", []))
        for p in pods
    )


def accelerator_capacity(node: dict[str, Any]) -> dict[str, str]:
    cap: dict[str, str] = node["status"].get("capacity", {})
    return {k: v for k, v in cap.items() if "aliyun.com" in k or "alibabacloud.com" in k}


def metrics(node: RealNode, port: int = 9501) -> str:
    """``curl <node>:9501/metrics`` from outside the node."""
    with urllib.request.urlopen(f"http://{node.ip}:{port}/metrics", timeout=5) as resp:
        return str(resp.read().decode())


def pod_series(text: str, pod: str) -> int:
    return sum(1 for ln in text.splitlines() if not ln.startswith("#") and f'pod="{pod}"' in ln)


class _UnixConnection(http.client.HTTPConnection):
    """HTTP over the simulator's control socket (a unix socket on the node)."""

    def __init__(self, path: Path) -> None:
        super().__init__("localhost", timeout=5)
        self.path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(5)
        try:
            s.connect(str(self.path))
        except OSError:
            s.close()  # else it is left to the garbage collector, a ResourceWarning in a later test
            raise
        self.sock = s


def _control(node: RealNode, method: str, route: str, body: dict[str, Any] | None) -> Any:
    # live_path: short enough for a unix socket address whatever the work dir (a worker's is longer)
    conn = _UnixConnection(Path(node.live_path(f"{RUNTIME_SOCKETS}/control.sock")))
    try:
        conn.request(method, route, body=None if body is None else json.dumps(body))
        return json.loads(conn.getresponse().read() or b"{}")
    finally:
        conn.close()


def simulator_state(node: RealNode) -> dict[str, Any]:
    """The runtime simulator's ``GET /state`` over its control socket on the node."""
    state: dict[str, Any] = _control(node, "GET", "/state", None)
    return state


def allocations(node: RealNode) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = simulator_state(node).get("allocations", [])
    return found


def workload(
    name: str,
    namespace: str,
    limits: dict[str, str],
    *,
    node: str | None = None,
    scheduler: str | None = "lj-runtimekit-scheduler",
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A workload pod as the guide asks for one: ``runtimeClassName: lj-runtime``; its container
    (the probe image) prints its environment and waits."""
    spec: dict[str, Any] = {
        "runtimeClassName": "lj-runtime",
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 2,
        "containers": [
            {
                "name": "main",
                "image": PROBE_IMAGE,
                "imagePullPolicy": "IfNotPresent",
                "args": ["env"],
                "resources": {"limits": dict(limits), "requests": dict(limits)},
            }
        ],
    }
    if scheduler:
        spec["schedulerName"] = scheduler
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "annotations": dict(annotations or {})},
        "spec": spec,
    }


def injected(node: RealNode, pod_uid: str) -> list[dict[str, Any]]:
    """The ``create`` records of the node's xpu-container-runtime stand-in for a pod's
    containers (the sandbox excluded), matched by the CRI's sandbox-uid annotation."""
    out = []
    for record in node.runtime_records():
        ann: dict[str, str] = record.get("annotations", {})
        if ann.get("io.kubernetes.cri.sandbox-uid") == pod_uid and (
            ann.get("io.kubernetes.cri.container-type") == "container"
        ):
            out.append(record)
    return out


def simulator_control(node: RealNode, route: str, body: dict[str, Any]) -> None:
    """POST a fault switch to the node's runtime simulator (``/fail``, ``/health``, ...)."""
    answer = _control(node, "POST", route, body)
    if not answer.get("ok"):
        raise AssertionError(f"simulator {route} {body}: {answer}")
