"""Controller benchmark: N nodes labelled at once → time until every action succeeded.

``python components/controller/bench/run.py --out build/bench [--nodes 1000]`` starts a local
control plane (the harness), creates the nodes with ``lj_runtimekit_enable=true``, runs the
controller in-process with its default limits and records: seconds until every node's status
says enable/succeeded, nodes per second, peak concurrent agent Jobs (from a Job watch) and
apiserver requests per action (from the controller's own counter).

The nodes are not KWOK's: a KWOK pod completes without an agent result, which the controller
rightly records as a failure. A stand-in kubelet here ends each agent pod with the agent's result
in its termination message, as a real kubelet reports it (the same as the tests' conftest).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from lj_runtimekit_controller import logs, names, status
from lj_runtimekit_controller.app import Controller
from lj_runtimekit_controller.settings import Settings
from lj_runtimekit_testkit.bench import Figure, write
from lj_runtimekit_testkit.cluster.handle import Cluster
from lj_runtimekit_testkit.cluster.launcher import ControlPlane

# How a watch ends other than by its timeout: an error status (e.g. 410 Gone), or the stream cut
# mid-chunk (urllib3's ProtocolError: "Response ended prematurely"). Unhandled, either ended a
# watcher thread for good; the stand-in kubelet's then left every later agent pod running.
WATCH_ENDED = (ApiException, urllib3.exceptions.HTTPError)


def _finished(job: Any) -> bool:
    conditions = (job.status.conditions if job.status else None) or []
    return any(c.type in ("Complete", "Failed") and c.status == "True" for c in conditions)


class Peak:
    """Peak number of agent Jobs running at once (created, not yet Complete or Failed; what the
    controller's limit counts), from a watch in a thread."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.api, self.namespace = api, namespace
        self.live: set[str] = set()
        self.peak = 0
        self.stop = threading.Event()

    def run(self) -> None:
        batch = client.BatchV1Api(self.api)
        w = watch.Watch()  # type: ignore[no-untyped-call]
        while not self.stop.is_set():
            with contextlib.suppress(*WATCH_ENDED):  # a watch the apiserver cut: watch again
                for ev in w.stream(  # type: ignore[no-untyped-call]
                    batch.list_namespaced_job, self.namespace, timeout_seconds=2
                ):
                    job = ev["object"]
                    name = job.metadata.name
                    if ev["type"] == "DELETED" or _finished(job):
                        self.live.discard(name)
                    else:
                        self.live.add(name)
                    self.peak = max(self.peak, len(self.live))


class StandInKubelet:
    """Ends every agent pod bound to one of ``nodes`` at once, Succeeded, with the job agent's
    result (its fields as the agent writes them) in the agent container's termination message."""

    def __init__(self, api: client.ApiClient, namespace: str, nodes: set[str]) -> None:
        self.api, self.namespace, self.nodes = api, namespace, nodes
        self.done: set[str] = set()
        self.stop = threading.Event()

    def _end(self, core: client.CoreV1Api, pod: Any) -> None:
        node, uid = pod.spec.node_name or "", pod.metadata.uid
        if node not in self.nodes or uid in self.done or pod.metadata.deletion_timestamp:
            return
        if pod.status is not None and pod.status.phase in ("Succeeded", "Failed"):
            return
        action = (pod.spec.containers[0].args or ["enable"])[0]
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        result = {"action": action, "node": node, "succeeded": True, "reason": "Enabled"}
        result |= {"message": "bench", "agent_version": "1.13.0", "time": now}
        terminated = {"exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now}
        terminated["message"] = json.dumps(result, sort_keys=True)
        statuses = [
            {"name": c.name, "image": c.image, "imageID": "", "ready": False, "restartCount": 0}
            | {"state": {"terminated": terminated}}
            for c in pod.spec.containers
        ]
        body = {"status": {"phase": "Succeeded", "startTime": now, "containerStatuses": statuses}}
        with contextlib.suppress(ApiException):
            core.patch_namespaced_pod_status(pod.metadata.name, self.namespace, body)
        self.done.add(uid)

    def run(self) -> None:
        core = client.CoreV1Api(self.api)
        while not self.stop.is_set():
            listing = core.list_namespaced_pod(self.namespace)
            for pod in listing.items:
                self._end(core, pod)
            rv = listing.metadata.resource_version if listing.metadata else None
            w = watch.Watch()  # type: ignore[no-untyped-call]
            with contextlib.suppress(*WATCH_ENDED):  # list again, then watch again
                while not self.stop.is_set():
                    for ev in w.stream(  # type: ignore[no-untyped-call]
                        core.list_namespaced_pod,
                        self.namespace,
                        resource_version=rv,
                        timeout_seconds=2,
                    ):
                        if ev["type"] in ("ADDED", "MODIFIED"):
                            self._end(core, ev["object"])
                        rv = ev["object"].metadata.resource_version


def create_nodes(core: client.CoreV1Api, n: int, labels: dict[str, str]) -> set[str]:
    """``n`` nodes no KWOK manages (no ``kwok.x-k8s.io/node`` annotation), labelled to enable."""
    names_ = {f"bench-{labels['lj-bench/run']}-{i}" for i in range(n)}
    for name in names_:
        meta = client.V1ObjectMeta(name=name, labels={**labels, "lj_runtimekit_enable": "true"})
        core.create_node(client.V1Node(metadata=meta))
    return names_


def service_account(core: client.CoreV1Api, namespace: str) -> None:
    """The agent Jobs' ServiceAccount, as deploy/controller/ creates it: without it the Job
    controller creates no pod and every action ends DeadlineExceeded."""
    meta = client.V1ObjectMeta(name=names.AGENT_SERVICE_ACCOUNT, namespace=namespace)
    try:
        core.create_namespaced_service_account(namespace, client.V1ServiceAccount(metadata=meta))
    except ApiException as e:
        if e.status != 409:
            raise


def all_enabled(core: client.CoreV1Api, selector: str, n: int) -> bool:
    """Every node enabled; a failed action ends the run (it would never come true)."""
    items = core.list_node(label_selector=selector).items
    ok = 0
    for node in items:
        ann = (node.metadata.annotations if node.metadata else None) or {}
        st = status.parse(ann.get(names.STATUS_ANNOTATION))
        if st is not None and st.result == "failed":
            name = node.metadata.name if node.metadata else "?"
            raise SystemExit(f"node {name}: action {st.action} failed: {st}")
        ok += st is not None and st.action == "enable" and st.result == "succeeded"
    return ok >= n


async def measure(cluster: Cluster, n: int) -> list[Figure]:
    label = f"lj-bench/run={int(time.time())}"
    key, value = label.split("=")
    api = cluster.api_client()
    core = client.CoreV1Api(api)
    await asyncio.to_thread(service_account, core, "kube-system")
    nodes = await asyncio.to_thread(create_nodes, core, n, {key: value})
    kubelet = StandInKubelet(cluster.api_client(), "kube-system", nodes)
    kubelet_thread = threading.Thread(target=kubelet.run, daemon=True)
    kubelet_thread.start()
    peak = Peak(api, "kube-system")
    thread = threading.Thread(target=peak.run, daemon=True)
    thread.start()
    settings = Settings(
        job_image="registry.local/lj-runtimekit-controller-job-agent:v1.13.0",
        kubeconfig=cluster.kubeconfig,
        metrics_bind_address="127.0.0.1:0",
        node_selector=label,
        job_priority_class="",
        identity="bench",
        log_level="warning",
    )
    logs.configure(settings.log_level)  # as app.run does: a line per Job is not a figure
    controller = Controller(settings)
    started = time.monotonic()
    task = asyncio.create_task(controller.run())
    while not await asyncio.to_thread(all_enabled, core, label, n):
        if task.done():
            raise SystemExit(f"controller ended early: {task.result()}")
        await asyncio.sleep(0.5)
    elapsed = time.monotonic() - started
    metrics = controller.metrics
    requests = sum(
        s.value
        for m in metrics.api_requests.collect()
        for s in m.samples
        if s.name.endswith("_total")
    )
    controller.stop.set()
    await task
    peak.stop.set()
    kubelet.stop.set()
    # both end within their 2 s watch timeout; joined before the control plane stops, so that
    # the apiserver's exit does not cut their streams
    thread.join(10)
    kubelet_thread.join(10)
    api.close()  # type: ignore[no-untyped-call]
    return [
        Figure(f"time to enable {n} labelled nodes", elapsed, "s"),
        Figure(f"nodes enabled per second ({n} nodes)", n / elapsed, "1/s"),
        Figure(f"peak running agent Jobs (limit {settings.max_active_jobs})", peak.peak, "jobs"),
        Figure("apiserver requests per action", requests / n, "req"),
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="controller-bench", description=__doc__)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--nodes", type=int, default=1000)
    args = p.parse_args(argv)
    plane = ControlPlane(watch_cache=True)
    plane.start()
    try:
        figures = asyncio.run(measure(Cluster.from_control_plane(plane), args.nodes))
    finally:
        plane.stop()
    path = write(args.out, "controller", figures)
    for f in figures:
        print(f"{f.name}: {f.value:.4g} {f.unit}")
    print(f"written {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
