"""Job names within 63 characters, the status annotation and the agent's report."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lj_runtimekit_controller import job_spec, names, status

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_node = st.from_regex(r"[a-z0-9]([-a-z0-9.]{0,200}[a-z0-9])?", fullmatch=True)


@pytest.mark.parametrize(
    ("node", "action", "want"),
    [("gpu-1", "enable", "lj-agent-gpu-1-enable"), ("n", "disable", "lj-agent-n-disable")],
    ids=["short-enable", "short-disable"],
)
def test_short_names_are_the_guides(node: str, action: str, want: str) -> None:
    assert names.job_name(node, action) == want


@given(node=_node, action=st.sampled_from(names.ACTIONS))
def test_job_names_fit_and_differ(node: str, action: str) -> None:
    name = names.job_name(node, action)
    assert len(name) <= 63
    assert DNS_LABEL.match(name.replace(".", "-"))
    assert name.endswith(action)
    assert names.job_name(node + "x", action) != name


def test_a_60_character_node_keeps_its_whole_name_in_the_job() -> None:
    node = "n" * 60
    manifest = job_spec.manifest(job_spec.JobTemplate(image="img"), node, "enable", 1)
    meta = manifest["metadata"]
    assert len(meta["name"]) <= 63
    assert meta["annotations"][names.NODE_KEY] == node
    assert meta["labels"][names.NODE_KEY] == node
    assert manifest["spec"]["template"]["spec"]["nodeName"] == node


def test_status_round_trips() -> None:
    s = status.Status(
        "enable",
        "failed",
        "2027-01-01T00:00:00Z",
        "j",
        "uid",
        2,
        "1.13.0",
        "RuntimeUnavailable",
        "socket absent",
        "try 3/3 at ...",
    )
    assert status.parse(s.to_json()) == s


@pytest.mark.parametrize(
    "text",
    [
        None,
        "",
        "not json",
        "[1]",
        '{"action":"reboot","result":"succeeded"}',
        '{"action":"enable"}',
        '{"action":"enable","result":"succeeded","attempt":"x"}',
    ],
    ids=["absent", "empty", "text", "list", "unknown-action", "no-result", "bad-attempt"],
)
def test_hand_edited_status_reads_as_none(text: str | None) -> None:
    assert status.parse(text) is None


def agent_json(
    action: str = "enable", node: str = "gpu-1", succeeded: Any = True, **kw: Any
) -> str:
    """A result as the job agent writes it (result.Result.to_json: sorted keys, more fields)."""
    data = {
        "action": action,
        "node": node,
        "succeeded": succeeded,
        "reason": "Enabled" if succeeded is True else "RuntimeUnavailable",
        "message": "lj-runtime handler added" if succeeded is True else "socket absent",
        "agent_version": "1.13.0",
        "containerd_restarted": True,
        "time": "2027-01-01T00:00:00Z",
        **kw,
    }
    return json.dumps(data, separators=(",", ":"), sort_keys=True)


def judge(completed: bool, ended: status.Ended | None, detail: str = "") -> status.Outcome:
    return status.outcome(
        job="lj-agent-gpu-1-enable",
        namespace="kube-system",
        action="enable",
        node="gpu-1",
        completed=completed,
        ended=ended,
        detail=detail,
    )


def ended(message: str = "", reason: str = "Completed", code: int | None = 0) -> status.Ended:
    return status.Ended("lj-agent-gpu-1-enable-x1", message, reason, code)


def test_a_complete_job_whose_agent_reported_success_succeeded() -> None:
    out = judge(True, ended(agent_json()))
    assert out == status.Outcome(True, "Enabled", "lj-runtime handler added", "1.13.0")


NO_RESULT = [
    ("no-pod", None),
    ("kwok-pod-no-message", ended()),
    ("other-container-name-or-image", ended("hello from some other image")),
    ("json-not-a-result", ended('{"ok":true}')),
    ("succeeded-as-a-string", ended(agent_json(succeeded="true"))),
    ("json-list", ended("[1,2]")),
]


@pytest.mark.parametrize(("case", "end"), NO_RESULT, ids=[c[0] for c in NO_RESULT])
def test_a_complete_job_without_an_agent_result_is_a_failure(
    case: str, end: status.Ended | None
) -> None:
    out = judge(True, end)
    assert not out.succeeded
    assert out.reason == "NoAgentResult"
    assert out.message.startswith(
        "Job lj-agent-gpu-1-enable completed but its pod reported no job-agent result"
    )
    assert "is the image the job agent (--job-image)?" in out.message
    assert out.message.endswith("kubectl -n kube-system logs job/lj-agent-gpu-1-enable")


@pytest.mark.parametrize(
    ("action", "node"), [("disable", "gpu-1"), ("enable", "gpu-2")], ids=["action", "node"]
)
def test_a_result_for_another_action_or_node_is_not_trusted(action: str, node: str) -> None:
    out = judge(True, ended(agent_json(action, node)))
    assert (out.succeeded, out.reason) == (False, "AgentResultMismatch")
    assert f"for {action} on node {node}" in out.message


def test_a_failed_job_carries_the_agents_reason_and_message() -> None:
    out = judge(False, ended(agent_json(succeeded=False), "Error", 3), "BackoffLimitExceeded")
    assert out == status.Outcome(False, "RuntimeUnavailable", "socket absent", "1.13.0")


def test_a_complete_job_whose_agent_reported_failure_failed() -> None:
    assert judge(True, ended(agent_json(succeeded=False))).reason == "RuntimeUnavailable"


def test_a_failed_job_without_a_result_shows_its_output_or_exit_code() -> None:
    traceback = "Traceback (most recent call last):\n  ...\nOSError: boom\n"
    assert judge(False, ended(traceback, "Error", 1)) == status.Outcome(
        False, "AgentOutput", traceback.strip()
    )
    out = judge(False, ended("", "Error", 1), "DeadlineExceeded: too long")
    assert out.reason == "NoAgentResult"
    assert "Job lj-agent-gpu-1-enable failed (DeadlineExceeded: too long)" in out.message
    assert "agent container Error (exit code 1)" in out.message
    assert "no pod of it" in judge(False, None).message


@given(text=st.one_of(st.text(max_size=300), st.binary(max_size=300).map(repr)))
def test_only_an_agent_result_of_this_action_and_node_ever_succeeds(text: str) -> None:
    out = judge(True, ended(text))
    if out.succeeded:
        result = status.agent_result(text)
        assert result is not None
        assert (result.action, result.node, result.succeeded) == ("enable", "gpu-1", True)


@given(
    data=st.dictionaries(
        st.sampled_from(["action", "node", "succeeded", "reason", "message", "agent_version"]),
        st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=20)),
    )
)
def test_arbitrary_json_never_raises_and_succeeds_only_when_it_should(data: dict[str, Any]) -> None:
    out = judge(True, ended(json.dumps(data)))
    mine = (data.get("action"), data.get("node")) == ("enable", "gpu-1")
    assert out.succeeded == (mine and data.get("succeeded") is True)
    assert len(out.message) <= 2048


def test_a_long_agent_message_is_cut() -> None:
    out = judge(True, ended(agent_json(message="x" * 5000)))
    assert out.succeeded
    assert len(out.message) == status.MAX_MESSAGE


def test_job_manifest_has_only_the_host_access_the_agent_needs() -> None:
    t = job_spec.JobTemplate(image="reg/lj-runtimekit-controller-job-agent:v1.13.0", deadline_s=60)
    m = job_spec.manifest(t, "gpu-1", "disable", 2)
    pod = m["spec"]["template"]["spec"]
    assert m["metadata"]["namespace"] == "kube-system"
    assert m["spec"]["activeDeadlineSeconds"] == 60
    assert m["spec"]["backoffLimit"] == 0
    assert pod["tolerations"] == [{"operator": "Exists"}]
    assert sorted(v["hostPath"]["path"] for v in pod["volumes"]) == [
        "/etc/containerd",
        "/run/amp/eKitC/xdm/sockets",
    ]
    assert pod["containers"][0]["args"][:2] == ["disable", "--node-name=gpu-1"]
    assert m["metadata"]["annotations"][names.ATTEMPT_KEY] == "2"


def test_job_starts_where_the_runtime_is_absent_so_the_agent_can_say_so() -> None:
    t = job_spec.JobTemplate(image="reg/lj-runtimekit-controller-job-agent:v1.13.0")
    pod = job_spec.manifest(t, "gpu-1", "enable", 1)["spec"]["template"]["spec"]
    types = {v["hostPath"]["path"]: v["hostPath"]["type"] for v in pod["volumes"]}
    assert types["/run/amp/eKitC/xdm/sockets"] == "DirectoryOrCreate"
    (agent,) = pod["containers"]
    assert agent["imagePullPolicy"] == "IfNotPresent"
    assert pod["hostPID"] is True, "the agent restarts containerd through nsenter"
