"""Lifecycle of the operator: HTTP first, then the Lease, then the reconcile loop while leading."""

from __future__ import annotations

from collections.abc import Sequence

from . import __version__, lifecycle, manager, server
from .errors import OperatorError
from .kube import Kube, LeaseObject, api_client
from .metrics import Metrics
from .ratelimit import TokenBucket
from .reconciler import Reconciler
from .settings import Settings

#: Exit code of a second SIGTERM/SIGINT (the shell's 128 + SIGINT), the same in every daemon.
EXIT_FORCED = lifecycle.EXIT_FORCED


class Operator(manager.Manager):
    """One replica: serves /metrics and /healthz, leads or waits, and reconciles while leading.

    ``run()`` returns the exit code: 0 after ``stop`` (a signal), 1 when a task failed or the
    Lease was lost. Its tasks run under ``tasks``, whose guard records a failed one and sets
    ``stop`` (``manager.py``)."""

    def __init__(self, settings: Settings, tasks: lifecycle.Tasks | None = None) -> None:
        super().__init__("operator", tasks)
        self.settings = settings
        self.metrics = Metrics()
        self.loop: Reconciler | None = None

    def degraded(self) -> list[str]:
        failing = self.loop.failing if self.loop is not None else {}
        return [f"{what} failing: {e}" for what, e in failing.items()]

    async def run(self) -> int:
        s = self.settings
        api = await api_client(s.kubeconfig)
        kube = Kube(
            api,
            TokenBucket(s.kube_api_qps, s.kube_api_burst),
            lambda verb: self.metrics.api_requests.labels(verb).inc(),
        )
        host, port = s.metrics_address
        try:
            runner, self.port = await server.start(
                server.create_app(self.metrics, self.health, self.degraded), host, port
            )
            if s.probe_address is not None:
                # the probe address serves the same routes: kubelet probes reach /healthz there
                await server.add_site(runner, *s.probe_address)
        except OSError as e:
            await api.close()
            raise OperatorError(f"cannot serve on {s.metrics_bind_address}: {e}") from e
        self.log.info("serving", address=host, port=self.port)
        elector = manager.elector(s, lambda namespace, name: LeaseObject(kube, namespace, name))
        try:
            code = await self.lead(elector, lambda: self._start_loop(kube), self.metrics.leader.set)
        finally:
            await runner.cleanup()
            await api.close()
        return self.exit_code(code)

    def _start_loop(self, kube: Kube) -> None:
        self.loop = Reconciler(self.settings, kube, self.metrics)
        self._spawn("watch-policies", self.loop.watch())
        self._spawn("reconcile", self.loop.run())


def run(settings: Settings, deprecations: Sequence[str] = ()) -> int:
    """Exit 0 after a signal; 1 when a task failed, the Lease was lost, the port is taken or the
    credentials do not load; a second signal exits 130 at once (lifecycle)."""
    return manager.run(
        settings,
        deprecations,
        name="operator",
        version=__version__,
        error=OperatorError,
        manager=lambda tasks: Operator(settings, tasks),
    )
