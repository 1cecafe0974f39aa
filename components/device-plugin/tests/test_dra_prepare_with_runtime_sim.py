"""DRA prepare and unprepare against the harness's runtime simulator over its real sockets: exactly
the claim's devices are allocated, the CDI spec carries the Runtime's injection, the checkpoint
makes a repeated prepare (and one after a restart) allocate nothing, unprepare releases, and a
failure at any step leaves nothing allocated. The claims are the apiserver's JSON as the
scheduler writes it (the apiserver itself is in the real-node test).

Partitions on demand (``dra_partitions: dynamic``): a claim for a MIG instance or a TDM slice gets
one made at prepare beside the ones other claims hold and removed at unprepare, so a GPU whose
claims ended is whole again; idle partitions (a layout's) are taken over or removed to make room;
a whole-GPU claim clears them; a Runtime without CreatePartition, or an allocation that fails
after the partition was made, leaves nothing behind."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import grpc
import pytest

from lj_runtimekit_device_plugin.dra.cdi import validate_spec
from lj_runtimekit_device_plugin.dra.checkpoint import CheckpointStore
from lj_runtimekit_device_plugin.dra.offers import DYNAMIC, device_names, offers
from lj_runtimekit_device_plugin.dra.plan import ClaimRef
from lj_runtimekit_device_plugin.dra.plugin import DraHost
from lj_runtimekit_device_plugin.dra.prepare import Preparer
from lj_runtimekit_device_plugin.dra.runtime_partitions import PartitionClient
from lj_runtimekit_device_plugin.kube import NotFound
from lj_runtimekit_device_plugin.model import Device
from lj_runtimekit_device_plugin.resources import ResourceNames
from lj_runtimekit_device_plugin.runtime import RuntimeClient
from lj_runtimekit_interface import sockets
from lj_runtimekit_interface.dra.v1beta1 import api_pb2 as beta_pb2
from lj_runtimekit_interface.dra.v1beta1 import api_pb2_grpc as beta_grpc
from lj_runtimekit_interface.pluginregistration.v1 import api_pb2 as reg_pb2
from lj_runtimekit_testkit.simulator.services import ALL_METHODS

DRIVER, NODE, KIND = "lj-runtimekit.aliyun.com", "node-a", "aliyun.com/gpu"
BOOT = "boot-1"


def claim(name: str, uid: str, devices: list[str], *, pod: str = "p", request: str = "gpus") -> Any:
    return {
        "metadata": {"namespace": "ns", "name": name, "uid": uid},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": request, "driver": DRIVER, "pool": NODE, "device": d}
                        for d in devices
                    ]
                }
            },
            "reservedFor": [{"resource": "pods", "name": pod, "uid": f"{pod}-uid"}],
        },
    }


def pod(name: str, claim_name: str) -> Any:
    return {
        "metadata": {"namespace": "ns", "name": name},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
            "containers": [
                {"name": "side"},
                {"name": "main", "resources": {"claims": [{"name": "gpu"}]}},
            ],
        },
    }


class Apiserver:
    """The objects the preparer reads, by (namespace, name)."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], Any] = {}
        self.pods: dict[tuple[str, str], Any] = {}

    async def claim(self, ns: str, name: str) -> Any:
        if (ns, name) not in self.claims:
            raise NotFound(f"ResourceClaim {ns}/{name}: 404")
        return self.claims[ns, name]

    async def pod(self, ns: str, name: str) -> Any:
        if (ns, name) not in self.pods:
            raise NotFound(f"pod {ns}/{name}: 404")
        return self.pods[ns, name]

    def add(self, c: Any) -> ClaimRef:
        meta = c["metadata"]
        self.claims[meta["namespace"], meta["name"]] = c
        p = c["status"]["reservedFor"][0]["name"]
        self.pods["ns", p] = pod(p, meta["name"])
        return ClaimRef(meta["namespace"], meta["name"], meta["uid"])


@pytest.fixture
async def rig(runtime_sim: Any, tmp_path: Path) -> Any:
    client = RuntimeClient(str(runtime_sim.socket_dir), 5.0)
    devices: list[Device] = await client.list_devices()
    api = Apiserver()

    def make() -> Preparer:
        return Preparer(
            client,
            read_claim=api.claim,
            read_pod=api.pod,
            devices=lambda: devices,
            store=CheckpointStore(tmp_path / "plugin" / "checkpoint.json", BOOT),
            names=ResourceNames(),
            driver=DRIVER,
            pool=NODE,
            cdi_dir=tmp_path / "cdi",
            cdi_kind=KIND,
        )

    names = device_names(devices)
    yield api, make, {d.id: names[d.id] for d in devices}, tmp_path
    await client.close()


