"""Partition layouts end to end on an emulated node (#22, "Done when", emulated half): the real
apiserver and kube-controller-manager, the controller in-process, and each partition Job's pod
played by a stand-in kubelet that runs the real job agent (``python -m lj_runtimekit_job_agent``
with the pod's own arguments) against the real Runtime simulator of the node over its unix
sockets, and reports its exit code and termination message as a kubelet does.

The node goes whole → MIG → TDM on two more GPUs → whole, with a pod's allocation on a GPU no
layout touches kept all along; a layout change requested while an allocation holds a target GPU
waits (PartitionWaiting names the pod) and converges once it is released; refused layouts give
their Events and change nothing. tests/guide_tests/test_partition_on_real_nodes.py does the same
on a real node with the deployed suite. Here only: a Job that fails halfway (the Runtime refuses
the third GPU's change) is recorded as failed with what changed (annotation and PartitionFailed),
and the controller's next Job converges from there."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from lj_runtimekit_controller import names
from lj_runtimekit_controller.app import Controller
from lj_runtimekit_controller.partitioning import PartitionStatus, parse_status
from lj_runtimekit_controller.settings import Settings
from lj_runtimekit_interface.runtime.v1 import device_pb2 as pb
from lj_runtimekit_testkit.simulator.clients import RuntimeClients, runtime_clients
from lj_runtimekit_testkit.simulator.inventory_file import load_inventory
from lj_runtimekit_testkit.simulator.simulator import Simulator

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

LABEL = "lj_runtimekit_partition_layout"
CONFIGMAP = "lj-runtimekit-partition-layouts"
LAYOUTS = {
    "mig": "- {devices: [0, 1], mig: [3g.40gb, 3g.40gb]}",
    "mig-tdm": "- {devices: [0, 1], mig: [3g.40gb, 3g.40gb]}\n- {devices: [2, 3], tdm: [50, 50]}",
    "whole": "[]",
    "mixed": "- {devices: [4], mig: [1g.10gb]}\n- {devices: [4], tdm: [50]}",
    "too-big": "- {devices: [4], mig: [4g.40gb, 3g.50gb]}",
    "no-such-gpu": "- {devices: [9], vfio: true}",
    "mig-four": "- {devices: [0, 1, 2, 3], mig: [3g.40gb]}",
}


@dataclass
class AgentKubelet:
    """Ends each agent pod bound to ``node`` by running the real job agent with its arguments."""

    api: client.ApiClient
    namespace: str
    node: str
    work: Path
    runs: list[list[str]] = field(default_factory=list)
    _done: set[str] = field(default_factory=set)
    _stop: threading.Event = field(default_factory=threading.Event)

    def _run_agent(self, pod: Any) -> tuple[int, str]:
        args = list(pod.spec.containers[0].args or [])
        self.runs.append(args)
        log = self.work / f"{pod.metadata.uid}.termination-log"
        host = self.work / "host"
        (host / "etc/containerd").mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "lj_runtimekit_job_agent",
                *args,
                f"--termination-log={log}",
                f"--host-root={host}",
                "--restart-command=false",
                "--confirm-command=false",
                "--containerd-socket=",
                "--rpc-timeout=5",
                "--log-format=json",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        message = log.read_text() if log.exists() else proc.stderr[-4000:]
        return proc.returncode, message

    def _end(self, core: client.CoreV1Api, pod: Any) -> None:
        meta, spec = pod.metadata, pod.spec
        if spec.node_name != self.node or meta.uid in self._done or meta.deletion_timestamp:
            return
        if pod.status is not None and pod.status.phase in ("Succeeded", "Failed"):
            return
        self._done.add(meta.uid)
        code, message = self._run_agent(pod)
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        terminated = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "message": message,
            "startedAt": now,
            "finishedAt": now,
        }
        container = spec.containers[0]
        status = {
            "name": container.name,
            "image": container.image,
            "imageID": "",
            "ready": False,
            "started": False,
            "restartCount": 0,
            "state": {"terminated": terminated},
        }
        body = {
            "status": {
                "phase": "Succeeded" if code == 0 else "Failed",
                "startTime": now,
                "containerStatuses": [status],
            }
        }
        with contextlib.suppress(ApiException):
            core.patch_namespaced_pod_status(meta.name, self.namespace, body)

    def run(self) -> None:
        core = client.CoreV1Api(self.api)
        while not self._stop.is_set():
            with contextlib.suppress(ApiException):
                for pod in core.list_namespaced_pod(self.namespace).items:
                    self._end(core, pod)
                w = watch.Watch()  # type: ignore[no-untyped-call]
                for event in w.stream(  # type: ignore[no-untyped-call]
                    core.list_namespaced_pod, self.namespace, timeout_seconds=1
                ):
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._end(core, event["object"])
                    if self._stop.is_set():
                        break


@dataclass
class Rig:
    core: client.CoreV1Api
    node: str
    sim: Simulator
    runtime: RuntimeClients
    kubelet: AgentKubelet

    def select(self, layout: str | None) -> None:
        self.core.patch_node(self.node, {"metadata": {"labels": {LABEL: layout}}})

    def status(self) -> PartitionStatus | None:
        meta = self.core.read_node(self.node).metadata
        ann = (meta.annotations if meta is not None else None) or {}
        return parse_status(ann.get(names.PARTITION_STATUS_ANNOTATION))

    def events(self, reason: str) -> list[Any]:
        items = self.core.list_namespaced_event(
            "default", field_selector=f"involvedObject.name={self.node}"
        ).items
        return [e for e in items if e.reason == reason]

    async def gpus(self) -> dict[int, str]:
        reply = await self.runtime.device.ListDevices(pb.ListDevicesRequest())
        out: dict[int, str] = {}
        for d in reply.devices:
            if d.binding == pb.DEVICE_BINDING_VFIO:
                out[d.index] = "vfio"
            elif d.partition_mode == pb.PARTITION_MODE_MIG:
                out[d.index] = "mig " + "+".join(p.profile for p in d.partitions)
            elif d.partition_mode == pb.PARTITION_MODE_TDM:
                out[d.index] = "tdm " + "/".join(str(p.time_percent) for p in d.partitions)
            else:
                out[d.index] = "whole"
        return out

    async def allocate(self, unit: str, pod: str) -> str:
        reply = await self.runtime.device.Allocate(
            pb.AllocateRequest(
                pod=pb.PodRef(namespace="team-a", name=pod, uid=f"uid-{pod}"),
                container="main",
                resource_name="aliyun.com/gpu",
                device_ids=[unit],
            )
        )
        return str(reply.allocation.id)

    async def release(self, allocation: str, pod: str) -> None:
        await self.runtime.device.Release(
            pb.ReleaseRequest(
                allocation_id=allocation,
                pod=pb.PodRef(namespace="team-a", name=pod, uid=f"uid-{pod}"),
            )
        )

    async def allocation_ids(self) -> list[str]:
        reply = await self.runtime.device.ListAllocations(pb.ListAllocationsRequest())
        return sorted(a.id for a in reply.allocations)


async def poll(check: Any, what: str, deadline_s: float = 90.0) -> Any:
    end = asyncio.get_running_loop().time() + deadline_s
    last: Any = None
    while asyncio.get_running_loop().time() < end:
        last = await asyncio.to_thread(check)
        if last:
            return last
        await asyncio.sleep(0.3)
    raise AssertionError(f"timed out after {deadline_s}s waiting for {what}: {last!r}")


@pytest.fixture
def work() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="ljpart-") as d:
        yield Path(d)


@pytest.fixture
def sim_inventory() -> Any:
    """The node's inventory (a test parametrizes it to change the Runtime)."""
    return "gpu-8x-nvlink"


