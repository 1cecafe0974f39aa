"""Job names within 63 characters, the status annotation and the agent's report."""

from __future__ import annotations

import re

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


def test_agent_report_from_its_json_or_raw_output() -> None:
    report = status.agent_report(
        '{"reason":"RuntimeUnavailable","message":"socket absent","agent_version":"1.13.0"}', "f"
    )
    assert report == status.AgentReport("RuntimeUnavailable", "socket absent", "1.13.0")
    assert status.agent_report("Traceback...", "f").reason == "AgentOutput"
    assert status.agent_report(None, "Job x failed").message == "Job x failed"


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
