"""What a user sees on the real apiserver when the scheduler refuses, disagrees or distrusts
(issue 34): the Warning Events of ``kubectl get events``, and that nothing is decided twice.

- gang members that disagree on the size: each is told, the largest size applies (item 9);
- an edited ``gpu-assignment`` of a bound pod frees nothing and is told (item 10), also when the
  edit was made while no scheduler ran: a new scheduler believes a decision only as the Binding
  left it, which ``metadata.managedFields`` shows (the Binding writes no field manager);
- a Binding the apiserver refuses is told as kube-scheduler tells it, once, its count growing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from lj_runtimekit_scheduler import objects

pytestmark = pytest.mark.cluster

ASSIGNMENT = "lj-runtimekit-scheduler/gpu-assignment"
SHARE = {"aliyun.com/gpu-core": "60", "aliyun.com/gpu-memory": "8"}


def warnings(g: Any, name: str, reason: str) -> list[tuple[str, int]]:
    """(message, count) of the pod's Warning Events of ``reason``, as ``kubectl get events``
    lists them (core/v1 over the scheduler's events.k8s.io Events)."""
    found = g.core.list_namespaced_event(g.namespace, field_selector=f"involvedObject.name={name}")
    return [
        (e.message or "", e.series.count if e.series else (e.count or 1))
        for e in found.items
        if e.type == "Warning" and e.reason == reason
    ]


def group(size: int) -> dict[str, str]:
    return {
        "lj-runtimekit-scheduler/pod-group": "g",
        "lj-runtimekit-scheduler/pod-group-size": str(size),
    }


async def test_gang_members_that_disagree_on_the_size_are_told_and_placed_at_the_largest(
    gpu_cluster: Any, scheduler: Callable[..., Any]
) -> None:
    # issue 34, finding 9: sizes 2 and 4 made two gangs that waited for ever
    gpu_cluster.gpu_nodes(1, gpus=8)
    scheduler()
    sizes = {"g0": 2, "g1": 4, "g2": 4, "g3": 4}
    for name, size in sizes.items():
        gpu_cluster.pod(name, {"aliyun.com/gpu": "1"}, annotations=group(size))
    await gpu_cluster.wait_bound(list(sizes))

    def told() -> dict[str, list[tuple[str, int]]] | None:
        got = {n: warnings(gpu_cluster, n, "GangSizeConflict") for n in sizes}
        return got if all(got.values()) else None

    for name, events in (await gpu_cluster.until("each member told", told)).items():
        ((message, _),) = events
        # the sizes known when the member was told: g0 and g1 always (they came first)
        assert "members disagree on its size (2: g0; 4: g1" in message, name
        assert "the largest size any member gives applies" in message, name
        assert "until that many are here (4)" in message, name


async def test_a_gang_short_of_its_largest_size_waits_whole_and_says_why(
    gpu_cluster: Any, scheduler: Callable[..., Any]
) -> None:
    gpu_cluster.gpu_nodes(1, gpus=8)
    scheduler()
    # the size-4 member first: the two of size 2 are never a complete gang of their own
    names = [
        gpu_cluster.pod(n, {"aliyun.com/gpu": "1"}, annotations=group(s))
        for n, s in (("g2", 4), ("g0", 2), ("g1", 2))
    ]

    def told() -> bool:
        return all(warnings(gpu_cluster, n, "GangSizeConflict") for n in names)

    await gpu_cluster.until("each member told of the sizes", told)
    await gpu_cluster.wait_refused(names, "waiting for 1 more of 4 members; nothing held")
    assert not any(gpu_cluster.nodes_of(names).values()), "not the two that asked for 2"


def edit_share(g: Any, name: str, **changes: Any) -> None:
    """``kubectl annotate --overwrite`` of the pod's assignment, each change applied to its
    one share (the field manager is kubectl's)."""
    doc = g.assignment(name)
    doc["containers"][0]["devices"][0].update(changes)
    body = {"metadata": {"annotations": {ASSIGNMENT: json.dumps(doc)}}}
    g.core.patch_namespaced_pod(name, g.namespace, body, field_manager="kubectl-annotate")


def gpu_of(g: Any, name: str) -> str:
    return str(g.assignment(name)["containers"][0]["devices"][0]["id"])


def writers(g: Any, name: str) -> frozenset[str]:
    """Who set the pod's assignment, by its managedFields, as the scheduler reads them."""
    raw = g.api.sanitize_for_serialization(g.core.read_namespaced_pod(name, g.namespace))
    return objects.pod(raw).writers(ASSIGNMENT)


async def test_an_edited_assignment_on_a_bound_pod_frees_nothing_and_gets_an_event(
    gpu_cluster: Any, scheduler: Callable[..., Any]
) -> None:
    # issue 34, finding 10: the edit freed p1's 60 % of its GPU and the next pod got it too
    gpu_cluster.gpu_nodes(1, gpus=2)
    scheduler()
    p1 = gpu_cluster.pod("p1", SHARE)
    await gpu_cluster.wait_bound([p1])
    decided = gpu_of(gpu_cluster, p1)
    other = "gpu-1" if decided == "gpu-0" else "gpu-0"
    edit_share(gpu_cluster, p1, id=other)
    (message, _), *_ = await gpu_cluster.until(
        "GpuAssignmentEdited on p1", lambda: warnings(gpu_cluster, p1, "GpuAssignmentEdited")
    )
    assert f"now: main: {other} (core 60, 8 GiB)" in message
    assert f"keeps counting what it decided (main: {decided} (core 60, 8 GiB))" in message
    p2 = gpu_cluster.pod("p2", SHARE)
    await gpu_cluster.wait_bound([p2])
    assert gpu_of(gpu_cluster, p2) != decided, "never 120 % of one GPU"


async def _stop(replica: asyncio.Task[None]) -> None:
    replica.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await replica


async def test_a_share_edited_while_no_scheduler_ran_is_not_believed_by_the_next(
    gpu_cluster: Any, scheduler: Callable[..., Any]
) -> None:
    # two GPUs, each 60 % held: one share edited to nothing while the scheduler is away; the
    # next scheduler must not give that room away (it read the edit back as the decision)
    gpu_cluster.gpu_nodes(1, gpus=2)
    first = scheduler()
    edited, kept = gpu_cluster.pod("edited", SHARE), gpu_cluster.pod("kept", SHARE)
    await gpu_cluster.wait_bound([edited, kept])
    assert {gpu_of(gpu_cluster, edited), gpu_of(gpu_cluster, kept)} == {"gpu-0", "gpu-1"}
    # the fact this rests on: the Binding set the annotation without a field manager
    assert writers(gpu_cluster, edited) == frozenset()
    await _stop(first)
    edit_share(gpu_cluster, edited, core=0, memoryGiB=0)
    assert writers(gpu_cluster, edited) == {"kubectl-annotate"}
    scheduler()
    (message, _), *_ = await gpu_cluster.until(
        "GpuAssignmentEdited on the edited pod",
        lambda: warnings(gpu_cluster, edited, "GpuAssignmentEdited"),
    )
    assert "changed by kubectl-annotate" in message
    assert "(core 60, 8 GiB)" in message, "its request is what is counted"
    late = gpu_cluster.pod("late", SHARE)
    await gpu_cluster.wait_refused([late], "no GPU has 60 core and 8 GiB free")
    assert gpu_cluster.node_of(late) is None, "no GPU has 60 % left"
    assert warnings(gpu_cluster, kept, "GpuAssignmentEdited") == [], "an untouched decision"


@contextlib.contextmanager
def bindings_refused(g: Any, prefix: str, node: str) -> Iterator[str]:
    """A ValidatingAdmissionPolicy that refuses the Binding of the test namespace's pods named
    ``prefix``*, effective when this yields (its message); removed after."""
    adm: Any = client.AdmissionregistrationV1Api(g.api)
    name = f"lj-test-refuse-binding-{g.tag}"
    message = "binding refused by the test's policy"
    adm.create_validating_admission_policy(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["pods/binding"],
                        }
                    ]
                },
                "validations": [
                    {
                        "expression": f"!object.metadata.name.startsWith('{prefix}')",
                        "message": message,
                    }
                ],
            },
        }
    )
    try:
        adm.create_validating_admission_policy_binding(
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingAdmissionPolicyBinding",
                "metadata": {"name": name},
                "spec": {
                    "policyName": name,
                    "validationActions": ["Deny"],
                    "matchResources": {
                        "namespaceSelector": {
                            "matchLabels": {"kubernetes.io/metadata.name": g.namespace}
                        }
                    },
                },
            }
        )
        try:
            _wait_effective(g, f"{prefix}probe", node)
            yield message
        finally:
            adm.delete_validating_admission_policy_binding(name)
    finally:
        adm.delete_validating_admission_policy(name)


