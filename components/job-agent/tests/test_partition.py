"""The ``partition`` action against the harness's runtime simulator over its unix sockets (issue
22, items 1 and 2): each test reads the Runtime's resulting state back through ListDevices, the
way the device plugin would see it, and allocates through DeviceService.Allocate as the device
plugin does."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from lj_runtimekit_interface.runtime.v1 import device_pb2 as pb
from lj_runtimekit_job_agent import app, result, settings
from lj_runtimekit_job_agent.__main__ import main
from lj_runtimekit_job_agent.errors import ConfigError
from lj_runtimekit_job_agent.partition_layout import from_json, from_yaml
from lj_runtimekit_testkit.kubelet.pod_resources import PodResourcesServer, Snapshot
from lj_runtimekit_testkit.simulator.clients import RuntimeClients, runtime_clients
from lj_runtimekit_testkit.simulator.inventory import Mode
from lj_runtimekit_testkit.simulator.inventory_file import load_inventory
from lj_runtimekit_testkit.simulator.services import DEFAULT_CAPABILITIES, SET_DEVICE_BINDING
from lj_runtimekit_testkit.simulator.simulator import Simulator

SAMPLES = Path(__file__).parent / "samples"
ALL_WHOLE = {f"gpu-{i}": "whole" for i in range(8)}


def layout(yaml_text: str, name: str = "test-layout") -> str:
    return from_yaml(name, yaml_text).to_json()


MIG_0_1 = layout("- {devices: [0, 1], mig: [3g.40gb, 3g.40gb]}\n- {devices: [2], mig: [7g.80gb]}")


def argv(sim: Simulator, root: Path, layout_json: str, *extra: str) -> list[str]:
    return [
        "partition",
        "--node-name=sim-node",
        f"--socket-dir={sim.socket_dir}",
        f"--layout={layout_json}",
        f"--host-root={root}",
        # were containerd touched, these would fail the run: the action must not run them
        "--restart-command=false",
        "--confirm-command=false",
        "--containerd-socket=",
        f"--termination-log={root / 'termination-log'}",
        "--rpc-timeout=2",
        "--wait-for-release=0",
        *extra,
    ]


async def run(
    sim: Simulator, root: Path, layout_json: str, *extra: str
) -> tuple[int, dict[str, Any]]:
    code, outcome = await app.run_async(
        settings.load(argv(sim, root, layout_json, *extra), environ={})
    )
    written: dict[str, Any] = json.loads((root / "termination-log").read_text())
    assert written == json.loads(outcome.to_json())
    return code, written


def _state(d: pb.Device) -> str:
    if d.binding == pb.DEVICE_BINDING_VFIO:
        return "vfio"
    if d.partition_mode == pb.PARTITION_MODE_MIG:
        return "mig " + "+".join(p.profile for p in d.partitions)
    if d.partition_mode == pb.PARTITION_MODE_TDM:
        return "tdm " + "/".join(str(p.time_percent) for p in d.partitions)
    return "whole"


async def state(clients: RuntimeClients) -> dict[str, str]:
    """Each device as ListDevices reports it: whole, ``mig <profiles>``, ``tdm <%>`` or vfio."""
    reply = await clients.device.ListDevices(pb.ListDevicesRequest())
    return {d.id: _state(d) for d in reply.devices}


async def allocate(clients: RuntimeClients, unit: str, pod: str = "train-0") -> str:
    """Allocate ``unit`` (a device or a partition) as the device plugin's Allocate does."""
    reply = await clients.device.Allocate(
        pb.AllocateRequest(
            pod=pb.PodRef(namespace="team-a", name=pod, uid=f"uid-{pod}"),
            container="main",
            resource_name="aliyun.com/gpu",
            device_ids=[unit],
        )
    )
    return reply.allocation.id


@pytest.fixture
async def gpu8(runtime_sim_factory: Any) -> AsyncIterator[tuple[Simulator, RuntimeClients]]:
    sim = await runtime_sim_factory(inventory="gpu-8x-nvlink")
    async with runtime_clients(sim) as clients:
        yield sim, clients


