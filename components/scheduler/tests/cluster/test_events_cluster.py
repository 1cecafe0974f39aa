"""FailedScheduling Events on the real apiserver (issue 20): six pods that never fit, retried
again and again, leave one Event each whose series count grows (kube-scheduler's recorder
aggregates; ours wrote one Event per attempt: 39 Events for 6 pods in 5 minutes)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

pytestmark = pytest.mark.cluster


async def test_six_pending_pods_leave_six_events_whose_counts_grow(
    gpu_cluster: Any, scheduler: Callable[..., Any]
) -> None:
    gpu_cluster.gpu_nodes(1, gpus=8)
    scheduler(
        pod_initial_backoff=0.1,
        pod_max_backoff=0.2,
        unschedulable_retry=0.2,
        event_series_interval=0.3,
    )
    names = [gpu_cluster.pod(f"huge-{i}", {"aliyun.com/gpu": "16"}) for i in range(6)]
    events: Any = client.EventsV1Api(gpu_cluster.api)

    def ours() -> list[Any]:
        found = events.list_namespaced_event(gpu_cluster.namespace).items
        return [e for e in found if e.regarding.name in names and e.reason == "FailedScheduling"]

    def counted() -> list[Any] | None:
        found = ours()
        grown = [e for e in found if e.series is not None and e.series.count >= 5]
        return found if len(grown) == 6 else None

    found = await gpu_cluster.until("every pod's Event counted 5 attempts", counted, 60)
    assert sorted(e.regarding.name for e in found) == sorted(names), "one Event per pod"
    assert all("Insufficient" in e.note or "gpu" in e.note for e in found)
