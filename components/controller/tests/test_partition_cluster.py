"""Partition layouts on the harness cluster: the controller reads the layouts ConfigMap and the
node's label, refuses what it can judge itself with an Event before any Job, and turns each
agent outcome (converged, waiting for GPUs in use, refused by the hardware) into the node's
``partition-status`` annotation and an Event. The agent's part is played by the stand-in kubelet
with the results the job agent writes; tests/partition_tests run the real agent."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from lj_runtimekit_controller import names
from lj_runtimekit_controller.partitioning import PartitionStatus, parse_status

from .conftest import Ending, agent_result

pytestmark = pytest.mark.cluster

LABEL = "lj_runtimekit_partition_layout"
CONFIGMAP = "lj-runtimekit-partition-layouts"
MIG = "- {devices: [0, 1], mig: [3g.40gb, 3g.40gb]}"


def layouts(probe: Any, data: dict[str, str] | None) -> None:
    """Create, replace or (None) delete the layouts ConfigMap of the test's namespace."""
    body = client.V1ConfigMap(metadata=client.V1ObjectMeta(name=CONFIGMAP), data=data)
    try:
        if data is None:
            probe.core.delete_namespaced_config_map(CONFIGMAP, probe.namespace)
        else:
            probe.core.replace_namespaced_config_map(CONFIGMAP, probe.namespace, body)
    except ApiException as e:
        if e.status != 404:
            raise
        if data is not None:
            probe.core.create_namespaced_config_map(probe.namespace, body)


def select(probe: Any, node: str, layout: str | None) -> None:
    probe.core.patch_node(node, {"metadata": {"labels": {LABEL: layout}}})


def pstatus(probe: Any, node: str) -> PartitionStatus | None:
    ann = probe.core.read_node(node).metadata.annotations or {}
    return parse_status(ann.get(names.PARTITION_STATUS_ANNOTATION))


def outcome(succeeded: bool, reason: str, message: str, code: int) -> Any:
    """A stand-in agent that answers a partition Job with this result (and the layout it got)."""
    seen: list[dict[str, Any]] = []

    def run(action: str, node: str) -> Ending:
        if action != "partition":
            return "Succeeded", 0, agent_result(action, node)
        text = agent_result(
            action, node, succeeded, reason=reason, message=message, runtime_changed=succeeded
        )
        seen.append({"node": node})
        return ("Succeeded" if code == 0 else "Failed"), code, text

    run.seen = seen  # type: ignore[attr-defined]
    return run


def the_layout_arg(probe: Any, node: str) -> dict[str, Any]:
    [job] = probe.jobs(node)
    args = job.spec.template.spec.containers[0].args
    assert args[0] == "partition"
    [arg] = [a for a in args if a.startswith("--layout=")]
    parsed: dict[str, Any] = json.loads(arg.removeprefix("--layout="))
    return parsed


async def test_a_layout_runs_an_agent_job_with_it_and_its_convergence_is_recorded(
    probe: Any, start_controller: Any, kubelet: Any
) -> None:
    [node] = await asyncio.to_thread(kubelet.nodes, 1, False)
    kubelet.behaviour[node] = outcome(True, "Converged", "gpu-0: whole → MIG 3g.40gb+3g.40gb", 0)
    await asyncio.to_thread(layouts, probe, {"mig-2": MIG})
    await asyncio.to_thread(select, probe, node, "mig-2")
    await start_controller()
    st = await probe.poll(
        lambda: (s := pstatus(probe, node)) and s.result == "succeeded" and s,
        what="layout converged",
    )
    assert (st.layout, st.reason, st.job) == (
        "mig-2",
        "Converged",
        names.job_name(node, "partition"),
    )
    # The controller writes the status, then the Event.
    [event] = await probe.poll(lambda: probe.events(node, "PartitionConverged"), what="Event")
    assert "layout mig-2" in event.message
    assert "gpu-0: whole → MIG 3g.40gb+3g.40gb" in event.message
    await probe.poll(lambda: not probe.jobs(node), what="the Job deleted after success")
    assert probe.status(node) is None, "no features action on a node without the enable label"


async def test_the_job_carries_the_layout_as_the_configmap_says(
    probe: Any, start_controller: Any, kubelet: Any
) -> None:
    [node] = await asyncio.to_thread(kubelet.nodes, 1, False)
    kubelet.behaviour[node] = lambda action, n: ("Running", 0, "")  # never ends
    await asyncio.to_thread(layouts, probe, {"mig-2": MIG})
    await asyncio.to_thread(select, probe, node, "mig-2")
    await start_controller()
    await probe.poll(lambda: probe.jobs(node), what="the partition Job")
    assert the_layout_arg(probe, node) == {
        "name": "mig-2",
        "entries": [{"devices": [0, 1], "mig": ["3g.40gb", "3g.40gb"]}],
    }
    [job] = probe.jobs(node)
    assert job.metadata.annotations[names.LAYOUT_KEY] == "mig-2"