@pytest.fixture
def host(tmp_path: Path) -> Path:
    (tmp_path / "etc/containerd").mkdir(parents=True)
    (tmp_path / "etc/containerd/config.toml").write_bytes((SAMPLES / "v2-nvidia.toml").read_bytes())
    return tmp_path


async def test_whole_to_mig_to_tdm_on_some_and_whole_again(
    gpu8: tuple[Simulator, RuntimeClients], host: Path
) -> None:
    sim, clients = gpu8
    config = (host / "etc/containerd/config.toml").read_bytes()

    code, res = await run(sim, host, MIG_0_1)
    assert (code, res["reason"]) == (result.EXIT_OK, "Converged"), res
    assert await state(clients) == {
        **ALL_WHOLE,
        "gpu-0": "mig 3g.40gb+3g.40gb",
        "gpu-1": "mig 3g.40gb+3g.40gb",
        "gpu-2": "mig 7g.80gb",
    }
    assert res["devices_changed"] == ["gpu-0", "gpu-1", "gpu-2"]
    assert "gpu-0: whole → MIG 3g.40gb+3g.40gb" in res["message"]
    assert res["layout"] == "test-layout"
    assert res["layout_digest"] == from_json(MIG_0_1).digest()
    assert res["runtime_version"] == "v1.13.0"
    assert sim.calls("GetVersion") == 1

    # GPUs 0 and 1 stay as they are (not called), 2 goes back whole, 4 and 5 get TDM
    tdm = layout(
        "- {devices: [0, 1], mig: [3g.40gb, 3g.40gb]}\n- {devices: [4, 5], tdm: [50, 25, 25]}"
    )
    calls = sim.calls("SetPartitioning")
    code, res = await run(sim, host, tdm)
    assert (code, res["reason"]) == (result.EXIT_OK, "Converged"), res
    assert await state(clients) == {
        **ALL_WHOLE,
        "gpu-0": "mig 3g.40gb+3g.40gb",
        "gpu-1": "mig 3g.40gb+3g.40gb",
        "gpu-4": "tdm 50/25/25",
        "gpu-5": "tdm 50/25/25",
    }
    assert res["devices_changed"] == ["gpu-2", "gpu-4", "gpu-5"]
    assert "gpu-2: MIG 7g.80gb → whole" in res["message"]
    assert sim.calls("SetPartitioning") == calls + 3

    code, res = await run(sim, host, layout("[]", "all-whole"))
    assert (code, res["reason"]) == (result.EXIT_OK, "Converged"), res
    assert await state(clients) == ALL_WHOLE
    assert res["devices_changed"] == ["gpu-0", "gpu-1", "gpu-4", "gpu-5"]

    calls = sim.calls("SetPartitioning")
    code, res = await run(sim, host, layout("[]", "all-whole"))
    assert (code, res["reason"]) == (result.EXIT_OK, "AlreadyConverged"), res
    assert sim.calls("SetPartitioning") == calls
    assert res["devices_changed"] == []
    # the partition action never edits containerd's config nor restarts it (restart: `false`)
    assert (host / "etc/containerd/config.toml").read_bytes() == config
    assert sim.calls("SetFeatures") == 0


async def test_a_node_already_as_the_layout_says_gets_no_set_partitioning(
    runtime_sim_factory: Any, host: Path
) -> None:
    sim = await runtime_sim_factory(inventory="mig-tdm")
    same = layout(
        "- {devices: [0], mig: [3g.40gb, 3g.40gb]}\n"
        "- {devices: [1], mig: [1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb, 1g.10gb]}\n"
        "- {devices: [2], tdm: [50, 25, 25]}\n"
    )
    code, res = await run(sim, host, same)
    assert (code, res["reason"]) == (result.EXIT_OK, "AlreadyConverged"), res
    assert sim.calls("SetPartitioning") == 0
    assert sim.calls("SetDeviceBinding") == 0
    # the same slices in another order are another layout: only that GPU is called
    code, res = await run(sim, host, same.replace("[50,25,25]", "[25,25,50]"))
    assert (code, res["reason"]) == (result.EXIT_OK, "Converged"), res
    assert res["devices_changed"] == ["gpu-2"]
    assert sim.calls("SetPartitioning") == 1