@pytest.fixture
async def rig(
    cluster: Any, namespace: str, runtime_sim_factory: Any, work: Path, sim_inventory: Any
) -> AsyncIterator[Rig]:
    api = cluster.api_client()
    core = client.CoreV1Api(api)
    node = f"part-{uuid.uuid4().hex[:6]}"
    run_label = f"run-{uuid.uuid4().hex[:8]}"
    core.create_node(
        client.V1Node(metadata=client.V1ObjectMeta(name=node, labels={"lj-test/run": run_label}))
    )
    core.create_namespaced_service_account(
        namespace,
        client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=names.AGENT_SERVICE_ACCOUNT)),
    )
    core.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name=CONFIGMAP), data=LAYOUTS)
    )
    sim = await runtime_sim_factory(inventory=sim_inventory)
    kubelet = AgentKubelet(api, namespace, node, work)
    thread = threading.Thread(target=kubelet.run, daemon=True, name="agent-kubelet")
    thread.start()
    controller = Controller(
        Settings(
            job_image="registry.local/lj-runtimekit-controller-job-agent:v1.14.0",
            namespace=namespace,
            kubeconfig=cluster.kubeconfig,
            metrics_bind_address="127.0.0.1:0",
            health_probe_bind_address="127.0.0.1:0",
            node_selector=f"lj-test/run={run_label}",
            job_priority_class="",
            socket_dir=str(sim.socket_dir),
            job_agent_args="--wait-for-release=2",
            partition_wait_interval=1.0,
            retry_backoff=1.0,
            leader_elect=False,
            log_format="text",
        )
    )
    task = asyncio.create_task(controller.run())
    try:
        async with runtime_clients(sim) as runtime:
            yield Rig(core, node, sim, runtime, kubelet)
    finally:
        controller.stop.set()
        await asyncio.wait_for(task, 30)
        kubelet._stop.set()
        thread.join(10)
        with contextlib.suppress(ApiException):
            core.delete_node(node)
        api.close()