async def test_prepare_allocates_exactly_the_claims_devices_and_writes_their_cdi_spec(
    runtime_sim: Any, rig: Any
) -> None:
    api, make, names, _ = rig
    p = make()
    ids = ["gpu-0", "gpu-1"] if "gpu-0" in names else sorted(names)[:2]
    ref = api.add(claim("two", "uid-two", [names[i] for i in ids]))
    out = await p.prepare([ref])
    assert not out[ref.uid].error, out[ref.uid].error
    (alloc,) = runtime_sim.allocations()
    assert sorted(alloc.device_ids) == sorted(ids)
    assert (alloc.pod.namespace, alloc.pod.name, alloc.pod.uid) == ("ns", "p", "p-uid")
    assert alloc.container == "main"
    spec = json.loads(p.spec_path(ref.uid).read_text())
    validate_spec(spec)
    assert spec["kind"] == KIND
    answered = {i for d in out[ref.uid].devices for i in d.cdi_device_ids}
    assert answered == {f"{KIND}={d['name']}" for d in spec["devices"]}
    env = spec["devices"][0]["containerEdits"]["env"]
    assert f"LJ_ALLOCATION_ID={alloc.id}" in env
    assert any(e.startswith("NVIDIA_VISIBLE_DEVICES=") for e in env)
    assert [(d.requests, d.device) for d in out[ref.uid].devices] == [
        (("gpus",), names[i]) for i in ids
    ]
    assert p.checkpoint.claims[ref.uid].allocation_ids == (alloc.id,)


async def test_a_repeated_prepare_and_one_after_a_restart_allocate_nothing(
    runtime_sim: Any, rig: Any
) -> None:
    api, make, names, _ = rig
    first = make()
    ref = api.add(claim("one", "uid-one", [sorted(names.values())[0]]))
    a = await first.prepare([ref])
    calls = runtime_sim.calls("Allocate")
    assert (await first.prepare([ref])) == a
    restarted = make()  # a new process: the same checkpoint file
    assert (await restarted.prepare([ref])) == a
    assert runtime_sim.calls("Allocate") == calls
    assert len(runtime_sim.allocations()) == 1
    assert await restarted.unprepare([ref]) == {ref.uid: ""}
    assert runtime_sim.allocations() == []
    assert not restarted.spec_path(ref.uid).exists()
    assert make().checkpoint.claims == {}
    # unpreparing again (the kubelet retries) and an unknown claim both succeed
    assert await restarted.unprepare([ref, ClaimRef("ns", "x", "never")]) == {
        ref.uid: "",
        "never": "",
    }


async def test_a_refused_claim_leaves_nothing_and_the_others_in_the_call_are_prepared(
    runtime_sim: Any, rig: Any
) -> None:
    api, make, names, _ = rig
    p = make()
    gpus = sorted(names.values())
    held = api.add(claim("held", "uid-held", [gpus[0]], pod="a"))
    assert not (await p.prepare([held]))[held.uid].error
    clash = api.add(claim("clash", "uid-clash", [gpus[1], gpus[0]], pod="b"))
    fine = api.add(claim("fine", "uid-fine", [gpus[2]], pod="c"))
    stale = api.add(claim("stale", "uid-stale", ["gpu-that-went"], pod="d"))
    wrong = ClaimRef("ns", "fine", "uid-of-a-deleted-claim")
    gone = ClaimRef("ns", "missing", "uid-missing")
    out = await p.prepare([clash, fine, stale, wrong, gone])
    assert "held whole" in out[clash.uid].error
    assert not out[fine.uid].error
    assert "not in this node's inventory" in out[stale.uid].error
    assert "deleted and made again" in out[wrong.uid].error
    assert "404" in out[gone.uid].error
    owners = sorted(a.pod.name for a in runtime_sim.allocations())
    assert owners == ["a", "c"]  # the clash's first GPU was not left allocated
    for ref in (clash, stale, wrong, gone):
        assert not p.spec_path(ref.uid).exists()
        assert ref.uid not in p.checkpoint.claims


