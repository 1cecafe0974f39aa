"""The phases of the classic case: each a label, its timed pods, and per scheduler name the
:class:`Plan` that makes them (and what the phase needs around them)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from lj_runtimekit_testkit.bench import volumes
from lj_runtimekit_testkit.bench.kwok import Creator, Report, Step, create_pod
from lj_runtimekit_testkit.bench.preemption import HIGH, LOW, Fill

from .pool import Shape, classic, pod_body

POOL = "bench"
GROUP = "lj-runtimekit-scheduler/pod-group"
GROUP_SIZE = "lj-runtimekit-scheduler/pod-group-size"


RACK = "network.topology/rack"
HOSTNAME = "kubernetes.io/hostname"
GROUPS = 10
"""Replica sets of the constrained phase: pods of one group keep apart (or spread) together."""


def constrained_body(name: str, scheduler: str, pool: str, i: int) -> dict[str, Any]:
    """One GPU; the ``i``-th pod: a third with required anti-affinity (one per node among its
    group), a third spread over racks (maxSkew 1, DoNotSchedule, its group), a sixth with the
    claim ``c-<i>`` bound to a rack's PV, a sixth with the WaitForFirstConsumer claim ``c-<i>``
    (:func:`claims_setup` makes both)."""
    body = pod_body(name, scheduler, pool, ({"aliyun.com/gpu": "1"}, {}))
    if i % 6 in (2, 5):
        volumes.use_claim(body, f"c-{i}")
    group = f"g{i % GROUPS}"
    if i % 3 == 0:
        body["metadata"]["labels"] = {"anti": group}
        term = {"labelSelector": {"matchLabels": {"anti": group}}, "topologyKey": HOSTNAME}
        body["spec"]["affinity"] = {
            "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}
        }
    elif i % 3 == 1:
        body["metadata"]["labels"] = {"spread": group}
        body["spec"]["topologySpreadConstraints"] = [
            {
                "maxSkew": 1,
                "topologyKey": RACK,
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"spread": group}},
            }
        ]
    return body


def constrained(scheduler: str, pool: str) -> Creator:
    def create(api: client.ApiClient, ns: str, i: int) -> float:
        return create_pod(api, ns, constrained_body(f"p-{i}", scheduler, pool, i))

    return create


def claims_setup(n: int, nodes: list[str], racks: list[str]) -> Step:
    """The claims of :func:`constrained_body`'s ``n`` pods: pod ``6k+2``'s bound to a PV of rack
    ``k`` (modulo), pod ``6k+5``'s unbound, with a free local PV on node ``k`` (modulo)."""

    def setup(api: client.ApiClient, ns: str) -> None:
        volumes.make_bound(
            api, ns, [(f"c-{i}", racks[(i // 6) % len(racks)]) for i in range(2, n, 6)]
        )
        volumes.make_local(
            api, ns, [(f"c-{i}", nodes[(i // 6) % len(nodes)]) for i in range(5, n, 6)]
        )

    return setup


@dataclass(frozen=True)
class Plan:
    """One phase under one scheduler: how its pods are made, and what it does around them."""

    create: Creator
    setup: Step | None = None
    cleanup: Step | None = None
    report: Report | None = None


Phase = tuple[str, int, Callable[[str], Plan]]
"""(label, timed pods, the plan for a scheduler name)."""


def preemption(scheduler: str, nodes: int, filler_gpus: int) -> Plan:
    """The pool's every GPU held by ``bench-low`` pods of ``filler_gpus`` GPUs (placed by
    ``scheduler``), then ``bench-high`` pods of one GPU each."""

    def filler(name: str) -> dict[str, Any]:
        body = pod_body(name, scheduler, POOL, ({"aliyun.com/gpu": str(filler_gpus)}, {}))
        body["spec"]["priorityClassName"] = LOW
        return body

    def create(api: client.ApiClient, ns: str, i: int) -> float:
        body = pod_body(f"p-{i}", scheduler, POOL, ({"aliyun.com/gpu": "1"}, {}))
        body["spec"]["priorityClassName"] = HIGH
        return create_pod(api, ns, body)

    fill = Fill(nodes * 8 // filler_gpus, filler, filler_gpus)
    return Plan(create, setup=fill.setup, report=fill.report)


def shapes(args: argparse.Namespace) -> dict[str, list[Shape]]:
    gang = {"aliyun.com/gpu": "8"}
    return {
        "single-GPU": [({"aliyun.com/gpu": "1"}, {})] * args.pods,
        "mixed": [
            ({"aliyun.com/gpu": "2"}, {})
            if i % 2
            else ({"aliyun.com/gpu-core": "25", "aliyun.com/gpu-memory": "10"}, {})
            for i in range(args.mixed)
        ],
        f"gang ({args.gangs}x{args.gang_size}, 8 GPUs each)": [
            (gang, {GROUP: f"gang-{g}", GROUP_SIZE: str(args.gang_size)})
            for g in range(args.gangs)
            for _ in range(args.gang_size)
        ],
    }


def classic_plan(pods: list[Shape]) -> Callable[[str], Plan]:
    return lambda scheduler: Plan(classic(scheduler, POOL, pods))


def phases(args: argparse.Namespace, nodes: list[str], racks: list[str]) -> list[Phase]:
    """Every phase of the classic case, in order (preemption, which fills the pool, last)."""
    out: list[Phase] = [
        (label, len(pods), classic_plan(pods)) for label, pods in shapes(args).items()
    ]
    if args.constrained:
        n = args.constrained
        setup = claims_setup(n, nodes, racks)
        label = "constrained (1/3 anti-affinity, 1/3 rack spread, 1/3 claims, 1 GPU each)"
        out.append(
            (
                label,
                n,
                lambda s: Plan(constrained(s, POOL), setup=setup, cleanup=volumes.delete_volumes),
            )
        )
    if args.preemptors:
        label = f"preemption (1 GPU, pool full of {args.filler_gpus}-GPU low-priority pods)"
        out.append((label, args.preemptors, lambda s: preemption(s, len(nodes), args.filler_gpus)))
    return out
