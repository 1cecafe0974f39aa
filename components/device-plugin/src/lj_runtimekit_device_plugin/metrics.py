"""The plugin's own metrics, in a registry per process (tests get a fresh one)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector


class PluginMetrics:
    """Registrations, calls, errors, latencies and device health of this plugin."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._registration_state: Callable[[], Mapping[str, bool]] = dict
        self.registry.register(_RegisteredCollector(self._registrations_now))
        self.registrations = Counter(
            "lj_device_plugin_registrations",
            "Registrations with the kubelet, per resource.",
            ["resource"],
            registry=self.registry,
        )
        self.calls = Counter(
            "lj_device_plugin_calls",
            "Kubelet calls served, per resource, method and outcome.",
            ["resource", "method", "outcome"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "lj_device_plugin_call_seconds",
            "Time to answer a kubelet call.",
            ["resource", "method"],
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1, 5, 10),
            registry=self.registry,
        )
        self.devices = Gauge(
            "lj_device_plugin_devices",
            "Devices the Runtime reports, by health.",
            ["healthy"],
            registry=self.registry,
        )
        self.runtime_up = Gauge(
            "lj_device_plugin_runtime_connected",
            "1 when the last Runtime check succeeded.",
            registry=self.registry,
        )

        self.released = Counter(
            "lj_device_plugin_allocations_released",
            "Runtime allocations released because no live container held them, per resource and "
            "by whom (reconcile: a pass found them unheld twice; allocate: the kubelet handed "
            "their devices out again).",
            ["resource", "by"],
            registry=self.registry,
        )
        self.passes = Counter(
            "lj_device_plugin_reconcile_passes",
            "Reconcile passes, by outcome (ok, or skipped because a peer did not answer).",
            ["outcome"],
            registry=self.registry,
        )
        self.reconcile_seconds = Histogram(
            "lj_device_plugin_reconcile_seconds",
            "Time of one reconcile pass (Runtime, pod-resources and pod list calls included).",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5),
            registry=self.registry,
        )
        self.unheld = Gauge(
            "lj_device_plugin_allocations_unheld",
            "Allocations the last pass found unheld and keeps until a later pass confirms.",
            registry=self.registry,
        )
        self.annotation_rejected = Counter(
            "lj_device_plugin_injection_annotations_rejected",
            "Injection annotation keys the Runtime returned that containerd's "
            "container_annotations patterns would not pass to the lj-runtime handler.",
            ["resource"],
            registry=self.registry,
        )
        self.runtime_garbage = Counter(
            "lj_device_plugin_runtime_invalid_replies",
            "Runtime replies that were not the message the interface promises (not protobuf, "
            "strings that are not UTF-8), per Runtime method.",
            ["method"],
            registry=self.registry,
        )
        self.runtime_values_dropped = Counter(
            "lj_device_plugin_runtime_values_dropped",
            "Values the Runtime reported outside their domain (negative or absurd memory, "
            "partitions above their device, percents above 100, repeated ids, NaN bandwidth), "
            "per field; each is left out (its device, the value, or shares on it), never "
            "clamped. Counted at every reply that has it.",
            ["field"],
            registry=self.registry,
        )
        self.registration_failures = Counter(
            "lj_device_plugin_registration_failures",
            "Registrations the kubelet refused or did not answer, per resource (retried).",
            ["resource"],
            registry=self.registry,
        )
        self.events = Counter(
            "lj_device_plugin_pod_events",
            "Events posted on pods, by reason.",
            ["reason"],
            registry=self.registry,
        )
        self.events_dropped = Counter(
            "lj_device_plugin_pod_events_rate_limited",
            "Events on pods left out by the plugin's overall event rate limit, by reason (the "
            "refusal is still logged and returned to the kubelet).",
            ["reason"],
            registry=self.registry,
        )

    def reconciled(self, ok: bool, seconds: float) -> None:
        self.passes.labels("ok" if ok else "skipped").inc()
        if ok:
            self.reconcile_seconds.observe(seconds)

    def observe(self, resource: str, method: str, seconds: float, ok: bool) -> None:
        self.calls.labels(resource, method, "ok" if ok else "error").inc()
        self.latency.labels(resource, method).observe(seconds)

    def registered(self, resource: str) -> None:
        self.registrations.labels(resource).inc()

    def _registrations_now(self) -> Mapping[str, bool]:
        return self._registration_state()

    def follow_registrations(self, state: Callable[[], Mapping[str, bool]]) -> None:
        """Serve ``lj_device_plugin_registered{resource}``: 1 while the kubelet holds the
        resource's registration, 0 while it is served but refused (or the kubelet restarted and
        it is not back yet). The counter of registrations cannot say this: a plugin that once
        registered and lost it after a kubelet restart looks the same."""
        self._registration_state = state


class _RegisteredCollector(Collector):
    """Reads the plugin host's registration state at each scrape (no copy to keep in step)."""

    def __init__(self, state: Callable[[], Mapping[str, bool]]) -> None:
        self._state = state

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "lj_device_plugin_registered",
            "1 while the kubelet holds this resource's registration, 0 while it does not.",
            labels=["resource"],
        )
        for resource, registered in sorted(self._state().items()):
            family.add_metric([resource], 1.0 if registered else 0.0)
        yield family
