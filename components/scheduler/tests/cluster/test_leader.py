"""Two replicas behind one Lease: only the leader binds; killing it mid-run loses no pod and
double-books no GPU."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import pytest

pytestmark = pytest.mark.cluster


def fast_lease(name: str) -> dict[str, Any]:
    return {
        "leader_elect_resource_name": name,
        "leader_elect_lease_duration": 3.0,
        "leader_elect_renew_deadline": 2.0,
        "leader_elect_retry_period": 0.5,
    }


async def test_killing_the_leader_loses_no_pod_and_double_books_no_gpu(
    gpu_cluster: Any, scheduler: Callable[..., Any]
) -> None:
    gpu_cluster.gpu_nodes(2)
    lease = f"lj-sched-test-{uuid.uuid4().hex[:6]}"
    first = scheduler(leader_elect=True, **fast_lease(lease))
    first_pods = [gpu_cluster.pod(f"a-{i}", {"aliyun.com/gpu": "1"}) for i in range(4)]
    await gpu_cluster.wait_bound(first_pods)
    second = scheduler(leader_elect=True, **fast_lease(lease))
    await asyncio.sleep(1)
    first.cancel()  # the leader dies without giving the Lease back
    rest = [gpu_cluster.pod(f"b-{i}", {"aliyun.com/gpu": "1"}) for i in range(8)]
    bound = await gpu_cluster.wait_bound(first_pods + rest, deadline_s=90)
    assert not second.done()
    used: set[tuple[str, str]] = set()
    for name, node in bound.items():
        (device,) = gpu_cluster.assignment(name)["containers"][0]["devices"]
        key = (node, device["id"])
        assert key not in used, f"{key} given twice"
        used.add(key)