async def test_a_checkpoint_that_cannot_be_written_releases_the_allocation(
    runtime_sim: Any, rig: Any
) -> None:
    api, make, names, tmp = rig
    p = make()
    ref = api.add(claim("one", "uid-one", [sorted(names.values())[0]]))
    (tmp / "plugin").write_text("a file where the checkpoint's directory should be")
    out = await p.prepare([ref])
    assert "checkpoint" in out[ref.uid].error
    assert runtime_sim.allocations() == []
    assert not p.spec_path(ref.uid).exists()


async def test_a_claim_without_allocation_or_pod_is_refused_clearly(rig: Any) -> None:
    api, make, names, _ = rig
    p = make()
    bare = {"metadata": {"namespace": "ns", "name": "bare", "uid": "u1"}, "status": {}}
    api.claims["ns", "bare"] = bare
    out = await p.prepare([ClaimRef("ns", "bare", "u1")])
    assert "has no allocation" in out["u1"].error
    lonely = claim("lonely", "u2", [sorted(names.values())[0]])
    lonely["status"]["reservedFor"] = []
    api.claims["ns", "lonely"] = lonely
    out = await p.prepare([ClaimRef("ns", "lonely", "u2")])
    assert "reserved for no pod" in out["u2"].error
    other = claim("other", "u3", ["x"])
    other["status"]["allocation"]["devices"]["results"][0]["driver"] = "gpu.example.com"
    api.claims["ns", "other"] = other
    out = await p.prepare([ClaimRef("ns", "other", "u3")])
    assert "no device of driver" in out["u3"].error


# --- GPU shares (consumable capacity) ---------------------------------------------------------
GIB = 1 << 30
Share = tuple[str, str, str, str]
"""(device, shareID, cores, memory) of one result, as the scheduler writes them."""


def shared_claim(
    name: str, uid: str, shares: list[Share], *, pod: str = "p", request: str = "gpus"
) -> Any:
    c = claim(name, uid, [s[0] for s in shares], pod=pod, request=request)
    for result, (_, share_id, cores, memory) in zip(
        c["status"]["allocation"]["devices"]["results"], shares, strict=True
    ):
        result["shareID"] = share_id
        result["consumedCapacity"] = {"cores": cores, "memory": memory}
    return c


def cdi_env(spec: Any) -> list[dict[str, str]]:
    return [dict(e.split("=", 1) for e in d["containerEdits"]["env"]) for d in spec["devices"]]


async def test_two_shares_of_one_gpu_are_two_runtime_shares_and_a_whole_claim_is_refused(
    runtime_sim: Any, rig: Any
) -> None:
    api, make, names, _ = rig
    p = make()
    gpu = sorted(names)[0]
    a = api.add(shared_claim("a", "uid-a", [(names[gpu], "s-a", "30", "10Gi")], pod="pa"))
    b = api.add(shared_claim("b", "uid-b", [(names[gpu], "s-b", "31", "20Gi")], pod="pb"))
    out = await p.prepare([a, b])
    assert [out[a.uid].error, out[b.uid].error] == ["", ""]
    held = sorted(runtime_sim.allocations(), key=lambda x: x.pod.name)
    assert [(x.resource_name, x.device_ids, x.core_percent, x.memory_bytes) for x in held] == [
        ("aliyun.com/gpu-core", (gpu,), 30, 10 * GIB),
        ("aliyun.com/gpu-core", (gpu,), 31, 20 * GIB),
    ]
    (env,) = cdi_env(json.loads(p.spec_path(a.uid).read_text()))
    assert env["LJ_GPU_CORE_PERCENT"] == "30"
    assert env["LJ_GPU_MEMORY_LIMIT_BYTES"] == str(10 * GIB)
    assert env["LJ_ALLOCATION_ID"] == held[0].id
    (device,) = out[a.uid].devices
    assert (device.device, device.share_id) == (names[gpu], "s-a")

    # the scheduler would never do it; the Runtime refuses it too, and nothing is left of it
    whole = api.add(claim("whole", "uid-whole", [names[gpu]], pod="pw"))
    assert "shared by" in (await p.prepare([whole]))[whole.uid].error
    # nor does it let shares over-commit the GPU
    big = api.add(shared_claim("big", "uid-big", [(names[gpu], "s-c", "40", "1Gi")], pod="pc"))
    assert "39% of 100% free" in (await p.prepare([big]))[big.uid].error
    assert len(runtime_sim.allocations()) == 2

    assert await p.unprepare([a, b]) == {a.uid: "", b.uid: ""}
    assert runtime_sim.allocations() == []


