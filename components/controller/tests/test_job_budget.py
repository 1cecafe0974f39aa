"""``max_active_jobs`` bounds the agent Jobs that exist, not only the ones running: a finished Job
holds its slot until its result is recorded on its node (test_cluster's
test_many_nodes_at_once_with_bounded_jobs saw 39 Jobs at once with a limit of 20 and 10 workers
when recording lagged behind under load)."""

from __future__ import annotations

from typing import Any, cast

from lj_runtimekit_controller import names
from lj_runtimekit_controller.actions import ActionLoop
from lj_runtimekit_controller.kube import Kube
from lj_runtimekit_controller.metrics import Metrics
from lj_runtimekit_controller.settings import Settings


def _job(name: str, node: str, condition: str | None) -> dict[str, Any]:
    status = (
        {"conditions": [{"type": condition, "status": "True", "lastTransitionTime": None}]}
        if condition
        else {}
    )
    return {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "labels": {names.ACTION_KEY: "enable"},
            "annotations": {names.NODE_KEY: node},
        },
        "status": status,
    }


def _loop(*jobs: dict[str, Any]) -> ActionLoop:
    loop = ActionLoop(Settings(job_image="agent:1"), cast(Kube, None), Metrics())
    for node in {j["metadata"]["annotations"][names.NODE_KEY] for j in jobs}:
        loop.nodes[node] = {"metadata": {"name": node}}
    for j in jobs:
        loop.jobs[j["metadata"]["name"]] = j
    return loop


def test_a_finished_job_holds_its_slot_until_its_result_is_recorded() -> None:
    loop = _loop(_job("a", "n1", None), _job("b", "n2", "Complete"), _job("c", "n3", "Failed"))
    assert loop.active_jobs() == 3
    loop._recorded.update({"uid-b", "uid-c"})  # what _record adds once it wrote the result
    assert loop.active_jobs() == 1


def test_a_deleted_job_is_forgotten_and_a_relist_keeps_only_what_exists() -> None:
    b = _job("b", "n2", "Complete")
    loop = _loop(b, _job("c", "n3", "Failed"))
    loop._recorded.update({"uid-b", "uid-c", "uid-gone"})
    loop._event("jobs", "DELETED", b)
    assert "uid-b" not in loop._recorded
    loop._relist("jobs", [_job("c", "n3", "Failed")])
    assert loop._recorded == {"uid-c"}


def test_a_finished_job_of_a_node_out_of_the_cache_holds_no_slot() -> None:
    # Its node left node_selector (or is going): _forget deletes its Jobs, none may block the limit.
    loop = _loop(_job("b", "n2", "Complete"))
    loop.nodes.clear()
    assert loop.active_jobs() == 0