async def test_a_gpu_held_by_a_pod_blocks_with_the_pod_named_and_nothing_changed(
    gpu8: tuple[Simulator, RuntimeClients], host: Path
) -> None:
    sim, clients = gpu8
    held = await allocate(clients, "gpu-1")
    await allocate(clients, "gpu-6", pod="other")  # on a GPU the layout leaves whole: no block
    code, res = await run(sim, host, MIG_0_1)
    assert (code, res["reason"]) == (result.EXIT_BUSY, "AllocationsLive"), res
    assert res["blocked_by"] == [f"gpu-1 by team-a/train-0/main ({held})"]
    assert f"gpu-1 by team-a/train-0/main ({held})" in res["message"]
    assert res["devices_changed"] == []
    # every GPU the change waits to find free, for the controller to fence (issue 39); gpu-6,
    # which the layout leaves as it is, keeps serving
    assert res["devices_waited"] == ["gpu-0", "gpu-1", "gpu-2"]
    assert await state(clients) == ALL_WHOLE  # gpu-0 and gpu-2 were free, and untouched too
    assert sim.calls("SetPartitioning") == 0


async def test_a_pod_on_one_partition_blocks_its_whole_gpu(
    runtime_sim_factory: Any, host: Path
) -> None:
    sim = await runtime_sim_factory(inventory="mig-tdm")
    async with runtime_clients(sim) as clients:
        before = await state(clients)
        held = await allocate(clients, "gpu-2-tdm-1", pod="infer-3")
        code, res = await run(sim, host, layout("- {devices: [2], tdm: [50, 50]}"))
        assert code == result.EXIT_BUSY, res
        assert f"gpu-2 by team-a/infer-3/main ({held})" in res["blocked_by"]
        assert await state(clients) == before
    assert sim.calls("SetPartitioning") == 0


async def test_a_change_waits_for_the_pod_and_converges_once_it_ends(
    gpu8: tuple[Simulator, RuntimeClients], host: Path
) -> None:
    sim, clients = gpu8
    held = await allocate(clients, "gpu-1")
    agent = asyncio.create_task(run(sim, host, MIG_0_1, "--wait-for-release=60"))
    deadline = time.monotonic() + 30
    while sim.calls("ListAllocations") < 1 and not agent.done():  # the agent has seen it held
        assert time.monotonic() < deadline, "the agent never asked for the allocations"
        await asyncio.sleep(0.05)
    assert not agent.done()
    assert await state(clients) == ALL_WHOLE  # waiting changes nothing, not even free GPUs
    await clients.device.Release(pb.ReleaseRequest(allocation_id=held))
    code, res = await agent
    assert (code, res["reason"]) == (result.EXIT_OK, "Converged"), res
    assert sim.calls("ListAllocations") >= 2
    assert res["blocked_by"] == []
    assert (await state(clients))["gpu-1"] == "mig 3g.40gb+3g.40gb"


def _supports_only_mig_on_gpu_3() -> Any:
    inv = load_inventory("gpu-8x-nvlink")
    devices = tuple(
        dataclasses.replace(d, supports=frozenset({Mode.MIG})) if d.id == "gpu-3" else d
        for d in inv.devices
    )
    return dataclasses.replace(inv, devices=devices)


