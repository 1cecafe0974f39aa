"""The kubelet's Registration service on ``<plugin_dir>/kubelet.sock``, with its checks."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable

import grpc
import structlog

from lj_runtimekit_interface.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from lj_runtimekit_interface.sockets import DEVICE_PLUGIN_API_VERSION
from lj_runtimekit_testkit.kubelet.allocation import resource_name_error

log = structlog.get_logger(__name__)

SUPPORTED_VERSIONS = (DEVICE_PLUGIN_API_VERSION,)

RegisterHandler = Callable[[api_pb2.RegisterRequest], Awaitable[None]]


class RegistrationServicer(api_pb2_grpc.RegistrationServicer):
    """Validates a request as the kubelet does, then hands it to ``on_register``."""

    def __init__(self, plugin_dir: str, on_register: RegisterHandler) -> None:
        self._plugin_dir = plugin_dir
        self._on_register = on_register
        self.requests: list[api_pb2.RegisterRequest] = []
        self.rejected: list[tuple[api_pb2.RegisterRequest, str]] = []

    def _error(self, request: api_pb2.RegisterRequest) -> str | None:
        if request.version not in SUPPORTED_VERSIONS:
            return (
                f"Requested device plugin version {request.version!r} is not supported: "
                f"the kubelet speaks {', '.join(SUPPORTED_VERSIONS)}"
            )
        name_error = resource_name_error(request.resource_name)
        if name_error:
            return name_error
        endpoint = request.endpoint
        if not endpoint or os.path.basename(endpoint) != endpoint:
            return f"endpoint {endpoint!r} must be a socket file name in {self._plugin_dir}"
        return None

    async def Register(
        self, request: api_pb2.RegisterRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> api_pb2.Empty:
        error = self._error(request)
        if error:
            self.rejected.append((request, error))
            log.info("plugin_registration_rejected", resource=request.resource_name, error=error)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, error)
        self.requests.append(request)
        try:
            await self._on_register(request)
        except (OSError, TimeoutError, grpc.aio.AioRpcError) as e:
            message = f"cannot reach plugin endpoint {request.endpoint}: {e}"
            self.rejected.append((request, message))
            await context.abort(grpc.StatusCode.UNAVAILABLE, message)
        log.info("plugin_registered", resource=request.resource_name, endpoint=request.endpoint)
        return api_pb2.Empty()