async def test_one_claim_with_two_shares_of_one_gpu_and_one_of_another(
    runtime_sim: Any, rig: Any
) -> None:
    api, make, names, _ = rig
    p = make()
    g0, g1 = sorted(names)[:2]
    shares = [
        (names[g0], "s-1", "20", "8Gi"),
        (names[g0], "s-2", "25", "4Gi"),
        (names[g1], "s-3", "50", "1Mi"),
    ]
    ref = api.add(shared_claim("three", "uid-three", shares))
    out = await p.prepare([ref])
    assert not out[ref.uid].error, out[ref.uid].error
    held = {x.core_percent: x for x in runtime_sim.allocations()}
    assert {(c, x.device_ids, x.memory_bytes) for c, x in held.items()} == {
        (20, (g0,), 8 * GIB),
        (25, (g0,), 4 * GIB),
        (50, (g1,), 1 << 20),
    }
    spec = json.loads(p.spec_path(ref.uid).read_text())
    validate_spec(spec)
    assert len(spec["devices"]) == 3  # one CDI device per share, though two are of one GPU
    assert [e["LJ_GPU_CORE_PERCENT"] for e in cdi_env(spec)] == ["20", "25", "50"]
    assert [d.share_id for d in out[ref.uid].devices] == ["s-1", "s-2", "s-3"]
    assert len({i for d in out[ref.uid].devices for i in d.cdi_device_ids}) == 3
    assert sorted(p.checkpoint.claims[ref.uid].allocation_ids) == sorted(
        x.id for x in held.values()
    )
    assert (await make().prepare([ref])) == out  # a restart answers the same, allocates nothing
    assert len(runtime_sim.allocations()) == 3
    assert await p.unprepare([ref]) == {ref.uid: ""}
    assert runtime_sim.allocations() == []


async def test_a_result_that_consumed_the_whole_gpu_is_a_whole_allocation(
    runtime_sim: Any, rig: Any
) -> None:
    api, make, names, _ = rig
    p = make()
    g0, g1 = sorted(names)[:2]
    memory = next(d for d in runtime_sim.devices() if d.id == g0).memory_bytes
    full = str(memory)  # the apiserver may write it either way: "80Gi" or bytes
    whole = [(names[g0], "s-1", "100", f"{memory // GIB}Gi"), (names[g1], "s-2", "100", full)]
    ref = api.add(shared_claim("pair", "uid-pair", whole))
    out = await p.prepare([ref])
    assert not out[ref.uid].error, out[ref.uid].error
    (alloc,) = runtime_sim.allocations()  # one Runtime allocation for both, as without shares
    assert (alloc.resource_name, sorted(alloc.device_ids)) == ("aliyun.com/gpu", [g0, g1])
    assert not alloc.shared
    env = cdi_env(json.loads(p.spec_path(ref.uid).read_text()))
    assert all("LJ_GPU_CORE_PERCENT" not in e for e in env)


class Rig:
    def __init__(self, sim: Any, tmp_path: Path) -> None:
        self.sim = sim
        self.client = RuntimeClient(str(sim.socket_dir), 5.0)
        self.partitions = PartitionClient(str(sim.socket_dir), 5.0)
        self.api = Apiserver()
        self.devices: list[Device] = []
        self.tmp = tmp_path
        self.preparer = Preparer(
            self.client,
            read_claim=self.api.claim,
            read_pod=self.api.pod,
            devices=lambda: self.devices,
            store=CheckpointStore(tmp_path / "plugin" / "checkpoint.json", "boot-1"),
            names=ResourceNames(),
            driver=DRIVER,
            pool=NODE,
            cdi_dir=tmp_path / "cdi",
            cdi_kind="aliyun.com/gpu",
            partitions=self.partitions,
            policy=DYNAMIC,
        )

    async def refresh(self) -> None:
        self.devices = await self.client.list_devices()

    async def prepare(self, name: str, devices: list[str]) -> tuple[ClaimRef, str]:
        """Prepare a claim of ``devices`` (DRA names); (ref, error)."""
        await self.refresh()
        ref = self.api.add(claim(name, f"uid-{name}", devices, pod=f"pod-{name}"))
        out = await self.preparer.prepare([ref])
        return ref, out[ref.uid].error

    async def unprepare(self, ref: ClaimRef) -> None:
        assert (await self.preparer.unprepare([ref]))[ref.uid] == ""

    def partitions_of(self, device_id: str) -> list[str]:
        (d,) = [d for d in self.sim.devices() if d.id == device_id]
        return [p.id for p in d.partitions]

    def held(self) -> dict[str, list[str]]:
        return {a.pod.name: sorted(a.device_ids) for a in self.sim.allocations()}

    async def close(self) -> None:
        await self.client.close()
        await self.partitions.close()