def _wait_effective(g: Any, probe: str, node: str) -> None:
    """Until a dry-run Binding of a pod nobody schedules is refused (the apiserver loads new
    policies from its watch, a moment after they are created)."""
    g.pod(probe, None, scheduler="nobody")
    body = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": probe},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }

    def refused() -> bool:
        try:
            g.core.create_namespaced_pod_binding(
                probe, g.namespace, body, dry_run="All", _preload_content=False
            )
        except ApiException as e:
            return bool(e.status == 422)
        return False

    try:
        deadline = time.monotonic() + 30
        while not refused():
            assert time.monotonic() < deadline, "the binding policy not in force within 30 s"
            time.sleep(0.2)
    finally:
        g.core.delete_namespaced_pod(probe, g.namespace, grace_period_seconds=0)


async def test_a_binding_the_apiserver_refuses_is_told_once_and_counted(
    gpu_cluster: Any, scheduler: Callable[..., Any]
) -> None:
    (node,) = gpu_cluster.gpu_nodes(1)
    with bindings_refused(gpu_cluster, "refused-", node) as policy_message:
        scheduler(
            pod_initial_backoff=0.1,
            pod_max_backoff=0.2,
            event_series_interval=0.3,
        )
        pod = gpu_cluster.pod("refused-1", {"aliyun.com/gpu": "1"})

        def retried() -> list[tuple[str, int]] | None:
            found = warnings(gpu_cluster, pod, "FailedScheduling")
            return found if found and found[0][1] >= 3 else None

        events = await gpu_cluster.until("a refused binding retried 3 times", retried)
        ((message, _),) = events  # one Event, however many retries: its count grows
        assert message.startswith("binding to "), message
        assert 'running Bind plugin "DefaultBinder": bind pod' in message
        assert f"denied request: {policy_message}" in message
        assert gpu_cluster.node_of(pod) is None
    # the policy gone, the next retry binds it
    await gpu_cluster.wait_bound([pod])
