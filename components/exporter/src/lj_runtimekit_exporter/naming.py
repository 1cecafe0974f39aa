"""Metric names, types, units and labels: the exporter's public contract, pure data.

Every name carries the suite prefix and a base unit (``_bytes``, ``_ratio``, ``_celsius``,
``_watts``, ``_hertz``, ``_joules``, ``_seconds``); counters end in ``_total``. The README's
table lists exactly these (a test checks it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final, Literal

PREFIX: Final = "lj_runtimekit_"
MAX_LABEL_LENGTH: Final = 128

DEVICE_LABELS: Final = ("node", "device", "uuid", "index", "kind", "model")
"""``device`` is the Runtime's stable id (``gpu-3``), the id NodeDevices and the scheduler use."""
CONTAINER_LABELS: Final = (
    "node",
    "device",
    "uuid",
    "index",
    "partition",
    "namespace",
    "pod",
    "container",
)
"""``partition`` is the MIG/TDM partition the container holds, empty for a device or a share."""

Kind = Literal["gauge", "counter"]


@dataclass(frozen=True)
class Metric:
    """One metric family as exposed (``name`` without the ``_total`` of counters)."""

    name: str
    kind: Kind
    unit: str
    labels: tuple[str, ...]
    help: str
    signed: bool = False
    """Negative values are meaningful (temperatures); otherwise a negative reading is dropped."""
    maximum: float | None = None
    """The largest value that can be true (1 for a ratio); a reading above it is dropped."""

    @property
    def exposed(self) -> str:
        """The sample name as Prometheus stores it."""
        return self.name + "_total" if self.kind == "counter" else self.name


def _maximum(unit: str) -> float | None:
    return 1.0 if unit in ("ratio", "bool") else None


def _d(name: str, kind: Kind, unit: str, help_: str, extra: tuple[str, ...] = ()) -> Metric:
    labels = DEVICE_LABELS + extra
    return Metric(PREFIX + name, kind, unit, labels, help_, unit == "celsius", _maximum(unit))


def _c(name: str, unit: str, help_: str) -> Metric:
    return Metric(PREFIX + name, "gauge", unit, CONTAINER_LABELS, help_, maximum=_maximum(unit))


# Device metrics, keyed by the DeviceSample field they come from.
DEVICE_FIELDS: Final[dict[str, Metric]] = {
    "utilization_ratio": _d(
        "device_utilization_ratio", "gauge", "ratio", "Compute utilization, 0..1."
    ),
    "memory_utilization_ratio": _d(
        "device_memory_utilization_ratio", "gauge", "ratio", "Memory-controller utilization."
    ),
    "memory_used_bytes": _d("device_memory_used_bytes", "gauge", "bytes", "Device memory used."),
    "memory_total_bytes": _d(
        "device_memory_total_bytes", "gauge", "bytes", "Device memory in total."
    ),
    "temperature_celsius": _d(
        "device_temperature_celsius", "gauge", "celsius", "Device temperature."
    ),
    "memory_temperature_celsius": _d(
        "device_memory_temperature_celsius", "gauge", "celsius", "Memory temperature."
    ),
    "power_watts": _d("device_power_watts", "gauge", "watts", "Power draw."),
    "power_limit_watts": _d("device_power_limit_watts", "gauge", "watts", "Power limit."),
    "energy_joules_total": _d(
        "device_energy_joules", "counter", "joules", "Energy used since the Runtime started."
    ),
    "sm_clock_hertz": _d("device_sm_clock_hertz", "gauge", "hertz", "SM (compute) clock."),
    "memory_clock_hertz": _d("device_memory_clock_hertz", "gauge", "hertz", "Memory clock."),
    "ecc_single_bit_total": _d(
        "device_ecc_single_bit_errors", "counter", "errors", "Corrected (single-bit) ECC errors."
    ),
    "ecc_double_bit_total": _d(
        "device_ecc_double_bit_errors", "counter", "errors", "Uncorrected (double-bit) ECC errors."
    ),
    "retired_pages_total": _d(
        "device_retired_pages", "counter", "pages", "Memory pages retired for errors."
    ),
    "xid_total": _d("device_xid_errors", "counter", "errors", "Vendor error events (XID)."),
    "link_errors_total": _d(
        "device_link_errors", "counter", "errors", "Interconnect CRC/replay errors."
    ),
    "last_xid": _d("device_last_xid", "gauge", "code", "Last vendor error code seen, 0 if none."),
    "pcie_tx_bytes_total": _d("device_pcie_transmit_bytes", "counter", "bytes", "PCIe bytes sent."),
    "pcie_rx_bytes_total": _d(
        "device_pcie_receive_bytes", "counter", "bytes", "PCIe bytes received."
    ),
}

DEVICE_MEMORY_FREE: Final = _d("device_memory_free_bytes", "gauge", "bytes", "Device memory free.")
DEVICE_HEALTHY: Final = _d("device_healthy", "gauge", "bool", "1 when the Runtime reports healthy.")
DEVICE_INFO: Final = _d(
    "device_info",
    "gauge",
    "info",
    "Always 1; the device's vendor and partition mode.",
    ("vendor", "partition_mode"),
)
LINK_TX: Final = _d(
    "device_link_transmit_bytes", "counter", "bytes", "Bytes sent over a link.", ("peer",)
)
LINK_RX: Final = _d(
    "device_link_receive_bytes", "counter", "bytes", "Bytes received over a link.", ("peer",)
)
PARTITION_UTIL: Final = _d(
    "partition_utilization_ratio",
    "gauge",
    "ratio",
    "MIG/TDM partition compute utilization.",
    ("partition", "profile"),
)
PARTITION_MEM_USED: Final = _d(
    "partition_memory_used_bytes",
    "gauge",
    "bytes",
    "Partition memory used.",
    ("partition", "profile"),
)
PARTITION_MEM_TOTAL: Final = _d(
    "partition_memory_total_bytes",
    "gauge",
    "bytes",
    "Partition memory in total.",
    ("partition", "profile"),
)

