"""Every refused or failed NodePrepareResources shows on the claim's pods (issue 34 item 2, the DRA
side of the Allocate refusals of test_refusal_events): a Warning Event GpuClaimPrepareRefused or
GpuClaimPrepareFailed with the reason, one per pod and reason per window, a bucket overall.

Against the runtime simulator on its real sockets, through the kubelet's own gRPC call where the
kubelet is the caller; the claims are the apiserver's JSON (the apiserver itself is in the
cluster tests) and the Events go to the event sink of pod_events (what posts them to the
apiserver is kube.post_event, shared with Allocate's).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from lj_runtimekit_device_plugin.dra.checkpoint import CheckpointStore
from lj_runtimekit_device_plugin.dra.offers import device_names
from lj_runtimekit_device_plugin.dra.plan import ClaimRef
from lj_runtimekit_device_plugin.dra.plugin import DraHost
from lj_runtimekit_device_plugin.dra.prepare import Preparer
from lj_runtimekit_device_plugin.dra.refusals import PREPARE_FAILED, PREPARE_REFUSED
from lj_runtimekit_device_plugin.kube import NotFound
from lj_runtimekit_device_plugin.pod_events import PodEvents
from lj_runtimekit_device_plugin.podview import PodView
from lj_runtimekit_device_plugin.resources import ResourceNames
from lj_runtimekit_device_plugin.runtime import RuntimeClient
from lj_runtimekit_interface import sockets
from lj_runtimekit_interface.dra.v1 import api_pb2 as dra_pb2
from lj_runtimekit_interface.dra.v1 import api_pb2_grpc as dra_grpc

DRIVER, NODE, KIND = "lj-runtimekit.aliyun.com", "node-a", "aliyun.com/gpu"


def claim(name: str, uid: str, devices: list[str], pods: tuple[str, ...] = ("p",)) -> Any:
    return {
        "metadata": {"namespace": "ns", "name": name, "uid": uid},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpus", "driver": DRIVER, "pool": NODE, "device": d}
                        for d in devices
                    ]
                }
            },
            "reservedFor": [{"resource": "pods", "name": p, "uid": f"{p}-uid"} for p in pods],
        },
    }


class Apiserver:
    """The objects the preparer reads, by (namespace, name)."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], Any] = {}

    async def claim(self, ns: str, name: str) -> Any:
        if (ns, name) not in self.claims:
            raise NotFound(f"ResourceClaim {ns}/{name}: 404")
        return self.claims[ns, name]

    async def pod(self, ns: str, name: str) -> Any:
        raise NotFound(f"pod {ns}/{name}: 404")  # the container is then named after the claim

    def add(self, c: Any) -> ClaimRef:
        meta = c["metadata"]
        self.claims[meta["namespace"], meta["name"]] = c
        return ClaimRef(meta["namespace"], meta["name"], meta["uid"])


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Sink:
    """The Events posted: (pod name, pod uid, reason, message)."""

    def __init__(self) -> None:
        self.posted: list[tuple[str, str, str, str]] = []
        self.clock = Clock()
        self.dropped: list[str] = []

    async def post(self, p: PodView, reason: str, message: str) -> None:
        self.posted.append((p.name, p.uid, reason, message))

    def events(self, **kwargs: Any) -> PodEvents:
        return PodEvents(self.post, clock=self.clock, dropped=self.dropped.append, **kwargs)

    def reasons(self) -> list[tuple[str, str]]:
        return [(name, reason) for name, _, reason, _ in self.posted]


class Rig:
    def __init__(self, client: RuntimeClient, tmp: Path, devices: list[Any]) -> None:
        self.client, self.tmp, self.devices = client, tmp, devices
        self.api = Apiserver()
        self.sink = Sink()
        self.names = device_names(devices)

    def preparer(self, **kwargs: Any) -> Preparer:
        return Preparer(
            self.client,
            read_claim=self.api.claim,
            read_pod=self.api.pod,
            devices=lambda: self.devices,
            store=CheckpointStore(self.tmp / "plugin" / "checkpoint.json", "boot-1"),
            names=ResourceNames(),
            driver=DRIVER,
            pool=NODE,
            cdi_dir=self.tmp / "cdi",
            cdi_kind=KIND,
            events=self.sink.events(**kwargs),
        )

    def gpu(self, i: int) -> str:
        return self.names[f"gpu-{i}"]


@pytest.fixture
async def rig(runtime_sim: Any, tmp_path: Path) -> AsyncIterator[Rig]:
    client = RuntimeClient(str(runtime_sim.socket_dir), 5.0)
    devices = await client.list_devices()
    yield Rig(client, tmp_path, devices)
    await client.close()


