"""Controller benchmark: N KWOK nodes labelled at once → time until every action succeeded.

``python components/controller/bench/run.py --out build/bench [--nodes 1000]`` starts a local
control plane (the harness), creates the nodes with ``lj_runtimekit_enable=true``, runs the
controller in-process with its default limits and records: seconds until every node's status
says enable/succeeded, nodes per second, peak concurrent agent Jobs (from a Job watch) and
apiserver requests per action (from the controller's own counter).
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from pathlib import Path
from typing import Any

from kubernetes import client, watch

from lj_runtimekit_controller import names, status
from lj_runtimekit_controller.app import Controller
from lj_runtimekit_controller.settings import Settings
from lj_runtimekit_testkit.bench import Figure, write
from lj_runtimekit_testkit.cluster.handle import Cluster
from lj_runtimekit_testkit.cluster.launcher import ControlPlane


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


def all_enabled(core: client.CoreV1Api, selector: str, n: int) -> bool:
    items = core.list_node(label_selector=selector).items
    ok = 0
    for node in items:
        ann = (node.metadata.annotations if node.metadata else None) or {}
        st = status.parse(ann.get(names.STATUS_ANNOTATION))
        ok += st is not None and st.action == "enable" and st.result == "succeeded"
    return ok >= n


async def measure(cluster: Cluster, n: int) -> list[Figure]:
    label = f"lj-bench/run={int(time.time())}"
    key, value = label.split("=")
    await asyncio.to_thread(cluster.create_gpu_nodes, n, "bench", 8, {key: value}, enable=True)
    api = cluster.api_client()
    core = client.CoreV1Api(api)
    peak = Peak(api, "kube-system")
    thread = threading.Thread(target=peak.run, daemon=True)
    thread.start()
    settings = Settings(
        job_image="registry.local/lj-runtimekit-controller-job-agent:v1.13.0",
        kubeconfig=cluster.kubeconfig,
        port=0,
        listen_address="127.0.0.1",
        node_selector=label,
        job_priority_class="",
        identity="bench",
        log_level="warning",
    )
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
    thread.join(10)
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
    plane = ControlPlane()
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
