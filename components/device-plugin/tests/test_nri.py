"""The NRI plugin: which annotations a container gets (pure), and the plugin against a runtime end
on a real unix socket: registration, the event mask, CreateContainer, errors, reconnects."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from lj_runtimekit_device_plugin.dra import nri, ttrpc
from lj_runtimekit_device_plugin.dra.cdi import PreparedDevice, claim_spec, spec_file_name
from lj_runtimekit_device_plugin.dra.cdi_annotations import adjustment, our_devices
from lj_runtimekit_device_plugin.model import Injection
from lj_runtimekit_interface.nri.v1alpha1 import api_pb2

KIND = "aliyun.com/gpu"
ANNOTATIONS = {"xdm.amp.com.allocation-id": "a-1", "xdm.amp.com.devices": "gpu-0"}


@pytest.mark.parametrize(
    ("cdi_devices", "annotations", "expected"),
    [
        (["aliyun.com/gpu=d1", "other.com/x=d2"], {}, ("d1",)),
        ([], {"cdi.k8s.io/claim": "aliyun.com/gpu=d1, aliyun.com/gpu=d2"}, ("d1", "d2")),
        (["aliyun.com/gpu=d1"], {"cdi.k8s.io/c": "aliyun.com/gpu=d1"}, ("d1",)),
        (["aliyun.com/gpu="], {"other/key": "aliyun.com/gpu=d9"}, ()),
        (["aliyun.com/gpus=d1"], {}, ()),
    ],
    ids=["field-ours-only", "cdi-annotations", "once-each", "nothing-named", "other-kind-prefix"],
)
def test_our_devices(
    cdi_devices: list[str], annotations: dict[str, str], expected: tuple[str, ...]
) -> None:
    assert our_devices(cdi_devices, annotations, KIND) == expected


def test_adjustment_takes_the_named_devices_of_our_kind_and_reports_conflicts() -> None:
    specs: list[dict[str, Any]] = [
        {"kind": "other.com/x", "devices": [{"name": "d1", "annotations": {"bad": "1"}}]},
        {
            "kind": KIND,
            "devices": [
                {"name": "d1", "annotations": {"k": "1", "a": "x"}},
                {"name": "d2", "annotations": {"k": "2", "b": "y"}},
                {"name": "d3", "annotations": {"c": "z"}},
                "garbage",
            ],
        },
        {"kind": KIND, "devices": "garbage"},
    ]
    adj = adjustment(["d1", "d2", "missing"], specs, KIND)
    assert adj.annotations == {"k": "1", "a": "x", "b": "y"}
    assert adj.conflicts == ("k",)


@dataclass
class FakeRuntime:
    """containerd's end of NRI on a unix socket: serves RegisterPlugin, calls the plugin."""

    path: str
    registered: asyncio.Queue[api_pb2.RegisterPluginRequest] = field(default_factory=asyncio.Queue)
    conns: list[ttrpc.MuxConnection] = field(default_factory=list)
    server: asyncio.Server | None = None

    async def start(self) -> None:
        self.server = await asyncio.start_unix_server(self._accept, self.path)

    async def stop(self) -> None:
        for conn in self.conns:
            await conn.close()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
            self.server = None
        await asyncio.to_thread(Path(self.path).unlink, missing_ok=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async def handle(service: str, method: str, payload: bytes) -> bytes:
            assert (service, method) == (nri.RUNTIME_SERVICE, "RegisterPlugin")
            await self.registered.put(api_pb2.RegisterPluginRequest.FromString(payload))
            return api_pb2.Empty().SerializeToString()

        conn = ttrpc.MuxConnection(
            reader, writer, handle, serve_on=ttrpc.RUNTIME_CONN, call_on=ttrpc.PLUGIN_CONN
        )
        self.conns.append(conn)
        await conn.run()

    async def create(self, container: api_pb2.Container) -> dict[str, str]:
        request = api_pb2.CreateContainerRequest(container=container)
        request.pod.name, request.pod.namespace = "p", "ns"
        raw = await self.conns[-1].call(
            nri.PLUGIN_SERVICE, "CreateContainer", request.SerializeToString(), 5
        )
        return dict(api_pb2.CreateContainerResponse.FromString(raw).adjust.annotations)


@pytest.fixture
async def runtime(kubelet_dir: Path) -> AsyncIterator[FakeRuntime]:
    fake = FakeRuntime(str(kubelet_dir / "nri.sock"))
    yield fake
    await fake.stop()


@pytest.fixture
def cdi_dir(tmp_path: Path) -> Path:
    injection = Injection(
        envs=(("LJ_ALLOCATION_ID", "a-1"),), annotations=tuple(ANNOTATIONS.items())
    )
    spec, ids = claim_spec("uid-1", [PreparedDevice("gpus", "node", "gpu-0", injection)], KIND)
    (tmp_path / spec_file_name(KIND, "uid-1")).write_text(json.dumps(spec))
    (tmp_path / "ids.txt").write_text("\n".join(ids.values()))
    return tmp_path


async def _plugin(runtime: FakeRuntime, cdi_dir: Path) -> tuple[nri.NriPlugin, asyncio.Task[None]]:
    plugin = nri.NriPlugin(runtime.path, cdi_dir, KIND)
    return plugin, asyncio.create_task(plugin.run())


async def test_the_plugin_registers_subscribes_to_create_container_and_adds_the_annotations(
    runtime: FakeRuntime, cdi_dir: Path
) -> None:
    await runtime.start()
    _, task = await _plugin(runtime, cdi_dir)
    try:
        req = await asyncio.wait_for(runtime.registered.get(), 5)
        assert (req.plugin_name, req.plugin_idx) == ("lj-runtimekit", "50")
        conn = runtime.conns[-1]
        configure = api_pb2.ConfigureRequest(runtime_name="containerd", request_timeout=2000)
        raw = await conn.call(nri.PLUGIN_SERVICE, "Configure", configure.SerializeToString(), 5)
        assert api_pb2.ConfigureResponse.FromString(raw).events == 1 << 3  # CreateContainer only
        sync = api_pb2.SynchronizeRequest(containers=[api_pb2.Container(id="old")])
        raw = await conn.call(nri.PLUGIN_SERVICE, "Synchronize", sync.SerializeToString(), 5)
        assert api_pb2.SynchronizeResponse.FromString(raw) == api_pb2.SynchronizeResponse()

        (cdi_id,) = (cdi_dir / "ids.txt").read_text().split()
        ours = api_pb2.Container(name="main", CDI_devices=[api_pb2.CDIDevice(name=cdi_id)])
        assert await runtime.create(ours) == ANNOTATIONS
        # the kubelet's older way: CDI ids in a cdi.k8s.io/ annotation
        older = api_pb2.Container(name="main", annotations={"cdi.k8s.io/x": cdi_id})
        assert await runtime.create(older) == ANNOTATIONS
        plain = api_pb2.Container(name="plain", env=["LJ_ALLOCATION_ID=a-1"])
        assert await runtime.create(plain) == {}
        unknown = api_pb2.Container(CDI_devices=[api_pb2.CDIDevice(name=f"{KIND}=gone")])
        assert await runtime.create(unknown) == {}
        with pytest.raises(ttrpc.CallFailed):
            await conn.call(nri.PLUGIN_SERVICE, "StopContainer", b"", 5)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_spec_that_cannot_be_read_gives_an_empty_adjustment_not_an_error(
    runtime: FakeRuntime, cdi_dir: Path
) -> None:
    await runtime.start()
    (cdi_id,) = (cdi_dir / "ids.txt").read_text().split()
    (cdi_dir / spec_file_name(KIND, "uid-1")).write_text("{not json")
    _, task = await _plugin(runtime, cdi_dir)
    try:
        await asyncio.wait_for(runtime.registered.get(), 5)
        ours = api_pb2.Container(CDI_devices=[api_pb2.CDIDevice(name=cdi_id)])
        assert await runtime.create(ours) == {}
        assert await runtime.create(api_pb2.Container()) == {}
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_an_absent_socket_is_waited_for_and_a_restarted_runtime_is_registered_with_again(
    runtime: FakeRuntime, cdi_dir: Path
) -> None:
    plugin, task = await _plugin(runtime, cdi_dir)
    try:
        await asyncio.sleep(0.1)
        assert not task.done()  # no socket: not fatal
        await runtime.start()
        await asyncio.wait_for(runtime.registered.get(), 10)
        await asyncio.wait_for(plugin.registered.wait(), 5)
        await runtime.stop()  # containerd restarts
        await runtime.start()
        await asyncio.wait_for(runtime.registered.get(), 10)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
