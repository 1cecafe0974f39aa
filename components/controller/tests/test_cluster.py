"""The controller on the harness cluster: real apiserver, kube-controller-manager and KWOK nodes
whose Job pods complete (or fail on the test's annotation)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from lj_runtimekit_controller import names

pytestmark = pytest.mark.cluster


def done(probe: Any, node: str, action: str, result: str = "succeeded") -> Any:
    st = probe.status(node)
    return st if st is not None and (st.action, st.result) == (action, result) else None


async def test_label_runs_the_agent_and_records_success(
    cluster: Any, probe: Any, start_controller: Any
) -> None:
    [node] = await probe.nodes(cluster, 1, enable=True)
    await start_controller()
    st = await probe.poll(lambda: done(probe, node, "enable"), what="enable succeeded")
    assert st.job == names.job_name(node, "enable")
    await probe.poll(lambda: not probe.jobs(node), what="Job deleted")
    await probe.poll(lambda: not probe.pods(), what="its pods deleted")
    assert len(probe.events(node, "ActionSucceeded")) == 1


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
    cluster: Any, probe: Any, start_controller: Any, job_watcher: Any
) -> None:
    [node] = await probe.nodes(cluster, 1, enable=False)
    await start_controller()
    for value in ("true", None, "true", None, "true"):
        await asyncio.to_thread(probe.label, node, value)
        await asyncio.sleep(0.1)
    await probe.poll(lambda: done(probe, node, "enable") and not probe.jobs(node), what="enabled")
    await asyncio.sleep(1.0)
    assert done(probe, node, "enable")
    assert job_watcher.peak_per_node <= 1


async def test_restart_mid_action_completes_it_once(
    cluster: Any, probe: Any, start_controller: Any
) -> None:
    [node] = await probe.nodes(cluster, 1, enable=True)
    first = await start_controller()
    await probe.poll(lambda: probe.jobs(node), what="Job created")
    await first.stop()
    await start_controller(identity="after-restart")
    await probe.poll(lambda: done(probe, node, "enable") and not probe.jobs(node), what="done")
    assert len(probe.events(node, "ActionSucceeded")) == 1


async def test_two_replicas_one_leader_and_takeover(
    cluster: Any, probe: Any, start_controller: Any
) -> None:
    a = await start_controller(identity="replica-a")
    await asyncio.sleep(1.0)
    b = await start_controller(identity="replica-b")
    await probe.poll(lambda: a.controller.loop is not None, what="a leads")
    await asyncio.sleep(1.5)
    assert b.controller.loop is None, "b waits while a leads"
    await a.stop()
    await probe.poll(lambda: b.controller.loop is not None, deadline_s=15, what="b takes over")
    [node] = await probe.nodes(cluster, 1, enable=True)
    await probe.poll(lambda: done(probe, node, "enable"), what="b reconciles")


async def test_a_60_character_node_name_works(
    cluster: Any, probe: Any, start_controller: Any
) -> None:
    prefix = "n" * 56
    [node] = await probe.nodes(cluster, 1, enable=True, prefix=prefix)
    assert len(node) >= 58
    await start_controller()
    st = await probe.poll(lambda: done(probe, node, "enable"), what="long name enabled")
    assert len(st.job) <= 63


async def test_many_nodes_at_once_with_bounded_jobs(
    cluster: Any, probe: Any, start_controller: Any, job_watcher: Any
) -> None:
    nodes = await probe.nodes(cluster, 120, enable=True, prefix="many")
    await start_controller(max_active_jobs=20, concurrency=10)

    def all_done() -> bool:
        return all(done(probe, n, "enable") for n in nodes)

    await probe.poll(all_done, deadline_s=240, what="120 nodes enabled")
    # Running Jobs stay within 20; finished ones wait at most one step per worker for deletion.
    assert job_watcher.peak_total <= 20 + 10
    assert job_watcher.created == 120