@pytest.fixture
async def mig(runtime_sim_factory: Any, tmp_path: Path) -> Any:
    """mig-tdm: gpu-0 MIG [3g.40gb, 3g.40gb], gpu-1 MIG 7 x 1g.10gb, gpu-2 TDM [50, 25, 25],
    gpu-3 whole; all support MIG and TDM, and no partition is held."""
    rig = Rig(await runtime_sim_factory(inventory="mig-tdm"), tmp_path)
    yield rig
    await rig.close()


async def test_mig_instances_are_made_beside_held_ones_and_removed_on_unprepare(mig: Rig) -> None:
    a, err = await mig.prepare("a", ["gpu-3-mig-3g-40gb-0"])
    assert not err, err
    assert mig.partitions_of("gpu-3") == ["gpu-3-mig-3g.40gb-0"]
    assert mig.held() == {"pod-a": ["gpu-3-mig-3g.40gb-0"]}
    assert mig.preparer.checkpoint.claims[a.uid].partition_ids == ("gpu-3-mig-3g.40gb-0",)
    # the CDI spec carries the Runtime's injection for the MIG instance
    spec = mig.preparer.spec_path(a.uid).read_text()
    assert "gpu-3-mig-3g.40gb-0" in spec
    b, err = await mig.prepare("b", ["gpu-3-mig-2g-20gb-0", "gpu-3-mig-1g-10gb-0"])
    assert not err, err
    assert mig.partitions_of("gpu-3") == [
        "gpu-3-mig-3g.40gb-0",
        "gpu-3-mig-2g.20gb-0",
        "gpu-3-mig-1g.10gb-0",
    ]
    assert mig.held()["pod-b"] == ["gpu-3-mig-1g.10gb-0", "gpu-3-mig-2g.20gb-0"]
    await mig.unprepare(a)
    assert mig.partitions_of("gpu-3") == ["gpu-3-mig-2g.20gb-0", "gpu-3-mig-1g.10gb-0"]
    assert "pod-a" not in mig.held()
    # a repeated unprepare and a prepare repeated after the first are no-ops
    await mig.unprepare(a)
    _, err = await mig.prepare("b", ["gpu-3-mig-2g-20gb-0", "gpu-3-mig-1g-10gb-0"])
    assert not err
    assert len(mig.sim.allocations()) == 1
    await mig.unprepare(b)
    assert mig.partitions_of("gpu-3") == []
    assert mig.sim.allocations() == []
    assert mig.preparer.checkpoint.claims == {}


async def test_idle_partitions_of_a_layout_are_taken_over_or_removed_to_make_room(
    mig: Rig,
) -> None:
    a, err = await mig.prepare("a", ["gpu-0-mig-3g-40gb-1"])
    assert not err, err
    # an idle 3g.40gb of the layout is taken over: nothing is made
    assert mig.partitions_of("gpu-0") == ["gpu-0-mig-3g.40gb-0", "gpu-0-mig-3g.40gb-1"]
    (taken,) = mig.held()["pod-a"]
    # a 4g.40gb does not fit beside the other idle 3g.40gb: that one goes, the held one stays
    b, err = await mig.prepare("b", ["gpu-0-mig-4g-40gb-0"])
    assert not err, err
    assert sorted(mig.partitions_of("gpu-0")) == sorted([taken, "gpu-0-mig-4g.40gb-0"])
    assert mig.held()["pod-a"] == [taken]
    await mig.unprepare(a)
    await mig.unprepare(b)
    assert mig.partitions_of("gpu-0") == []


async def test_a_whole_gpu_claim_on_a_gpu_with_idle_partitions_clears_them(mig: Rig) -> None:
    a, err = await mig.prepare("a", ["gpu-1"])
    assert not err, err
    assert mig.partitions_of("gpu-1") == []
    assert mig.held() == {"pod-a": ["gpu-1"]}
    await mig.unprepare(a)


