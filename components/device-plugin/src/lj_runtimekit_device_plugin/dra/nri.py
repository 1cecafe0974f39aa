"""The NRI plugin of mode dra: the Runtime's injection annotations onto the container.

CDI does not copy a device's annotations to the container, so at containerd's CreateContainer
(NRI, the Node Resource Interface: containerd calls its plugins after the CRI spec, CDI edits
included, is built) this plugin adds the ``xdm.amp.com*`` annotations of the container's prepared
DRA devices (:mod:`.cdi_annotations`, from the CDI specs :mod:`.prepare` wrote) to its OCI
spec, where the ``lj-runtime`` handler reads them, as in mode device-plugin.

It must never block a container: anything that goes wrong answers an empty adjustment and is
logged; a container without our devices is answered at once, without reading a file. A missing
NRI socket (NRI off in containerd, or containerd restarting) is not fatal: logged once, retried
with the guide's backoff until it appears.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import structlog
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential

from lj_runtimekit_interface.nri.v1alpha1 import api_pb2

from ..runtime_channel import BACKOFF_FACTOR, BACKOFF_INITIAL_S, BACKOFF_MAX_S
from . import ttrpc
from .cdi_annotations import adjustment, our_devices

log = structlog.get_logger(__name__)

PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
NAME = "lj-runtimekit"
#: NRI calls plugins in ascending index order; the middle leaves room on both sides.
INDEX = "50"
#: containerd's default request timeout, until its Configure says otherwise.
DEFAULT_TIMEOUT_S = 2.0
#: How long containerd may take to answer the registration (its own default is 5 s).
REGISTER_TIMEOUT_S = 10.0
BACKOFF = wait_exponential(
    multiplier=BACKOFF_INITIAL_S, exp_base=BACKOFF_FACTOR, min=BACKOFF_INITIAL_S, max=BACKOFF_MAX_S
)
_EMPTY = api_pb2.CreateContainerResponse().SerializeToString()


class NriUnavailable(Exception):
    """The NRI socket cannot be reached, refused the registration or closed."""


def read_specs(cdi_dir: Path, kind: str) -> list[dict[str, Any]]:
    """The CDI specs of ``kind`` in ``cdi_dir`` (files named as :func:`.cdi.spec_file_name`
    names them); one that cannot be read or parsed is skipped and logged (it may be mid-write
    by another tool: ours are replaced atomically)."""
    specs = []
    for path in sorted(cdi_dir.glob(f"{kind.replace('/', '-')}_*.json")):
        try:
            spec = json.loads(path.read_bytes())
        except (OSError, ValueError) as e:
            log.warning("nri_cdi_spec_unreadable", path=str(path), error=str(e))
            continue
        if isinstance(spec, dict):
            specs.append(spec)
    return specs


class NriPlugin:
    """Registers with containerd's NRI on ``socket`` and answers CreateContainer."""

    def __init__(
        self, socket: str, cdi_dir: Path, kind: str, *, name: str = NAME, index: str = INDEX
    ) -> None:
        self.socket, self.cdi_dir, self.kind = socket, cdi_dir, kind
        self.name, self.index = name, index
        self.timeout_s = DEFAULT_TIMEOUT_S
        self.registered = asyncio.Event()
        self._told = False

    async def run(self) -> None:
        """Stay registered until cancelled: reconnect with the guide's backoff whenever the
        socket is absent or the connection ends."""
        while True:
            retrying = AsyncRetrying(
                retry=retry_if_exception_type(NriUnavailable),
                wait=BACKOFF,
                before_sleep=self._waiting,
            )
            async for attempt in retrying:
                with attempt:
                    await self._session()
            # registered, then the runtime went away (a containerd restart): start afresh
            await asyncio.sleep(BACKOFF_INITIAL_S)

    def _waiting(self, state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        wait = state.next_action.sleep if state.next_action is not None else None
        if not self._told:
            self._told = True
            log.warning(
                "nri_unavailable",
                socket=self.socket,
                error=str(error),
                effect="containers of DRA claims start without the Runtime's annotations",
                check="is NRI enabled in containerd ([plugins.'io.containerd.nri.v1.nri'] "
                "disable = false) and its socket mounted here (--nri-socket)?",
                retry="with backoff, logged again once registered",
            )
        else:
            log.debug("nri_unavailable", socket=self.socket, error=str(error), retry_in_s=wait)

    async def _session(self) -> None:
        """One connection: register, serve until it closes (returns), or NriUnavailable."""
        try:
            conn = await ttrpc.connect(self.socket, self._handle)
        except OSError as e:
            raise NriUnavailable(f"NRI socket {self.socket}: {e}") from e
        reader = asyncio.create_task(conn.run(), name="nri-read")
        try:
            request = api_pb2.RegisterPluginRequest(plugin_name=self.name, plugin_idx=self.index)
            payload = request.SerializeToString()
            await conn.call(RUNTIME_SERVICE, "RegisterPlugin", payload, REGISTER_TIMEOUT_S)
            log.info("nri_plugin_registered", socket=self.socket, name=self.name, index=self.index)
            self.registered.set()
            self._told = False
            await reader
        except (ttrpc.CallFailed, ttrpc.ProtocolError, TimeoutError, ConnectionError) as e:
            raise NriUnavailable(f"NRI registration on {self.socket}: {e}") from e
        finally:
            self.registered.clear()
            reader.cancel()
            await conn.close()
        log.warning("nri_connection_closed", socket=self.socket, next="reconnect")

    async def _handle(self, service: str, method: str, payload: bytes) -> bytes:
        if service != PLUGIN_SERVICE:
            raise ttrpc.CallFailed(ttrpc.UNIMPLEMENTED, f"service {service} is not served")
        if method == "CreateContainer":
            try:
                return await self._create(api_pb2.CreateContainerRequest.FromString(payload))
            except Exception as e:  # noqa: BLE001 - an error answer would fail the container
                log.error("nri_annotations_not_added", error=repr(e), effect="empty adjustment")
                return _EMPTY
        if method == "Configure":
            req = api_pb2.ConfigureRequest.FromString(payload)
            if req.request_timeout > 0:
                self.timeout_s = req.request_timeout / 1000
            log.info(
                "nri_plugin_configured",
                runtime=f"{req.runtime_name} {req.runtime_version}",
                nri_version=req.NRI_version,
                request_timeout_s=self.timeout_s,
            )
            events = 1 << (api_pb2.CREATE_CONTAINER - 1)
            return api_pb2.ConfigureResponse(events=events).SerializeToString()
        if method == "Synchronize":
            more = api_pb2.SynchronizeRequest.FromString(payload).more
            return api_pb2.SynchronizeResponse(more=more).SerializeToString()
        if method == "Shutdown":
            log.info("nri_shutdown_requested", socket=self.socket)
            return api_pb2.Empty().SerializeToString()
        raise ttrpc.CallFailed(ttrpc.UNIMPLEMENTED, f"method {method} is not served")

    async def _create(self, req: api_pb2.CreateContainerRequest) -> bytes:
        c = req.container
        names = our_devices((d.name for d in c.CDI_devices), c.annotations, self.kind)
        if not names:
            return _EMPTY
        where = {"pod": f"{req.pod.namespace}/{req.pod.name}", "container": c.name}
        try:
            # half the runtime's timeout: an answer after it would fail the container
            async with asyncio.timeout(self.timeout_s / 2):
                specs = await asyncio.to_thread(read_specs, self.cdi_dir, self.kind)
        except TimeoutError:
            log.error("nri_annotations_not_added", **where, error="reading the CDI specs timed out")
            return _EMPTY
        adj = adjustment(names, specs, self.kind)
        if adj.conflicts:
            log.warning("nri_annotation_conflict", **where, keys=list(adj.conflicts), kept="first")
        if not adj.annotations:
            log.warning(
                "nri_annotations_not_found",
                **where,
                devices=list(names),
                check=f"the claim's CDI spec in {self.cdi_dir}",
            )
            return _EMPTY
        log.info("nri_annotations_added", **where, keys=sorted(adj.annotations))
        response = api_pb2.CreateContainerResponse()
        response.adjust.annotations.update(adj.annotations)
        return response.SerializeToString()