@pytest.mark.parametrize(
    ("layout_json", "words"),
    [
        (
            layout("- {devices: [0], mig: [3g.40gb]}\n- {devices: [3], tdm: [50, 50]}"),
            ["GPU 3 (gpu-3)", "TDM is not supported", "test-layout"],
        ),
        (
            layout("- {devices: [0], mig: [1g.10gb]}\n- {devices: [1], mig: [3g.40gb, 3g.50gb]}"),
            ["GPU 1 (gpu-1)", "need 90 GiB", "has 80 GiB", "test-layout"],
        ),
        (
            layout("- {devices: [0], mig: [3g.40gb]}\n- {devices: [9], tdm: [50]}"),
            ["GPU 9", "node has GPUs 0, 1, 2, 3, 4, 5, 6, 7", "test-layout"],
        ),
        ("{not json", ["not a partition layout", "not JSON"]),
        (
            '{"name":"mixed","entries":[{"devices":[0],"mig":["3g.40gb"],"tdm":[50]}]}',
            ["not a partition layout", "MIG and TDM"],
        ),
    ],
    ids=[
        "mode-not-supported",
        "mig-memory-over-the-gpus",
        "gpu-the-node-lacks",
        "not-json",
        "not-a-layout",
    ],
)
async def test_a_layout_the_node_cannot_take_is_refused_before_anything_changes(
    runtime_sim_factory: Any, host: Path, layout_json: str, words: list[str]
) -> None:
    sim = await runtime_sim_factory(inventory=_supports_only_mig_on_gpu_3())
    async with runtime_clients(sim) as clients:
        code, res = await run(sim, host, layout_json)
        assert (code, res["reason"]) == (result.EXIT_LAYOUT_REFUSED, "LayoutRefused"), res
        for word in words:
            assert word in res["message"]
        assert await state(clients) == ALL_WHOLE
    assert sim.calls("SetPartitioning") == 0


async def test_a_failure_halfway_names_what_changed_and_a_rerun_converges(
    gpu8: tuple[Simulator, RuntimeClients], host: Path
) -> None:
    sim, clients = gpu8
    real_enter = sim.faults.enter

    async def third_set_partitioning_fails(method: str, context: Any) -> None:
        await real_enter(method, context)
        if method == "ConfigService.SetPartitioning" and sim.calls(method) == 3:
            await context.abort(grpc.StatusCode.INTERNAL, "injected: MIG reconfigure failed")

    sim.faults.enter = third_set_partitioning_fails  # type: ignore[method-assign]
    four = layout("- {devices: [0, 1, 2, 3], mig: [3g.40gb]}")
    code, res = await run(sim, host, four)
    assert (code, res["reason"]) == (result.EXIT_FAILED, "PartitioningFailed"), res
    assert res["devices_changed"] == ["gpu-0", "gpu-1"]
    message = res["message"]
    assert "gpu-2: whole → MIG 3g.40gb failed" in message
    assert "injected: MIG reconfigure failed" in message
    assert "changed: gpu-0: whole → MIG 3g.40gb; gpu-1: whole → MIG 3g.40gb" in message
    assert "not yet: gpu-3" in message
    assert "a rerun continues from gpu-2" in message
    assert await state(clients) == {**ALL_WHOLE, "gpu-0": "mig 3g.40gb", "gpu-1": "mig 3g.40gb"}

    code, res = await run(sim, host, four)
    assert (code, res["reason"]) == (result.EXIT_OK, "Converged"), res
    assert res["devices_changed"] == ["gpu-2", "gpu-3"]
    assert await state(clients) == {**ALL_WHOLE, **{f"gpu-{i}": "mig 3g.40gb" for i in range(4)}}


