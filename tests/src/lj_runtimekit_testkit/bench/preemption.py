"""A full cluster to preempt, for the scheduler benchmarks on KWOK nodes.

Before the timed pods, the phase's setup fills every GPU of a pool with low-priority pods of
``filler_gpus`` GPUs each (:data:`LOW`), placed by the scheduler under test itself (so its own
decisions say which GPUs they hold), and waits until all are bound. The timed pods are
high-priority whole-GPU pods (:data:`HIGH`): each fits only where pods are evicted.

:func:`victims` then counts what was evicted and whether it was needed: on a node that was full,
``q`` preemptors of ``g`` GPUs each need ``ceil(q * g / filler_gpus)`` fillers gone; every victim
beyond that (or on a node no preemptor took) is counted as ``excess``.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from .kwok import BoundWatch, create_pod

LOW, HIGH = "bench-low", "bench-high"
PRIORITIES = {LOW: 1000, HIGH: 100000}
FILLER = "f-"
"""Names of the filler pods (the timed pods are ``p-<i>``)."""


def install_priorities(api: client.ApiClient) -> None:
    scheduling: Any = client.SchedulingV1Api(api)
    for name, value in PRIORITIES.items():
        body = {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name},
            "value": value,
        }
        try:
            scheduling.create_priority_class(body)
        except ApiException as e:
            if e.status != 409:
                raise


def with_priority(pod: dict[str, Any], priority_class: str) -> dict[str, Any]:
    pod["spec"]["priorityClassName"] = priority_class
    return pod


class Fill:
    """A full pool for one phase: :meth:`setup` creates ``count`` fillers ``body(f"f-<i>")``, each
    of ``filler_gpus`` GPUs, waits until all are bound and notes where; :meth:`report` counts
    the victims among them once the preemptors (``preemptor_gpus`` GPUs each) are bound."""

    def __init__(
        self,
        count: int,
        body: Callable[[str], dict[str, Any]],
        filler_gpus: int,
        preemptor_gpus: int = 1,
        deadline_s: float = 900,
    ) -> None:
        self.count, self.body, self.deadline_s = count, body, deadline_s
        self.filler_gpus, self.preemptor_gpus = filler_gpus, preemptor_gpus
        self.placed: dict[str, str] = {}

    def setup(self, api: client.ApiClient, ns: str) -> None:
        with ThreadPoolExecutor(16) as ex:
            list(
                ex.map(lambda i: create_pod(api, ns, self.body(f"{FILLER}{i}")), range(self.count))
            )
        core: Any = client.CoreV1Api(api)
        end = time.monotonic() + self.deadline_s
        while core.list_namespaced_pod(ns, field_selector="spec.nodeName=", limit=1).items:
            if time.monotonic() > end:
                raise TimeoutError(
                    f"{self.count} fillers not all bound within {self.deadline_s:g} s"
                )
            time.sleep(1)
        self.placed = {
            p.metadata.name: p.spec.node_name for p in core.list_namespaced_pod(ns).items
        }

    def needed(self, preemptors: int) -> int:
        return math.ceil(preemptors * self.preemptor_gpus / self.filler_gpus)

    def report(self, api: client.ApiClient, ns: str, watch: BoundWatch) -> dict[str, float]:
        """victims (fillers gone or terminating), victims_needed (on the nodes the preemptors
        took, full before), victims_excess (beyond that, anywhere), victim_nodes_untaken (nodes
        that lost fillers and got no preemptor)."""
        core: Any = client.CoreV1Api(api)
        live = {
            p.metadata.name
            for p in core.list_namespaced_pod(ns).items
            if p.metadata.deletion_timestamp is None
        }
        evicted = Counter(node for name, node in self.placed.items() if name not in live)
        took = Counter(node for name, node in watch.nodes.items() if not name.startswith(FILLER))
        return {
            "victims": float(sum(evicted.values())),
            "victims_needed": float(sum(self.needed(q) for q in took.values())),
            "victims_excess": float(
                sum(max(0, v - self.needed(took[node])) for node, v in evicted.items())
            ),
            "victim_nodes_untaken": float(sum(1 for node in evicted if node not in took)),
            "fillers": float(len(self.placed)),
        }