async def test_a_claim_of_devices_not_on_the_node_is_refused_on_each_of_its_pods(
    rig: Rig,
) -> None:
    ref = rig.api.add(claim("stale", "uid-stale", ["gpu-that-went"], pods=("a", "b")))
    out = await rig.preparer().prepare([ref])
    assert "not in this node's inventory" in out[ref.uid].error
    assert rig.sink.reasons() == [("a", PREPARE_REFUSED), ("b", PREPARE_REFUSED)]
    _, uid, _, message = rig.sink.posted[0]
    assert uid == "a-uid"
    assert "claim ns/stale" in message
    assert NODE in message
    assert "not in this node's inventory" in message, "the Event says why"


async def test_a_runtime_refusal_is_refused_and_a_runtime_outage_failed_on_the_pod(
    runtime_sim: Any, rig: Rig
) -> None:
    p = rig.preparer()
    runtime_sim.fail("Allocate", grpc.StatusCode.RESOURCE_EXHAUSTED)
    full = rig.api.add(claim("full", "uid-full", [rig.gpu(0)], pods=("x",)))
    assert (await p.prepare([full]))[full.uid].error
    runtime_sim.fail("Allocate", grpc.StatusCode.UNAVAILABLE)
    away = rig.api.add(claim("away", "uid-away", [rig.gpu(1)], pods=("y",)))
    assert (await p.prepare([away]))[away.uid].error
    runtime_sim.clear_faults()
    assert rig.sink.reasons() == [("x", PREPARE_REFUSED), ("y", PREPARE_FAILED)]
    assert "the kubelet retries" in rig.sink.posted[1][3]
    assert "is the Runtime service running?" in rig.sink.posted[1][3]
    assert runtime_sim.allocations() == []


async def test_a_prepared_claim_and_one_that_cannot_be_read_post_nothing(rig: Rig) -> None:
    p = rig.preparer()
    ok = rig.api.add(claim("ok", "uid-ok", [rig.gpu(2)]))
    gone = ClaimRef("ns", "missing", "uid-missing")
    wrong = ClaimRef("ns", "ok", "uid-of-a-deleted-claim")  # its pods are the new claim's
    out = await p.prepare([ok, gone, wrong])
    assert not out[ok.uid].error
    assert out[gone.uid].error
    assert out[wrong.uid].error
    assert rig.sink.posted == [], "no pod is surely the one of an unread or replaced claim"


async def test_a_kubelet_retrying_a_refused_prepare_posts_one_event_per_window(
    rig: Rig,
) -> None:
    p = rig.preparer()
    ref = rig.api.add(claim("stale", "uid-stale", ["gpu-that-went"]))
    for _ in range(50):  # the kubelet retrying the pod's sync
        assert (await p.prepare([ref]))[ref.uid].error
    assert rig.sink.reasons() == [("p", PREPARE_REFUSED)]
    rig.sink.clock.now += 61
    await p.prepare([ref])
    assert rig.sink.reasons() == [("p", PREPARE_REFUSED)] * 2


async def test_many_refused_pods_at_once_are_bounded_by_the_overall_bucket(rig: Rig) -> None:
    pods = tuple(f"p{i}" for i in range(12))
    ref = rig.api.add(claim("wide", "uid-wide", ["gpu-that-went"], pods=pods))
    await rig.preparer(burst=5, qps=1.0).prepare([ref])
    assert len(rig.sink.posted) == 5
    assert rig.sink.dropped == [PREPARE_REFUSED] * 7


async def test_a_node_in_device_plugin_mode_refuses_a_new_claim_on_its_pod(rig: Rig) -> None:
    """Through the kubelet's v1 NodePrepareResources on the plugin's own socket."""
    short = Path(tempfile.mkdtemp(prefix="ljdp-"))
    host = DraHost(
        rig.preparer(),
        driver=DRIVER,
        plugin_dir=str(short / "plugins"),
        registry_dir=str(short / "registry"),
        prepare=False,
    )
    await host.start()
    try:
        ref = rig.api.add(claim("late", "uid-late", [rig.gpu(3)], pods=("late-pod",)))
        wire = dra_pb2.Claim(namespace=ref.namespace, name=ref.name, uid=ref.uid)
        async with grpc.aio.insecure_channel(sockets.unix_target(str(host.dra_socket))) as ch:
            got = await dra_grpc.DRAPluginStub(ch).NodePrepareResources(
                dra_pb2.NodePrepareResourcesRequest(claims=[wire])
            )
        assert "device-plugin mode" in got.claims[ref.uid].error
    finally:
        await host.stop()
        shutil.rmtree(short, ignore_errors=True)
    assert rig.sink.reasons() == [("late-pod", PREPARE_REFUSED)]
    assert "device-plugin mode" in rig.sink.posted[0][3]