async def test_a_pod_arriving_after_the_wait_is_reported_busy_with_what_changed(
    gpu8: tuple[Simulator, RuntimeClients], host: Path
) -> None:
    sim, clients = gpu8
    real_enter = sim.faults.enter
    arrived: list[str] = []

    async def pod_lands_on_gpu_1(method: str, context: Any) -> None:
        # the race: a pod gets gpu-1 after the agent's last ListAllocations, before its change
        if method == "ConfigService.SetPartitioning" and not arrived:
            arrived.append(await allocate(clients, "gpu-1", pod="late"))
        await real_enter(method, context)

    sim.faults.enter = pod_lands_on_gpu_1  # type: ignore[method-assign]
    code, res = await run(sim, host, MIG_0_1)
    assert (code, res["reason"]) == (result.EXIT_BUSY, "AllocationsLive"), res
    assert res["devices_changed"] == ["gpu-0"]
    assert res["blocked_by"] == [f"gpu-1 by team-a/late/main ({arrived[0]})"]
    assert "changed: gpu-0: whole → MIG 3g.40gb+3g.40gb" in res["message"]
    assert "not yet: gpu-2" in res["message"]
    assert (await state(clients))["gpu-2"] == "whole"


async def test_a_runtime_refusal_with_no_pod_behind_it_is_a_failure_not_a_wait(
    gpu8: tuple[Simulator, RuntimeClients], host: Path
) -> None:
    sim, _ = gpu8
    sim.fail("SetPartitioning", grpc.StatusCode.FAILED_PRECONDITION)
    code, res = await run(sim, host, MIG_0_1)
    assert (code, res["reason"]) == (result.EXIT_FAILED, "PartitioningFailed"), res
    assert "FAILED_PRECONDITION" in res["message"]
    assert "changed: none" in res["message"]
    assert res["blocked_by"] == []


@pytest.fixture
async def no_vms(tmp_path: Path) -> AsyncIterator[str]:
    """The kubelet's pod-resources socket, no pod holding anything: a vfio GPU may change."""
    server = PodResourcesServer(str(tmp_path / "pod-resources"), lambda: Snapshot([], [], {}))
    await server.start()
    try:
        yield f"--pod-resources-socket={server.socket_path}"
    finally:
        await server.stop()


async def test_vfio_binds_two_gpus_and_a_later_layout_gives_them_back(
    gpu8: tuple[Simulator, RuntimeClients], host: Path, no_vms: str
) -> None:
    sim, clients = gpu8
    code, res = await run(sim, host, layout("- {devices: [6, 7], vfio: true}"))
    assert (code, res["reason"]) == (result.EXIT_OK, "Converged"), res
    assert await state(clients) == {**ALL_WHOLE, "gpu-6": "vfio", "gpu-7": "vfio"}
    assert "gpu-6: whole → vfio-pci" in res["message"]
    assert sim.calls("SetPartitioning") == 0

    # from vfio to MIG: back to the driver first, then partitioned (test_partition_vfio.py: only
    # once the kubelet says no VM pod holds them)
    code, res = await run(sim, host, layout("- {devices: [6], mig: [3g.40gb]}"), no_vms)
    assert (code, res["reason"]) == (result.EXIT_OK, "Converged"), res
    assert await state(clients) == {**ALL_WHOLE, "gpu-6": "mig 3g.40gb"}
    assert res["devices_changed"] == ["gpu-6", "gpu-7"]

    # from MIG to vfio: made whole first
    code, res = await run(sim, host, layout("- {devices: [6, 7], vfio: true}"))
    assert (code, res["reason"]) == (result.EXIT_OK, "Converged"), res
    assert await state(clients) == {**ALL_WHOLE, "gpu-6": "vfio", "gpu-7": "vfio"}

    code, res = await run(sim, host, layout("[]"), no_vms)
    assert (code, res["reason"]) == (result.EXIT_OK, "Converged"), res
    assert await state(clients) == ALL_WHOLE