@pytest.mark.parametrize(
    ("data", "label", "words"),
    [
        (None, "mig-2", f"{CONFIGMAP} does not exist"),
        ({"mig-2": MIG}, "nope", "layout 'nope' is not in ConfigMap"),
        (
            {"mixed": "- {devices: [0], mig: [3g.40gb]}\n- {devices: [0], tdm: [50, 50]}"},
            "mixed",
            "MIG and TDM are exclusive on one GPU",
        ),
        ({"odd": "- {devices: [0], mig: [5g.40gb]}"}, "odd", "unknown MIG profile '5g.40gb'"),
        ({"full": "- {devices: [0], mig: [4g.40gb, 4g.40gb]}"}, "full", "need 8 compute slices"),
    ],
)
async def test_a_layout_the_controller_can_judge_is_refused_with_an_event_and_no_job(
    probe: Any,
    start_controller: Any,
    kubelet: Any,
    *,
    data: dict[str, str] | None,
    label: str,
    words: str,
) -> None:
    [node] = await asyncio.to_thread(kubelet.nodes, 1, False)
    kubelet.behaviour[node] = outcome(True, "Converged", "converged", 0)
    await asyncio.to_thread(layouts, probe, data)
    await asyncio.to_thread(select, probe, node, label)
    await start_controller()
    [event] = await probe.poll(
        lambda: probe.events(node, "PartitionLayoutRefused"), what="the refusal Event"
    )
    assert event.type == "Warning"
    assert words in event.message
    assert event.message.endswith("nothing was changed")
    st = pstatus(probe, node)
    assert st is not None
    assert (st.result, st.layout) == ("refused", label)
    await asyncio.sleep(2)
    assert not probe.jobs(node), "a refused layout runs no agent"
    assert len(probe.events(node, "PartitionLayoutRefused")) == 1, "refused once, not per resync"
    # Fixed by the operator: the node converges to it.
    await asyncio.to_thread(layouts, probe, {label: MIG})
    await probe.poll(
        lambda: (s := pstatus(probe, node)) and s.result == "succeeded",
        what="the fixed layout converged",
    )


async def test_gpus_in_use_make_the_layout_wait_and_try_again_until_it_converges(
    probe: Any, start_controller: Any, kubelet: Any
) -> None:
    [node] = await asyncio.to_thread(kubelet.nodes, 1, False)
    busy = "gpu-0 by default/train/main (allocation a-1)"
    waiting = outcome(False, "AllocationsLive", f"waited 60 s for GPUs in use: {busy}", 7)
    kubelet.behaviour[node] = waiting
    await asyncio.to_thread(layouts, probe, {"mig-2": MIG})
    await asyncio.to_thread(select, probe, node, "mig-2")
    await start_controller(partition_wait_interval=1.0, retry_limit=1)
    await probe.poll(lambda: len(waiting.seen) >= 3, what="three tries while the GPU is in use")
    st = pstatus(probe, node)
    assert st is not None
    assert (st.result, st.reason, st.attempt) == ("waiting", "AllocationsLive", 1)
    [event] = probe.events(node, "PartitionWaiting")  # once, not once per try
    assert busy in event.message
    assert event.type == "Normal"
    # Another pod holds it now: said again.
    kubelet.behaviour[node] = outcome(False, "AllocationsLive", "waited: gpu-0 by b/c/d", 7)
    await probe.poll(lambda: len(probe.events(node, "PartitionWaiting")) == 2, what="new blocker")
    # The pod ended: the next try converges (waiting never used up the one try allowed).
    kubelet.behaviour[node] = outcome(True, "Converged", "gpu-0: whole → MIG", 0)
    await probe.poll(
        lambda: (s := pstatus(probe, node)) and s.result == "succeeded",
        what="converged after the GPU was released",
    )


async def test_a_refusal_by_the_agent_is_recorded_once_and_not_retried(
    probe: Any, start_controller: Any, kubelet: Any
) -> None:
    [node] = await asyncio.to_thread(kubelet.nodes, 1, False)
    refused = outcome(False, "LayoutRefused", "GPU 1: 3g.40gb+3g.40gb needs 80 GiB, has 40", 8)
    kubelet.behaviour[node] = refused
    await asyncio.to_thread(layouts, probe, {"mig-2": MIG})
    await asyncio.to_thread(select, probe, node, "mig-2")
    await start_controller(retry_backoff=0.2)
    [event] = await probe.poll(
        lambda: probe.events(node, "PartitionLayoutRefused"), what="the refusal Event"
    )
    assert "needs 80 GiB, has 40" in event.message
    await asyncio.sleep(2)
    assert len(refused.seen) == 1, "a refused layout is not retried"
    st = pstatus(probe, node)
    assert st is not None
    assert st.result == "refused"
    await probe.poll(lambda: not probe.jobs(node), what="the refused Job deleted")
    # The operator asks again.
    probe.core.patch_node(node, {"metadata": {"annotations": {names.RETRY_ANNOTATION: "now"}}})
    await probe.poll(lambda: len(refused.seen) == 2, what="a second try on request")


