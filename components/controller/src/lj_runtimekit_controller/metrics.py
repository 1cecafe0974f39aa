"""The controller's metrics, in a registry of its own (tests get a fresh one)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

NS = "lj_runtimekit_controller"


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.actions = Counter(
            f"{NS}_actions",
            "Finished agent Jobs, by action and result.",
            ["action", "result"],
            registry=r,
        )
        self.duration = Histogram(
            f"{NS}_action_duration_seconds",
            "From Job creation to its result, by action.",
            ["action"],
            registry=r,
            buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600),
        )
        self.jobs_created = Counter(
            f"{NS}_jobs_created", "Agent Jobs created.", ["action"], registry=r
        )
        self.queue_depth = Gauge(f"{NS}_queue_depth", "Nodes waiting for a reconcile.", registry=r)
        self.active_jobs = Gauge(f"{NS}_active_jobs", "Agent Jobs running now.", registry=r)
        self.api_requests = Counter(
            f"{NS}_api_requests", "Apiserver requests, by verb.", ["verb"], registry=r
        )
        self.reconcile_errors = Counter(
            f"{NS}_reconcile_errors", "Reconciles that raised.", registry=r
        )
        self.leader = Gauge(f"{NS}_leader", "1 while this replica holds the Lease.", registry=r)
