"""The scheduler's Prometheus metrics, in a registry of its own (tests get a fresh one)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._attempts = Counter(
            "lj_scheduler_schedule_attempts_total",
            "Scheduling attempts by result (scheduled, unschedulable, error).",
            ["result"],
            registry=self.registry,
        )
        self._e2e = Histogram(
            "lj_scheduler_scheduling_attempt_duration_seconds",
            "From popping the pod to its Binding accepted by the apiserver.",
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self._plugin = Histogram(
            "lj_scheduler_plugin_execution_duration_seconds",
            "Time in one extension point of one plugin (Filter is timed over all nodes), "
            "observed in one scheduling cycle of ten, as kube-scheduler samples it.",
            ["extension_point", "plugin"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self._depth = Gauge(
            "lj_scheduler_pending_pods",
            "Pods waiting, by sub-queue.",
            ["queue"],
            registry=self.registry,
        )
        self._leader = Gauge(
            "lj_scheduler_leader", "1 while this replica holds the Lease.", registry=self.registry
        )
        self._preemptions = Counter(
            "lj_scheduler_preemption_attempts_total",
            "Preemptions carried out (a pod or gang nominated, its victims evicted), as "
            "kube-scheduler's scheduler_preemption_attempts_total.",
            registry=self.registry,
        )
        self._victims = Histogram(
            "lj_scheduler_preemption_victims",
            "Pods evicted per preemption (kube-scheduler's scheduler_preemption_victims).",
            buckets=(1, 2, 4, 8, 16, 32, 64),
            registry=self.registry,
        )
        self._overdue = Gauge(
            "lj_scheduler_gangs_overdue",
            "Gangs still incomplete past gang_timeout (each got one GangIncomplete warning).",
            registry=self.registry,
        )

    def attempt(self, result: str) -> None:
        self._attempts.labels(result).inc()

    def e2e(self, seconds: float) -> None:
        self._e2e.observe(seconds)

    def plugin(self, point: str, name: str, seconds: float) -> None:
        self._plugin.labels(point, name).observe(seconds)

    def queue_depth(self, depth: dict[str, int]) -> None:
        for q, n in depth.items():
            self._depth.labels(q).set(n)

    def leader(self, held: bool) -> None:
        self._leader.set(1 if held else 0)

    def gangs_overdue(self, count: int) -> None:
        self._overdue.set(count)

    def preempted(self, victims: int) -> None:
        self._preemptions.inc()
        self._victims.observe(victims)
