"""The kubelet's side of DRA (mode dra): plugin registration and the DRAPlugin gRPC service.

The kubelet's plugin watcher finds ``<registry dir>/<driver>-reg.sock`` and asks it ``GetInfo``:
type ``DRAPlugin``, the driver name, the endpoint of the DRA service
(``<plugin dir>/<driver>/dra.sock``, a path the kubelet sees the same) and the service versions we
serve. It then calls ``NodePrepareResources`` / ``NodeUnprepareResources`` there. Both sockets are
made anew at start (a stale file from a killed process would make the bind fail) and removed at
stop, which is how the kubelet learns the plugin went away.

In mode device-plugin the same servers stay while the DRA checkpoint still holds claims (a node
moved back with DRA pods running, docs/dra.md): ``NodeUnprepareResources`` releases as in mode dra,
and ``NodePrepareResources`` answers only a claim already prepared (a kubelet restart repeats
those) and refuses any other, since the node publishes no ResourceSlices any more.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path

import grpc
import structlog

from lj_runtimekit_interface import sockets
from lj_runtimekit_interface.dra.v1 import api_pb2 as dra_pb2
from lj_runtimekit_interface.dra.v1 import api_pb2_grpc as dra_grpc
from lj_runtimekit_interface.dra.v1beta1 import api_pb2 as beta_pb2
from lj_runtimekit_interface.dra.v1beta1 import api_pb2_grpc as beta_grpc
from lj_runtimekit_interface.pluginregistration.v1 import api_pb2 as reg_pb2
from lj_runtimekit_interface.pluginregistration.v1 import api_pb2_grpc as reg_grpc

from .checkpoint import ClaimRecord, claimed_ids
from .plan import ClaimRef, Outcome
from .prepare import Preparer

log = structlog.get_logger(__name__)

PLUGIN_TYPE = "DRAPlugin"
#: The DRA gRPC services served, as the kubelet names them in registration (its
#: ``DRAPluginService`` constants of k8s.io/kubelet/pkg/apis/dra/v1 and v1beta1), newest first:
#: a kubelet takes the newest it knows, so 1.34+ speaks v1 and an older one v1beta1.
SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")


def _refs(claims: object) -> list[ClaimRef]:
    return [ClaimRef(c.namespace, c.name, c.uid) for c in claims]  # type: ignore[attr-defined]


def refusal(ref: ClaimRef, driver: str) -> str:
    return (
        f"claim {ref.namespace}/{ref.name} cannot be prepared: this node is in device-plugin mode "
        f"(node label lj_runtimekit_device_mode is not dra), where {driver} only releases the "
        "claims it prepared before; the claim was allocated from a ResourceSlice since withdrawn: "
        "delete the pod so that its claim is allocated on a node in DRA mode"
    )


class DRAPlugin(dra_grpc.DRAPluginServicer):
    def __init__(
        self,
        preparer: Preparer,
        *,
        prepare: bool = True,
        on_unprepared: Callable[[], None] | None = None,
    ) -> None:
        self.preparer = preparer
        self.prepare = prepare
        """False in mode device-plugin: only claims already prepared are answered."""
        self.on_unprepared = on_unprepared or (lambda: None)
        self._lock = asyncio.Lock()

    @contextlib.asynccontextmanager
    async def settled(self) -> AsyncIterator[frozenset[str]]:
        """The Runtime allocation ids of the prepared claims; no prepare or unprepare runs until
        the block ends (so a Runtime listing inside it matches them)."""
        async with self._lock:
            yield claimed_ids(self.preparer.checkpoint)

    async def _prepare(self, refs: list[ClaimRef]) -> dict[str, Outcome]:
        if self.prepare:
            return await self.preparer.prepare(refs)
        known = self.preparer.checkpoint.claims
        out = {
            r.uid: await self.preparer.refuse(r, refusal(r, self.preparer.driver))
            for r in refs
            if r.uid not in known
        }
        # a repeated prepare allocates nothing: it answers the CDI ids of the checkpoint
        out.update(await self.preparer.prepare([r for r in refs if r.uid in known]))
        return out

    async def NodePrepareResources(
        self,
        request: dra_pb2.NodePrepareResourcesRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> dra_pb2.NodePrepareResourcesResponse:
        async with self._lock:
            outcomes = await self._prepare(_refs(request.claims))
        resp = dra_pb2.NodePrepareResourcesResponse()
        for uid, outcome in outcomes.items():
            entry = resp.claims[uid]
            if outcome.error:
                entry.error = outcome.error
                continue
            entry.devices.extend(
                dra_pb2.Device(
                    request_names=list(d.requests),
                    pool_name=d.pool,
                    device_name=d.device,
                    cdi_device_ids=list(d.cdi_device_ids),
                    share_id=d.share_id or None,
                )
                for d in outcome.devices
            )
        return resp

    async def NodeUnprepareResources(
        self,
        request: dra_pb2.NodeUnprepareResourcesRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> dra_pb2.NodeUnprepareResourcesResponse:
        async with self._lock:
            errors = await self.preparer.unprepare(_refs(request.claims))
        self.on_unprepared()
        resp = dra_pb2.NodeUnprepareResourcesResponse()
        for uid, error in errors.items():
            resp.claims[uid].error = error
        return resp


class DRAPluginV1Beta1(beta_grpc.DRAPluginServicer):
    """The same service in the kubelet's v1beta1 messages, for a kubelet that speaks no v1. The
    two are the same on the wire but for v1's ``Device.share_id`` (a share's id, which a v1beta1
    kubelet has no field for: it is dropped), so each call converts through bytes."""

    def __init__(self, v1: DRAPlugin) -> None:
        self.v1 = v1

    async def NodePrepareResources(
        self,
        request: beta_pb2.NodePrepareResourcesRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> beta_pb2.NodePrepareResourcesResponse:
        v1_request = dra_pb2.NodePrepareResourcesRequest.FromString(request.SerializeToString())
        answer = await self.v1.NodePrepareResources(v1_request, context)
        for entry in answer.claims.values():
            for device in entry.devices:
                device.ClearField("share_id")
        return beta_pb2.NodePrepareResourcesResponse.FromString(answer.SerializeToString())

    async def NodeUnprepareResources(
        self,
        request: beta_pb2.NodeUnprepareResourcesRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> beta_pb2.NodeUnprepareResourcesResponse:
        v1_request = dra_pb2.NodeUnprepareResourcesRequest.FromString(request.SerializeToString())
        answer = await self.v1.NodeUnprepareResources(v1_request, context)
        return beta_pb2.NodeUnprepareResourcesResponse.FromString(answer.SerializeToString())


class Registration(reg_grpc.RegistrationServicer):
    def __init__(self, driver: str, endpoint: str) -> None:
        self.driver = driver
        self.endpoint = endpoint
        self.registered = asyncio.Event()
        self.refusal = ""

    async def GetInfo(
        self, request: reg_pb2.InfoRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> reg_pb2.PluginInfo:
        return reg_pb2.PluginInfo(
            type=PLUGIN_TYPE,
            name=self.driver,
            endpoint=self.endpoint,
            supported_versions=list(SUPPORTED_VERSIONS),
        )

    async def NotifyRegistrationStatus(
        self,
        request: reg_pb2.RegistrationStatus,
        context: grpc.aio.ServicerContext[object, object],
    ) -> reg_pb2.RegistrationStatusResponse:
        if request.plugin_registered:
            self.refusal = ""
            self.registered.set()
            log.info("dra_plugin_registered", driver=self.driver, endpoint=self.endpoint)
        else:
            self.refusal = request.error or "no reason given"
            self.registered.clear()
            log.error(
                "dra_plugin_registration_refused",
                driver=self.driver,
                error=self.refusal,
                check="does this kubelet serve DRA (Kubernetes 1.34+) and the v1 DRAPlugin API?",
            )
        return reg_pb2.RegistrationStatusResponse()


def _fresh_socket(path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    return sockets.unix_target(str(path))


def _inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except FileNotFoundError:
        return None


class DraHost:
    """Both servers of the DRA kubelet plugin, on their sockets."""

    def __init__(
        self,
        preparer: Preparer,
        *,
        driver: str,
        plugin_dir: str,
        registry_dir: str,
        prepare: bool = True,
        on_unprepared: Callable[[], None] | None = None,
    ):
        self.driver = driver
        self.dra_socket = Path(plugin_dir) / driver / "dra.sock"
        self.reg_socket = Path(registry_dir) / f"{driver}-reg.sock"
        self.registration = Registration(driver, str(self.dra_socket))
        self.plugin = DRAPlugin(preparer, prepare=prepare, on_unprepared=on_unprepared)
        self._servers: list[grpc.aio.Server] = []
        self._made: dict[Path, int | None] = {}
        """Each socket this host bound, with its inode: stop removes only those (the other
        mode's pod may have bound the same path since, when a node changes mode)."""

    async def start(self) -> None:
        dra = grpc.aio.server()
        dra_grpc.add_DRAPluginServicer_to_server(self.plugin, dra)
        beta_grpc.add_DRAPluginServicer_to_server(DRAPluginV1Beta1(self.plugin), dra)
        dra.add_insecure_port(_fresh_socket(self.dra_socket))
        await dra.start()
        self._servers.append(dra)
        self._made[self.dra_socket] = _inode(self.dra_socket)
        # registration last: the kubelet may call the endpoint as soon as it learns it
        reg = grpc.aio.server()
        reg_grpc.add_RegistrationServicer_to_server(self.registration, reg)
        reg.add_insecure_port(_fresh_socket(self.reg_socket))
        await reg.start()
        self._servers.append(reg)
        self._made[self.reg_socket] = _inode(self.reg_socket)
        log.info(
            "dra_plugin_serving",
            driver=self.driver,
            registration=str(self.reg_socket),
            endpoint=str(self.dra_socket),
        )

    @property
    def serving(self) -> bool:
        return bool(self._servers)

    @property
    def claims(self) -> Mapping[str, ClaimRecord]:
        """Claim uid → record of each claim the checkpoint holds (prepared, not unprepared)."""
        return self.plugin.preparer.checkpoint.claims

    async def close(self) -> None:
        """Close the clients the host holds (after :meth:`stop`)."""
        await self.plugin.preparer.close()

    async def stop(self) -> None:
        for server in reversed(self._servers):
            await server.stop(grace=1.0)
        self._servers.clear()
        made, self._made = self._made, {}
        for path in (self.reg_socket, self.dra_socket):
            if path in made and _inode(path) == made[path]:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