CONTAINER_UTIL: Final = _c(
    "container_utilization_ratio",
    "ratio",
    "The container's own compute use, 0..1 of the whole device (measured, or the device's when "
    "the container holds it alone).",
)
CONTAINER_MEM_USED: Final = _c(
    "container_memory_used_bytes", "bytes", "The container's own device memory use."
)
CONTAINER_CORE: Final = _c(
    "container_allocated_core_ratio", "ratio", "Share of the device's compute granted, 0..1."
)
CONTAINER_MEM_ALLOC: Final = _c(
    "container_allocated_memory_bytes", "bytes", "Device memory granted (shared use only)."
)

RUNTIME_UP: Final = Metric(
    PREFIX + "runtime_up", "gauge", "bool", ("node",), "1 when the last poll reached the Runtime."
)
RUNTIME_INFO: Final = Metric(
    PREFIX + "runtime_info",
    "gauge",
    "info",
    ("node", "version", "api_version"),
    "Always 1; the Runtime's version and interface version.",
)
RUNTIME_DEGRADED: Final = Metric(
    PREFIX + "runtime_method_missing",
    "gauge",
    "bool",
    ("node", "method"),
    "1 for each Runtime method this (older) Runtime lacks; that part of the metrics is absent.",
)
PODS_UP: Final = Metric(
    PREFIX + "exporter_pods_source_up",
    "gauge",
    "bool",
    ("node", "source"),
    "1 when the last poll read the pod list (kubelet /pods or apiserver).",
)
SNAPSHOT_AGE: Final = Metric(
    PREFIX + "exporter_snapshot_age_seconds",
    "gauge",
    "seconds",
    ("node",),
    "Age of the snapshot this scrape is served from.",
)
SNAPSHOT_TS: Final = Metric(
    PREFIX + "exporter_snapshot_timestamp_seconds",
    "gauge",
    "seconds",
    ("node",),
    "When the snapshot was taken, seconds since the epoch.",
)
COLLECTION_SECONDS: Final = Metric(
    PREFIX + "exporter_collection_duration_seconds",
    "gauge",
    "seconds",
    ("node",),
    "Duration of the last background poll.",
)
COLLECTIONS: Final = Metric(
    PREFIX + "exporter_collections", "counter", "polls", ("node",), "Background polls done."
)
COLLECTION_ERRORS: Final = Metric(
    PREFIX + "exporter_collection_errors",
    "counter",
    "errors",
    ("node", "source"),
    "Failed reads in background polls, by source (runtime, pods).",
)
SCRAPE_SECONDS: Final = Metric(
    PREFIX + "exporter_scrape_duration_seconds",
    "gauge",
    "seconds",
    ("node",),
    "Duration of the previous /metrics scrape (rendering only; no I/O happens in a scrape).",
)
SCRAPES: Final = Metric(PREFIX + "exporter_scrapes", "counter", "scrapes", ("node",), "Scrapes.")
SAMPLES_DROPPED: Final = Metric(
    PREFIX + "exporter_samples_dropped",
    "gauge",
    "samples",
    ("node", "metric"),
    "Readings of the served snapshot left out of a metric because they cannot be true (NaN, "
    "Inf, negative, a ratio above 1, memory above the device's total).",
)

ALL: Final[tuple[Metric, ...]] = (
    *DEVICE_FIELDS.values(),
    DEVICE_MEMORY_FREE, DEVICE_HEALTHY, DEVICE_INFO, LINK_TX, LINK_RX,
    PARTITION_UTIL, PARTITION_MEM_USED, PARTITION_MEM_TOTAL,
    CONTAINER_UTIL, CONTAINER_MEM_USED, CONTAINER_CORE, CONTAINER_MEM_ALLOC,
    RUNTIME_UP, RUNTIME_INFO, RUNTIME_DEGRADED, PODS_UP,
    SNAPSHOT_AGE, SNAPSHOT_TS, COLLECTION_SECONDS, COLLECTIONS, COLLECTION_ERRORS,
    SCRAPE_SECONDS, SCRAPES, SAMPLES_DROPPED,
)  # fmt: skip


def label_value(raw: object) -> str:
    """A bounded, printable label value: control characters dropped, at most 128 characters."""
    text = str(raw)
    if not text.isprintable():
        text = "".join(ch for ch in text if ch.isprintable())
    return text[:MAX_LABEL_LENGTH]


def sample_value(metric: Metric, raw: float, limit: float | None = None) -> float | None:
    """The value to expose, or None for a reading that cannot be true: NaN, ±inf, negative
    (unless ``metric.signed``), above ``metric.maximum`` or above ``limit`` (the bound this one
    reading has, e.g. the device's memory for memory used)."""
    try:
        value = float(raw)
    except (TypeError, ValueError, OverflowError):
        return None
    if not math.isfinite(value):
        return None
    if value < 0 and not metric.signed:
        return None
    for bound in (metric.maximum, limit):
        if bound is not None and value > bound:
            return None
    return value