def converged(rig: Rig, layout: str) -> PartitionStatus | None:
    st = rig.status()
    if st is not None and st.layout == layout and st.result in ("failed", "refused"):
        raise AssertionError(f"layout {layout} {st.result}: {st}")
    return st if st is not None and (st.layout, st.result) == (layout, "succeeded") else None


async def test_whole_mig_tdm_whole_with_a_wait_for_a_held_gpu_and_refusals(rig: Rig) -> None:
    keeper = await rig.allocate("gpu-7", "keeper")
    held = await rig.allocate("gpu-1", "holder")
    mig = "mig 3g.40gb+3g.40gb"

    # MIG on GPUs 0 and 1 while a pod holds GPU 1: waits, says so, changes nothing.
    rig.select("mig")
    [waiting] = await poll(lambda: rig.events("PartitionWaiting")[:1], "PartitionWaiting")
    assert "gpu-1" in waiting.message
    assert "team-a/holder" in waiting.message
    st = rig.status()
    assert st is not None
    assert (st.result, st.reason) == ("waiting", "AllocationsLive")
    assert (await rig.gpus())[0] == "whole", "half the layout applied while waiting"
    await rig.release(held, "holder")
    await poll(lambda: converged(rig, "mig"), "mig converged")
    gpus = await rig.gpus()
    assert (gpus[0], gpus[1], gpus[2], gpus[7]) == (mig, mig, "whole", "whole")

    rig.select("mig-tdm")
    await poll(lambda: converged(rig, "mig-tdm"), "mig-tdm converged")
    gpus = await rig.gpus()
    assert [gpus[i] for i in range(8)] == [mig, mig, "tdm 50/50", "tdm 50/50", *["whole"] * 4]

    # Refused: by the controller (no Job at all), by the agent against the Runtime's inventory.
    runs = len(rig.kubelet.runs)
    for layout, words, by_agent in (
        ("mixed", "MIG and TDM", False),
        ("too-big", "need 90 GiB, the GPU has 80", True),
        ("no-such-gpu", "names GPU 9", True),
    ):
        rig.select(layout)
        [refusal] = await poll(
            lambda layout=layout: [
                e for e in rig.events("PartitionLayoutRefused") if layout in e.message
            ],
            f"{layout} refused",
        )
        assert words in refusal.message, refusal.message
        assert len(rig.kubelet.runs) == runs + by_agent, "an agent ran only for what it judges"
        runs = len(rig.kubelet.runs)
        assert [gpus[i] for i in range(8)] == [(await rig.gpus())[i] for i in range(8)]

    rig.select("whole")
    await poll(lambda: converged(rig, "whole"), "whole converged")
    assert set((await rig.gpus()).values()) == {"whole"}
    assert await rig.allocation_ids() == [keeper], "the keeper's allocation stayed all along"
    assert all(a[0] == "partition" for a in rig.kubelet.runs)
    layouts = [json.loads(a.split("=", 1)[1])["name"] for r in rig.kubelet.runs for a in r
               if a.startswith("--layout=")]  # fmt: skip
    assert layouts[0] == "mig"
    assert layouts[-1] == "whole"
    assert not rig.events("PartitionFailed")


