"""Plausible, deterministic device metrics derived from what is allocated on the node.

An allocation drives its devices at ``LOAD`` of what it holds (its core share, or the whole
device); memory used is ``MEMORY_FILL`` of what it was granted. Counters only grow.
"""

from __future__ import annotations

import math
import re
import zlib

from lj_runtimekit_interface.runtime.v1 import monitor_pb2 as mpb
from lj_runtimekit_testkit.simulator.inventory import Device
from lj_runtimekit_testkit.simulator.ledger import Allocation

LOAD = 0.8
MEMORY_FILL = 0.6
IDLE_WATTS = 60.0
LIMIT_WATTS = 700.0
_XID = re.compile(r"XID\s*(\d+)", re.IGNORECASE)


def allocation_usage(
    alloc: Allocation, device: Device, unit_id: str, elapsed_s: float
) -> mpb.AllocationUsage:
    """What one allocation uses of one device now; never more than its share or its grant."""
    wobble = 0.9 + 0.1 * math.sin(elapsed_s / 7.0 + zlib.crc32(alloc.id.encode()) % 13)
    memory = _unit_memory(device, unit_id)
    if alloc.shared:
        granted = alloc.memory_bytes or memory
        # a memory-only share computes in proportion to the memory it holds
        share = alloc.core_percent / 100.0 if alloc.core_percent else granted / memory
    else:
        share = 1.0 if unit_id == device.id else _unit_share(device, unit_id)
        granted = memory
    return mpb.AllocationUsage(
        allocation_id=alloc.id,
        device_id=unit_id,
        utilization_ratio=min(share, share * LOAD * wobble),
        memory_used_bytes=int(granted * MEMORY_FILL),
    )


def device_metrics(
    device: Device, usages: list[mpb.AllocationUsage], elapsed_s: float
) -> mpb.DeviceMetrics:
    util = min(1.0, sum(u.utilization_ratio for u in usages))
    used = min(device.memory_bytes, sum(u.memory_used_bytes for u in usages))
    power = IDLE_WATTS + (LIMIT_WATTS - IDLE_WATTS) * util
    traffic = int(elapsed_s * (1e6 + util * 5e9))
    xid_match = _XID.search(device.health.reason)
    errors = mpb.ErrorCounters(
        xid_total=0 if device.health.healthy else 1,
        last_xid=int(xid_match[1]) if xid_match and not device.health.healthy else 0,
        ecc_double_bit_total=0 if device.health.healthy or xid_match else 1,
    )
    return mpb.DeviceMetrics(
        device_id=device.id,
        utilization_ratio=util,
        memory_utilization_ratio=util * 0.7,
        memory_used_bytes=used,
        memory_total_bytes=device.memory_bytes,
        temperature_celsius=32.0 + 45.0 * util,
        memory_temperature_celsius=36.0 + 40.0 * util,
        power_watts=power,
        power_limit_watts=LIMIT_WATTS,
        energy_joules_total=elapsed_s * (IDLE_WATTS + power) / 2.0,
        sm_clock_hertz=1.98e9 if util > 0 else 3.45e8,
        memory_clock_hertz=2.619e9,
        errors=errors,
        links=[
            mpb.LinkThroughput(peer_id=link.peer_id, tx_bytes_total=traffic, rx_bytes_total=traffic)
            for link in device.links
        ],
        pcie_tx_bytes_total=traffic // 4,
        pcie_rx_bytes_total=traffic // 3,
        partitions=[
            mpb.PartitionMetrics(
                partition_id=p.id,
                utilization_ratio=min(
                    1.0, sum(u.utilization_ratio for u in usages if u.device_id == p.id)
                ),
                memory_used_bytes=sum(u.memory_used_bytes for u in usages if u.device_id == p.id),
                memory_total_bytes=p.memory_bytes,
            )
            for p in device.partitions
        ],
    )


def _unit_memory(device: Device, unit_id: str) -> int:
    part = next((p for p in device.partitions if p.id == unit_id), None)
    return part.memory_bytes if part else device.memory_bytes


def _unit_share(device: Device, unit_id: str) -> float:
    """A partition's share of its device: time percent (TDM) or compute units (MIG)."""
    part = next(p for p in device.partitions if p.id == unit_id)
    if part.time_percent:
        return part.time_percent / 100.0
    return part.compute_units / device.compute_units
