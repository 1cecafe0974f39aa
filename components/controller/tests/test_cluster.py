"""The controller on the harness cluster: real apiserver and kube-controller-manager; agent pods
end either on KWOK nodes (Complete without any agent result, or failed on the test's annotation)
or on the stand-in kubelet's nodes (with the agent's result in the termination message, as a real
kubelet reports it)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from lj_runtimekit_controller import names, status

pytestmark = pytest.mark.cluster


def done(probe: Any, node: str, action: str, result: str = "succeeded") -> Any:
    st = probe.status(node)
    return st if st is not None and (st.action, st.result) == (action, result) else None


async def test_label_runs_the_agent_and_records_its_success(
    probe: Any, start_controller: Any, kubelet: Any
) -> None:
    [node] = await asyncio.to_thread(kubelet.nodes, 1, True)
    await start_controller()
    st = await probe.poll(lambda: done(probe, node, "enable"), what="enable succeeded")
    assert st.job == names.job_name(node, "enable")
    assert (st.reason, st.agent_version) == ("Enabled", "1.13.0")
    assert st.message == "enabled by the stand-in kubelet's agent"
    await probe.poll(lambda: not probe.jobs(node), what="Job deleted")
    await probe.poll(lambda: not probe.pods(), what="its pods deleted")
    [event] = probe.events(node, "ActionSucceeded")
    assert event.message.endswith(": enabled by the stand-in kubelet's agent")


async def test_a_job_complete_without_an_agent_result_is_a_failure_and_is_kept(
    cluster: Any, probe: Any, start_controller: Any
) -> None:
    # A KWOK pod completes without running anything, like a pod whose image is not the agent.
    [node] = await probe.nodes(cluster, 1, enable=True)
    await start_controller(retry_limit=2, retry_backoff=0.5)
    st = await probe.poll(
        lambda: (s := done(probe, node, "enable", "failed")) and s.attempt == 2 and s,
        what="the second Complete-without-result recorded as failed",
    )
    job = names.job_name(node, "enable")
    assert st.reason == "NoAgentResult"
    assert st.message.startswith(f"Job {job} completed but its pod reported no job-agent result")
    assert st.message.endswith(f"kubectl -n {probe.namespace} logs job/{job}")
    assert "retries exhausted" in st.retry
    [kept] = probe.jobs(node)
    assert any(c.type == "Complete" for c in kept.status.conditions), "kept for the operator"
    # the Event follows the status write (Events are best effort): wait for it, then count
    failed = await probe.poll(
        lambda: len(probe.events(node, "ActionFailed")) >= 2 and probe.events(node, "ActionFailed"),
        what="two ActionFailed Events",
    )
    assert len(failed) == 2
    assert not probe.events(node, "ActionSucceeded")


async def test_the_agents_failure_reaches_annotation_and_event(
    probe: Any, start_controller: Any, kubelet: Any
) -> None:
    [node] = await asyncio.to_thread(kubelet.nodes, 1, True)
    why = "containerd config /etc/containerd/config.toml is not TOML: line 3"
    kubelet.behaviour[node] = lambda action, n: (
        "Failed",
        4,
        kubelet.agent_result(action, n, False, reason="ConfigRefused", message=why),
    )
    await start_controller(retry_limit=1)
    st = await probe.poll(lambda: done(probe, node, "enable", "failed"), what="failure recorded")
    assert (st.reason, st.message, st.agent_version) == ("ConfigRefused", why, "1.13.0")
    [event] = await probe.poll(lambda: probe.events(node, "ActionFailed"), what="Event")
    assert why in event.message
    assert len(probe.jobs(node)) == 1, "the failed Job is kept"


async def test_failure_keeps_the_job_and_retries_to_the_limit(
    cluster: Any, probe: Any, start_controller: Any
) -> None:
    [node] = await probe.nodes(cluster, 1, enable=True)
    await start_controller(
        job_pod_annotations=f"{probe.exit_code_annotation}=1", retry_limit=2, retry_backoff=0.5
    )
    st = await probe.poll(
        lambda: (s := done(probe, node, "enable", "failed")) and s.attempt == 2 and s,
        what="second failure recorded",
    )
    assert "retries exhausted" in st.retry
    assert "exit code 1" in st.message
    assert len(probe.jobs(node)) == 1, "the failed Job is kept"
    failed = await probe.poll(lambda: len(probe.events(node, "ActionFailed")) >= 2 and True)
    assert failed


async def test_label_flapped_ends_in_the_last_state_with_one_job_at_a_time(
    probe: Any, start_controller: Any, job_watcher: Any, kubelet: Any
) -> None:
    [node] = await asyncio.to_thread(kubelet.nodes, 1, False)
    await start_controller()
    for value in ("true", None, "true", None, "true"):
        await asyncio.to_thread(probe.label, node, value)
        await asyncio.sleep(0.1)
    await probe.poll(lambda: done(probe, node, "enable") and not probe.jobs(node), what="enabled")
    await asyncio.sleep(1.0)
    assert done(probe, node, "enable")
    assert job_watcher.peak_per_node <= 1


async def test_restart_mid_action_completes_it_once(
    probe: Any, start_controller: Any, kubelet: Any
) -> None:
    [node] = await asyncio.to_thread(kubelet.nodes, 1, True)
    first = await start_controller()
    await probe.poll(lambda: probe.jobs(node), what="Job created")
    await first.stop()
    await start_controller(identity="after-restart")
    await probe.poll(lambda: done(probe, node, "enable") and not probe.jobs(node), what="done")
    assert len(probe.events(node, "ActionSucceeded")) == 1


async def test_two_replicas_one_leader_and_takeover(
    probe: Any, start_controller: Any, kubelet: Any
) -> None:
    a = await start_controller(identity="replica-a")
    await asyncio.sleep(1.0)
    b = await start_controller(identity="replica-b")
    await probe.poll(lambda: a.controller.loop is not None, what="a leads")
    await asyncio.sleep(1.5)
    assert b.controller.loop is None, "b waits while a leads"
    await a.stop()
    await probe.poll(lambda: b.controller.loop is not None, deadline_s=15, what="b takes over")
    [node] = await asyncio.to_thread(kubelet.nodes, 1, True)
    await probe.poll(lambda: done(probe, node, "enable"), what="b reconciles")


async def test_a_60_character_node_name_works(
    probe: Any, start_controller: Any, kubelet: Any
) -> None:
    prefix = "n" * 56
    [node] = await asyncio.to_thread(kubelet.nodes, 1, True, prefix)
    assert len(node) >= 58
    await start_controller()
    st = await probe.poll(lambda: done(probe, node, "enable"), what="long name enabled")
    assert len(st.job) <= 63


async def test_many_nodes_at_once_with_bounded_jobs(
    probe: Any, start_controller: Any, job_watcher: Any, kubelet: Any
) -> None:
    nodes = await asyncio.to_thread(kubelet.nodes, 120, True, "many")
    await start_controller(max_active_jobs=20, concurrency=10)

    def all_done() -> bool:
        return all(done(probe, n, "enable") for n in nodes)

    await probe.poll(all_done, deadline_s=240, what="120 nodes enabled")
    # Running Jobs stay within 20; finished ones wait at most one step per worker for deletion.
    assert job_watcher.peak_total <= 20 + 10
    assert job_watcher.created == 120


async def test_a_forged_succeeded_status_is_not_believed_and_the_agent_runs(
    probe: Any, start_controller: Any, kubelet: Any
) -> None:
    # Issue 34 §6: whoever may annotate a node writes "enable succeeded" for a Job that never ran.
    [node] = await asyncio.to_thread(kubelet.nodes, 1, True)
    forged = status.Status(
        action="enable",
        result="succeeded",
        time="2026-01-01T00:00:00Z",
        job=names.job_name(node, "enable"),
        job_uid="00000000-0000-0000-0000-000000000000",
        attempt=1,
        reason="Enabled",
        message="forged",
    )
    body = {"metadata": {"annotations": {names.STATUS_ANNOTATION: forged.to_json()}}}
    await asyncio.to_thread(probe.core.patch_node, node, body)
    await start_controller()
    await probe.poll(lambda: probe.events(node, "ActionSucceeded"), what="the agent ran")
    st = probe.status(node)
    assert st is not None
    assert st.job_uid != forged.job_uid
    assert st.message == "enabled by the stand-in kubelet's agent"


async def test_the_job_of_a_deleted_node_is_deleted_and_frees_its_slot(
    probe: Any, start_controller: Any, kubelet: Any
) -> None:
    # Issue 34 §8: the agent pod of a node that goes away never ends; its Job must not stay.
    stuck, waiting = await asyncio.to_thread(kubelet.nodes, 2, False)
    del kubelet.behaviour[stuck]  # nobody plays its kubelet: the agent Job runs on
    try:
        await start_controller(max_active_jobs=1)
        await asyncio.to_thread(probe.label, stuck, "true")
        await probe.poll(lambda: probe.jobs(stuck), what="the stuck node's Job")
        await asyncio.to_thread(probe.label, waiting, "true")
        await asyncio.sleep(1.0)
        assert not probe.jobs(waiting), "the one slot is held by the stuck node's Job"
    finally:
        await asyncio.to_thread(probe.core.delete_node, stuck)
    await probe.poll(lambda: not probe.jobs(stuck), deadline_s=20, what="its Job deleted")
    await probe.poll(lambda: done(probe, waiting, "enable"), deadline_s=20, what="slot freed")