async def test_removing_the_label_leaves_the_node_as_it_is(
    probe: Any, start_controller: Any, kubelet: Any
) -> None:
    [node] = await asyncio.to_thread(kubelet.nodes, 1, False)
    ran = outcome(True, "Converged", "converged", 0)
    kubelet.behaviour[node] = ran
    await asyncio.to_thread(layouts, probe, {"mig-2": MIG})
    await asyncio.to_thread(select, probe, node, "mig-2")
    await start_controller()
    await probe.poll(lambda: (s := pstatus(probe, node)) and s.result == "succeeded", what="done")
    await asyncio.to_thread(select, probe, node, None)
    await asyncio.sleep(2)
    assert len(ran.seen) == 1
    assert not probe.jobs(node)


def fence_of(probe: Any, node: str) -> dict[str, Any] | None:
    ann = probe.core.read_node(node).metadata.annotations or {}
    text = ann.get(names.FENCE_ANNOTATION)
    return json.loads(text) if text else None


async def test_a_waiting_layout_fences_its_gpus_across_a_restart_and_lifts_the_fence_when_done(
    probe: Any, start_controller: Any, kubelet: Any
) -> None:
    """Issue 39: the GPUs a waiting change needs are fenced on the node (the annotation the
    device plugin reads) with an Event naming them and the pods; a new controller keeps the
    fence it cannot vouch for; convergence lifts it, with an Event."""
    [node] = await asyncio.to_thread(kubelet.nodes, 1, False)
    busy = "gpu-1 by default/train/main (a-1)"
    seen: list[str] = []

    def waiting(action: str, n: str) -> Ending:
        seen.append(action)
        text = agent_result(
            action,
            n,
            False,
            reason="AllocationsLive",
            message=f"waited: {busy}",
            devices_waited=["gpu-0", "gpu-1"],
            blocked_by=[busy],
        )
        return "Failed", 7, text

    kubelet.behaviour[node] = waiting
    await asyncio.to_thread(layouts, probe, {"mig-2": MIG})
    await asyncio.to_thread(select, probe, node, "mig-2")
    first = await start_controller(partition_wait_interval=1.0)
    fence = await probe.poll(lambda: fence_of(probe, node), what="the fence")
    assert (fence["layout"], fence["devices"], fence["heldBy"]) == (
        "mig-2",
        ["gpu-0", "gpu-1"],
        [busy],
    )
    [event] = await probe.poll(lambda: probe.events(node, "PartitionFenced"), what="its Event")
    assert "gpu-0, gpu-1" in event.message, event.message
    assert busy in event.message, event.message
    await probe.poll(lambda: len(seen) >= 3, what="more tries of the same wait")
    assert len(probe.events(node, "PartitionFenced")) == 1, "one Event for one wait"
    # the first try only looks (the GPUs are fenced before any try waits); the fenced ones wait
    looks = [a for a in kubelet.args[node] if a[0] == "partition"]
    assert looks[0][-1] == "--wait-for-release=0", looks[0]
    assert all("--wait-for-release=0" not in a for a in looks[1:]), looks
    # A restart mid-change: the new controller does not vouch for the old status, and keeps
    # the fence until its own agent run says the change ended.
    await first.stop()
    tries = len(seen)
    await start_controller(partition_wait_interval=1.0)
    await probe.poll(lambda: len(seen) > tries, what="a try by the new controller")
    assert fence_of(probe, node) is not None, "the fence did not survive the restart"
    assert not probe.events(node, "PartitionUnfenced")
    # Done: the fence goes, and says so.
    kubelet.behaviour[node] = outcome(True, "Converged", "gpu-0, gpu-1: whole → MIG", 0)
    await probe.poll(lambda: fence_of(probe, node) is None, what="the fence lifted")
    [lifted] = await probe.poll(lambda: probe.events(node, "PartitionUnfenced"), what="Event")
    assert "gpu-0, gpu-1" in lifted.message, lifted.message
    assert "converged" in lifted.message, lifted.message
    st = pstatus(probe, node)
    assert st is not None
    assert st.result == "succeeded"


async def test_an_abandoned_layout_lifts_its_fence(
    probe: Any, start_controller: Any, kubelet: Any
) -> None:
    [node] = await asyncio.to_thread(kubelet.nodes, 1, False)
    kubelet.behaviour[node] = lambda action, n: (
        "Failed",
        7,
        agent_result(
            action,
            n,
            False,
            reason="AllocationsLive",
            message="waited: gpu-0 by a/b/c (x)",
            devices_waited=["gpu-0"],
            blocked_by=["gpu-0 by a/b/c (x)"],
        ),
    )
    await asyncio.to_thread(layouts, probe, {"mig-2": MIG})
    await asyncio.to_thread(select, probe, node, "mig-2")
    await start_controller(partition_wait_interval=30.0)
    await probe.poll(lambda: fence_of(probe, node), what="the fence")
    await asyncio.to_thread(select, probe, node, None)
    await probe.poll(lambda: fence_of(probe, node) is None, what="the fence lifted")
    [lifted] = await probe.poll(lambda: probe.events(node, "PartitionUnfenced"), what="Event")
    assert "label was removed" in lifted.message, lifted.message