async def test_vfio_on_a_runtime_without_set_device_binding_is_refused_naming_it(
    gpu8: tuple[Simulator, RuntimeClients], host: Path
) -> None:
    sim, clients = gpu8
    sim.set_capabilities(c for c in DEFAULT_CAPABILITIES if c != SET_DEVICE_BINDING)
    code, res = await run(
        sim, host, layout("- {devices: [0], mig: [3g.40gb]}\n- {devices: [6, 7], vfio: true}")
    )
    assert (code, res["reason"]) == (result.EXIT_LAYOUT_REFUSED, "LayoutRefused"), res
    assert SET_DEVICE_BINDING in res["message"]
    assert "GPU 6 (gpu-6)" in res["message"]
    assert await state(clients) == ALL_WHOLE
    assert sim.calls("SetPartitioning") == 0
    # a layout without vfio never asks for the method
    code, res = await run(sim, host, layout("- {devices: [0], mig: [3g.40gb]}"))
    assert code == result.EXIT_OK, res
    assert sim.calls("SetDeviceBinding") == 1  # the probe of the refused run only


async def test_a_runtime_older_than_partitioning_is_refused_naming_both_versions(
    runtime_sim_factory: Any, host: Path
) -> None:
    old = dataclasses.replace(load_inventory("gpu-8x-nvlink"), runtime_version="v1.12.0")
    sim = await runtime_sim_factory(inventory=old)
    code, res = await run(sim, host, MIG_0_1)
    assert (code, res["reason"]) == (result.EXIT_RUNTIME_TOO_OLD, "RuntimeTooOld"), res
    assert "v1.12.0" in res["message"]
    assert "partitioning needs v1.13.0" in res["message"]
    assert sim.calls("SetPartitioning") == 0


async def test_a_stopped_runtime_is_reported_unavailable(
    gpu8: tuple[Simulator, RuntimeClients], host: Path
) -> None:
    sim, _ = gpu8
    await sim.stop()
    code, res = await run(sim, host, MIG_0_1)
    assert (code, res["reason"]) == (result.EXIT_RUNTIME_UNAVAILABLE, "RuntimeUnavailable")
    assert res["layout"] == "test-layout"


@pytest.mark.parametrize(
    "args",
    [["partition", "--node-name=n"], ["enable", "--node-name=n", f"--layout={MIG_0_1}"]],
    ids=["partition-without-layout", "enable-with-layout"],
)
def test_layout_is_required_for_partition_and_refused_otherwise(
    args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ConfigError, match="--layout"):
        settings.load(args, environ={})
    assert main(args) == result.EXIT_USAGE
    assert "--layout" in capsys.readouterr().err


async def test_a_dry_run_says_what_would_change_and_changes_nothing(
    gpu8: tuple[Simulator, RuntimeClients], host: Path
) -> None:
    sim, clients = gpu8
    code, res = await run(sim, host, MIG_0_1, "--dry-run")
    assert (code, res["reason"]) == (result.EXIT_OK, "DryRun"), res
    assert "gpu-2: whole → MIG 7g.80gb" in res["message"]
    assert await state(clients) == ALL_WHOLE
    assert sim.calls("SetPartitioning") == 0


def test_the_process_exits_8_for_a_layout_that_is_not_one(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    args = [
        "partition",
        "--node-name=n",
        f"--socket-dir={tmp_path}",
        '--layout={"name": "x"}',
        f"--termination-log={log}",
        "--log-format=json",
    ]
    assert main(args) == result.EXIT_LAYOUT_REFUSED
    assert json.loads(log.read_text())["reason"] == "LayoutRefused"


async def test_a_runtime_that_accepts_a_change_but_does_not_make_it_is_not_converged(
    gpu8: tuple[Simulator, RuntimeClients], host: Path
) -> None:
    sim, clients = gpu8

    def ignores(device_id: str, mode: Mode, specs: Any) -> Any:
        return sim.node.devices[device_id]  # answers OK, changes nothing

    sim.node.set_partitioning = ignores  # type: ignore[method-assign]
    code, res = await run(sim, host, layout("- {devices: [3], mig: [3g.40gb]}"))
    assert (code, res["reason"]) == (result.EXIT_FAILED, "PartitioningFailed"), res
    assert "reports gpu-3: whole → MIG 3g.40gb still to do" in res["message"]
    assert await state(clients) == ALL_WHOLE
