"""The agent Job's pinned shape: what the controller's admission policy
(deploy/controller/05-admission-policy.yaml) lets through, and the one ServiceAccount the docs
name. The policy itself is proven against the real apiserver in tests/security_tests."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lj_runtimekit_controller import job_spec, names

IMAGE = "reg/lj-runtimekit-controller-job-agent:v1.13.0"
_node = st.from_regex(r"[a-z0-9]([-a-z0-9.]{0,60}[a-z0-9])?", fullmatch=True)


def _pod(node: str = "gpu-1", action: str = "enable", **template: Any) -> dict[str, Any]:
    t = job_spec.JobTemplate(image=IMAGE, **template)
    spec: dict[str, Any] = job_spec.manifest(t, node, action, 1)["spec"]["template"]["spec"]
    return spec


def test_agent_runs_as_its_own_service_account_without_a_token() -> None:
    pod = _pod()
    assert pod["serviceAccountName"] == "lj-runtimekit-job-agent" == names.AGENT_SERVICE_ACCOUNT
    assert pod["automountServiceAccountToken"] is False


@settings(max_examples=50, deadline=None)
@given(node=_node, action=st.sampled_from(names.ACTIONS))
def test_agent_is_pinned_to_one_node_with_its_fixed_command_line(node: str, action: str) -> None:
    pod = _pod(node, action)
    assert pod["nodeName"] == node
    assert "affinity" not in pod
    assert "nodeSelector" not in pod
    (agent,) = pod["containers"]
    assert "initContainers" not in pod
    assert "ephemeralContainers" not in pod
    assert agent["name"] == names.AGENT_CONTAINER
    assert agent["image"] == IMAGE
    assert "command" not in agent, "the image's own entrypoint runs"
    assert agent["args"][:2] == [action, f"--node-name={node}"]
    assert all(a.startswith("--") for a in agent["args"][1:])
    assert agent["env"] == [{"name": "NODE_NAME", "value": node}]


@pytest.mark.parametrize("action", ["enable", "disable"])
def test_agent_host_access_is_the_two_directories_and_host_pid_only(action: str) -> None:
    pod = _pod(action=action)
    assert {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]} == {
        "containerd": "/etc/containerd",
        "runtime-sockets": "/run/amp/eKitC/xdm/sockets",
    }
    (agent,) = pod["containers"]
    assert {m["name"]: m["mountPath"] for m in agent["volumeMounts"]} == {
        "containerd": "/etc/containerd",
        "runtime-sockets": "/run/amp/eKitC/xdm/sockets",
    }
    assert not any(a.startswith("--pod-resources-socket") for a in agent["args"])
    assert pod["hostPID"] is True
    assert not pod.get("hostNetwork")
    assert not pod.get("hostIPC")
    # privileged for nsenter into the host's PID 1 (docs/security.md); nothing written in the image
    assert agent["securityContext"] == {
        "privileged": True,
        "runAsUser": 0,
        "readOnlyRootFilesystem": True,
    }
    assert "ports" not in agent


@pytest.mark.parametrize(
    ("template", "directory"),
    [({}, "/var/lib/kubelet/pod-resources"), ({"pod_resources_dir": "/k/pr"}, "/k/pr")],
    ids=["default", "setting"],
)
def test_a_partition_job_also_reads_the_kubelets_pod_resources_directory(
    template: dict[str, Any], directory: str
) -> None:
    """Only partition Jobs: the agent asks the kubelet which pods hold a GPU bound to vfio-pci
    before changing it (the Runtime allocates nothing for those); read-only, at the same path."""
    pod = _pod(action="partition", **template)
    assert {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]} == {
        "containerd": "/etc/containerd",
        "runtime-sockets": "/run/amp/eKitC/xdm/sockets",
        "kubelet-pod-resources": directory,
    }
    (agent,) = pod["containers"]
    (mount,) = (m for m in agent["volumeMounts"] if m["name"] == "kubelet-pod-resources")
    assert mount == {"name": "kubelet-pod-resources", "mountPath": directory, "readOnly": True}
    assert f"--pod-resources-socket={directory}/kubelet.sock" in agent["args"]


def test_only_a_partition_job_s_first_look_does_not_wait_and_it_overrides_the_operator() -> None:
    """A layout not fenced yet: its Job reports the GPUs in use at once (the controller then
    fences them); its last arg, so the operator's own ``--wait-for-release`` does not win."""
    t = job_spec.JobTemplate(image=IMAGE, agent_args=("--wait-for-release=120",))

    def args(action: str, first_look: bool) -> list[str]:
        m = job_spec.manifest(t, "gpu-1", action, 1, first_look=first_look)
        out: list[str] = m["spec"]["template"]["spec"]["containers"][0]["args"]
        return out

    assert args("partition", True)[-2:] == ["--wait-for-release=120", "--wait-for-release=0"]
    assert "--wait-for-release=0" not in args("partition", False)
    assert "--wait-for-release=0" not in args("enable", True)