async def test_tdm_slices_on_a_gpu_without_mig(runtime_sim_factory: Any, tmp_path: Path) -> None:
    rig = Rig(await runtime_sim_factory(inventory="gpu-1x"), tmp_path)
    try:
        await rig.refresh()
        names = [o.name for o in offers(rig.devices, DYNAMIC)]
        assert names == [
            "gpu-0",
            *(f"gpu-0-tdm-25-{i}" for i in range(4)),
            *(f"gpu-0-tdm-50-{i}" for i in range(2)),
        ]
        a, err = await rig.prepare("a", ["gpu-0-tdm-50-1"])
        assert not err, err
        b, err = await rig.prepare("b", ["gpu-0-tdm-25-3"])
        assert not err, err
        assert rig.partitions_of("gpu-0") == ["gpu-0-tdm-0", "gpu-0-tdm-1"]
        assert rig.held() == {"pod-a": ["gpu-0-tdm-0"], "pod-b": ["gpu-0-tdm-1"]}
        await rig.unprepare(a)
        await rig.unprepare(b)
        assert rig.partitions_of("gpu-0") == []
    finally:
        await rig.close()


async def test_a_runtime_without_create_partition_is_refused_clearly(
    runtime_sim_factory: Any, tmp_path: Path
) -> None:
    old = [m for m in ALL_METHODS if not m.endswith(("CreatePartition", "DeletePartition"))]
    rig = Rig(await runtime_sim_factory(inventory="mig-tdm", capabilities=old), tmp_path)
    try:
        _, err = await rig.prepare("a", ["gpu-3-mig-1g-10gb-0"])
        assert "lacks ConfigService.CreatePartition" in err
        assert rig.sim.allocations() == []
        assert rig.partitions_of("gpu-3") == []
        assert not list(tmp_path.glob("cdi/*.json"))  # noqa: ASYNC240
    finally:
        await rig.close()


async def test_an_allocation_failing_after_the_partition_was_made_removes_it(mig: Rig) -> None:
    mig.sim.fail("DeviceService.Allocate", grpc.StatusCode.RESOURCE_EXHAUSTED)
    _, err = await mig.prepare("a", ["gpu-3-mig-1g-10gb-0"])
    assert "refused" in err
    assert mig.partitions_of("gpu-3") == []
    assert mig.sim.allocations() == []
    assert mig.preparer.checkpoint.claims == {}


async def test_a_kubelet_speaking_v1beta1_prepares_and_unprepares_the_same(
    runtime_sim: Any, rig: Any
) -> None:
    """The service under both names the registration offers, over the socket the kubelet dials."""
    api, make, names, _ = rig
    short = Path(tempfile.mkdtemp(prefix="ljdp-"))
    host = DraHost(
        make(),
        driver=DRIVER,
        plugin_dir=str(short / "plugins"),
        registry_dir=str(short / "registry"),
    )
    await host.start()
    try:
        info = await host.registration.GetInfo(reg_pb2.InfoRequest(), None)  # type: ignore[arg-type]
        assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
        ref = api.add(claim("beta", "uid-beta", [names["gpu-3"]]))
        wire = beta_pb2.Claim(namespace=ref.namespace, name=ref.name, uid=ref.uid)
        async with grpc.aio.insecure_channel(sockets.unix_target(str(host.dra_socket))) as ch:
            stub = beta_grpc.DRAPluginStub(ch)
            got = await stub.NodePrepareResources(
                beta_pb2.NodePrepareResourcesRequest(claims=[wire])
            )
            entry = got.claims[ref.uid]
            assert not entry.error, entry.error
            (device,) = entry.devices
            assert (device.pool_name, device.device_name) == (NODE, names["gpu-3"])
            assert device.cdi_device_ids[0].startswith(f"{KIND}=")
            (alloc,) = runtime_sim.allocations()
            assert list(alloc.device_ids) == ["gpu-3"]
            done = await stub.NodeUnprepareResources(
                beta_pb2.NodeUnprepareResourcesRequest(claims=[wire])
            )
            assert not done.claims[ref.uid].error
        assert runtime_sim.allocations() == []
    finally:
        await host.stop()
        shutil.rmtree(short, ignore_errors=True)
