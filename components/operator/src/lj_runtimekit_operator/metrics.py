"""The operator's metrics, in a registry of its own (tests get a fresh one)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

NS = "lj_runtimekit_operator"


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.reconciles = Counter(
            f"{NS}_reconciles", "Passes over the policies completed without an error.", registry=r
        )
        self.reconcile_errors = Counter(
            f"{NS}_reconcile_errors",
            "Passes that ended in an error, by reason.",
            ["reason"],
            registry=r,
        )
        self.applies = Counter(
            f"{NS}_applies",
            "Objects applied (server-side apply), by component.",
            ["component"],
            registry=r,
        )
        self.deletes = Counter(
            f"{NS}_deletes",
            "Objects deleted (pruned or torn down), by component.",
            ["component"],
            registry=r,
        )
        self.rollbacks = Counter(
            f"{NS}_rollbacks",
            "Rollouts that failed and were rolled back, by component.",
            ["component"],
            registry=r,
        )
        self.component_ready = Gauge(
            f"{NS}_component_ready",
            "1 while the component is ready (enabled ones only).",
            ["component"],
            registry=r,
        )
        self.api_requests = Counter(
            f"{NS}_api_requests", "Apiserver requests, by verb.", ["verb"], registry=r
        )
        self.leader = Gauge(f"{NS}_leader", "1 while this replica holds the Lease.", registry=r)