@pytest.mark.parametrize(
    "sim_inventory", [replace(load_inventory("gpu-8x-nvlink"), runtime_version="v1.12.0")]
)
async def test_a_runtime_older_than_partitioning_needs_is_refused_naming_both_versions(
    rig: Rig,
) -> None:
    rig.select("mig")
    [refusal] = await poll(lambda: rig.events("PartitionLayoutRefused")[:1], "the refusal")
    assert "v1.12.0" in refusal.message
    assert "v1.13.0" in refusal.message
    st = rig.status()
    assert st is not None
    assert (st.result, st.reason) == ("refused", "RuntimeTooOld")
    assert set((await rig.gpus()).values()) == {"whole"}
    await asyncio.sleep(2)
    assert len(rig.kubelet.runs) == 1, "not retried"


async def test_a_job_failing_halfway_is_recorded_with_what_changed_and_the_retry_converges(
    rig: Rig,
) -> None:
    sim, change = rig.sim, "ConfigService.SetPartitioning"
    real_enter = sim.faults.enter
    failed_once: list[str] = []
    failure_read = asyncio.Event()

    async def third_change_fails_once(
        method: str, context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        await real_enter(method, context)
        if method != change:
            return
        if not failed_once and sim.calls(change) == 3:
            failed_once.append(method)
            await context.abort(grpc.StatusCode.INTERNAL, "injected: MIG reconfigure failed")
        if failed_once:
            # The retry's changes wait until the test has read the failed outcome and the state
            # it left (the controller records it before it creates the retry's Job, and backs
            # off a second: this is short, well within the agent's RPC timeout).
            await failure_read.wait()

    sim.faults.enter = third_change_fails_once  # type: ignore[method-assign]
    keeper = await rig.allocate("gpu-7", "keeper")
    rig.select("mig-four")

    def failed() -> PartitionStatus | None:
        st = rig.status()
        return st if st is not None and st.result == "failed" else None

    st = await poll(failed, "the failed outcome")
    assert (st.layout, st.attempt, st.reason) == ("mig-four", 1, "PartitioningFailed"), st
    assert "gpu-2: whole → MIG 3g.40gb failed" in st.message, st.message
    assert "injected: MIG reconfigure failed" in st.message, st.message
    changed = "changed: gpu-0: whole → MIG 3g.40gb; gpu-1: whole → MIG 3g.40gb"
    assert changed in st.message, st.message
    assert "not yet: gpu-3" in st.message, st.message
    assert st.retry.startswith("try 2/3 at "), st.retry
    [event] = await poll(lambda: rig.events("PartitionFailed"), "PartitionFailed")
    assert event.type == "Warning"
    assert f"layout mig-four (Job {st.job}, try 1)" in event.message, event.message
    assert changed in event.message, event.message
    assert "try 2/3 at " in event.message, event.message
    # The known state the failure left: the GPUs it names as changed, and only those.
    gpus = await rig.gpus()
    mig = "mig 3g.40gb"
    assert [gpus[i] for i in range(8)] == [mig, mig, *["whole"] * 6], gpus
    failure_read.set()

    def retried() -> PartitionStatus | None:
        st = rig.status()
        return st if st is not None and st.result == "succeeded" else None

    done = await poll(retried, "the retry converged")
    assert (done.layout, done.reason) == ("mig-four", "Converged"), done
    assert done.attempt == 2, done
    assert done.job != st.job or done.job_uid != st.job_uid, "the failed Job was recorded again"
    [ok] = await poll(lambda: rig.events("PartitionConverged"), "PartitionConverged")
    assert "try 2" in ok.message, ok.message
    assert "gpu-2: whole → MIG 3g.40gb" in ok.message, ok.message
    assert "gpu-0: whole" not in ok.message, "the retry changed a GPU the first try had done"
    gpus = await rig.gpus()
    assert [gpus[i] for i in range(8)] == [*[mig] * 4, *["whole"] * 4], gpus
    assert len(rig.kubelet.runs) == 2
    assert len(rig.events("PartitionFailed")) == 1
    assert await rig.allocation_ids() == [keeper]
