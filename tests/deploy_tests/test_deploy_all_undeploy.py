"""`deploy-all.sh undeploy` switches the feature off on the nodes before the controller goes
(guide §3.5), says which cluster it acts on, and leaves no label or annotation of the suite.

Driven against a small kubectl stand-in that keeps nodes and the controller's behaviour in a JSON
file (the controller writes a succeeded disable status on each unlabelled enabled node), so the
order of the script's calls is checked without a cluster; test_deploy_cluster.py runs the same
script against a real one.
"""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from lj_runtimekit_testkit.manifests import DEPLOY

STATUS = "lj-runtimekit-controller/last-action-status"
LABEL = "lj_runtimekit_enable"

FAKE_KUBECTL = r"""
import json, sys, yaml
state_path = sys.argv[1]
args = sys.argv[2:]
with open(state_path) as f:
    st = json.load(f)
st["calls"].append(" ".join(a if len(a) < 80 else a[:40] + "..." for a in args))
out = ""
ns_args = args[2:] if args[:1] == ["-n"] else args

def status(action, result):
    return json.dumps({"action": action, "result": result, "time": "t", "job": "j",
                       "agentVersion": "1.13.0", "message": f"{action}: done", "reason": "Done"},
                      separators=(",", ":"))

def controller_tick():
    if not st["controller"] or st["stuck"]:
        return
    for name, n in st["nodes"].items():
        s = n["annotations"].get(KEY)
        if LABEL not in n["labels"] and s and '"action":"enable"' in s:
            n["annotations"][KEY] = status("disable", "succeeded")
            st["disabled_while_controller_ran"].append(name)

LABEL = "lj_runtimekit_enable"
KEY = "lj-runtimekit-controller/last-action-status"
CONTROLLER = "Deployment/lj-runtimekit-controller"
if args[:2] == ["config", "current-context"]:
    out = "ctx-test\n"
elif args[:2] == ["config", "view"]:
    out = "https://fake-apiserver:6443"
elif ns_args[:2] == ["get", "nodes"] and "-l" in ns_args:
    key = ns_args[ns_args.index("-l") + 1]
    out = "".join(f"node/{n}\n" for n, v in st["nodes"].items() if key in v["labels"])
elif ns_args[:2] == ["get", "nodes"]:
    st["polls"] += 1
    if st["polls"] > 2:
        controller_tick()
    for n, v in st["nodes"].items():
        for k in v["labels"]:
            out += f"{n}\tlabel\t{k}\t\n"
        for k, val in v["annotations"].items():
            out += f"{n}\tannotation\t{k}\t{val if k == KEY else ''}\n"
elif ns_args[:2] == ["get", "jobs"]:
    out = ""
elif ns_args[:2] == ["get", "deployment"]:
    out = "1" if st["controller"] else ""
elif ns_args[:1] == ["label"]:
    node = ns_args[1].removeprefix("node/") if "/" in ns_args[1] else ns_args[2]
    for k in [a[:-1] for a in ns_args if a.endswith("-")]:
        st["nodes"][node]["labels"].pop(k, None)
elif ns_args[:1] == ["annotate"]:
    for k in [a[:-1] for a in ns_args if a.endswith("-")]:
        st["nodes"][ns_args[2]]["annotations"].pop(k, None)
elif ns_args[:1] == ["delete"] and "-f" in ns_args:
    source = ns_args[ns_args.index("-f") + 1]
    if source == "-":
        for d in yaml.safe_load_all(sys.stdin.read()):
            if d:
                st["deleted"].append(f"{d['kind']}/{d['metadata']['name']}")
                if f"{d['kind']}/{d['metadata']['name']}" == CONTROLLER:
                    st["controller"] = False
    else:
        st["deleted"].append(source)
elif ns_args[:2] == ["delete", "jobs"]:
    st["deleted"].append("agent-jobs")
with open(state_path, "w") as f:
    json.dump(st, f)
sys.stdout.write(out)
"""


def node(labels: dict[str, str], status: str | None = None) -> dict[str, Any]:
    annotations = {"kubeadm.alpha.kubernetes.io/cri-socket": "unix:///run/containerd.sock"}
    if status:
        annotations[STATUS] = json.dumps(
            {"action": status, "result": "succeeded", "message": f"{status}: done"},
            separators=(",", ":"),
        )
    return {"labels": {"kubernetes.io/hostname": "x", **labels}, "annotations": annotations}


@pytest.fixture
def fake(tmp_path: Path) -> Path:
    state = {
        "nodes": {
            "gpu-a": node(
                {LABEL: "true", "lj-runtimekit.aliyun.com/gpu-model": "H200"}, status="enable"
            ),
            "gpu-b": node({LABEL: "true"}, status="enable"),
            "cpu-c": node({}),
        },
        "controller": True,
        "stuck": False,
        "polls": 0,
        "calls": [],
        "deleted": [],
        "disabled_while_controller_ran": [],
    }
    path = tmp_path / "state.json"
    path.write_text(json.dumps(state))
    fake = tmp_path / "kubectl"
    (tmp_path / "fake_kubectl.py").write_text(FAKE_KUBECTL)
    fake.write_text(
        f'#!/bin/sh\nexec {sys.executable} {tmp_path / "fake_kubectl.py"} {path} "$@"\n'
    )
    fake.chmod(0o755)
    return path


def undeploy(
    state: Path, *args: str, yes: bool = True, stdin: int | None = subprocess.DEVNULL, **env: str
) -> tuple[subprocess.CompletedProcess[str], Any]:
    environ = {
        **os.environ,
        "KUBECTL": str(state.parent / "kubectl"),
        "LJ_RUNTIMEKIT_LOG_DIR": str(state.parent / "logs"),
        "DISABLE_TIMEOUT": "20",
        **env,
    }
    done = subprocess.run(
        [str(DEPLOY / "deploy-all.sh"), "undeploy", *(["--yes"] if yes else []), *args],
        stdin=stdin,
        capture_output=True,
        text=True,
        env=environ,
        timeout=120,
        check=False,
    )
    return done, json.loads(state.read_text())


def set_state(state: Path, **changes: Any) -> None:
    data = json.loads(state.read_text())
    data.update(changes)
    state.write_text(json.dumps(data))


def test_undeploy_disables_every_node_before_the_controller_goes_and_leaves_nothing(
    fake: Path,
) -> None:
    done, st = undeploy(fake)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "cluster: context 'ctx-test', server https://fake-apiserver:6443" in out
    assert out.index("cluster: context") < out.index("switch the feature off")
    calls = st["calls"]
    first_change = next(i for i, c in enumerate(calls) if c.startswith(("label", "delete")))
    assert all(not c.startswith(("label", "annotate", "delete")) for c in calls[:first_change])
    assert sorted(st["disabled_while_controller_ran"]) == ["gpu-a", "gpu-b"]
    assert "Deployment/lj-runtimekit-controller" in st["deleted"]
    assert "every node is disabled" in out
    assert out.index("every node is disabled") < out.index("delete deploy/controller")
    assert "agent-jobs" in st["deleted"]
    assert "RuntimeClass/lj-runtime" not in st["deleted"], "shared: kept without --purge"
    assert not [d for d in st["deleted"] if "crds" in d], "shared: kept without --purge"
    assert "kept the shared objects" in out
    assert "undeploy --purge removes them too" in out
    for name, n in st["nodes"].items():
        assert LABEL not in n["labels"], name
        assert not [k for k in n["labels"] if k.startswith("lj-runtimekit.aliyun.com/")], name
        assert not [k for k in n["annotations"] if k.startswith("lj-runtimekit-")], name
        assert "kubeadm.alpha.kubernetes.io/cri-socket" in n["annotations"], "others' stay"


def test_a_node_not_disabled_in_time_stops_the_undeploy_with_what_to_check(
    fake: Path,
) -> None:
    set_state(fake, stuck=True)
    done, st = undeploy(fake, DISABLE_TIMEOUT="3")
    assert done.returncode == 1
    out = done.stdout
    assert "the feature is still on after 3s on: gpu-a gpu-b" in out
    assert "gpu-a: last action enable succeeded: enable: done" in out
    assert "logs job/lj-agent-<node>-disable" in out
    assert "--force" in out
    assert st["controller"], "the controller is kept to finish the job"
    assert not st["deleted"]


def test_force_goes_on_after_the_timeout(fake: Path) -> None:
    set_state(fake, stuck=True)
    done, st = undeploy(fake, "--force", DISABLE_TIMEOUT="2")
    assert done.returncode == 0, done.stdout
    assert "--force: removing the suite although these nodes are not disabled" in done.stdout
    assert "Deployment/lj-runtimekit-controller" in st["deleted"]


def test_without_a_running_controller_the_undeploy_refuses_to_strand_the_handler(
    fake: Path,
) -> None:
    set_state(fake, controller=False)
    done, st = undeploy(fake)
    assert done.returncode == 1
    assert "the controller is not running" in done.stdout
    assert "deploy-all.sh deploy --components=controller" in done.stdout
    assert not st["deleted"]
    assert LABEL in st["nodes"]["gpu-a"]["labels"], "nothing changed"


def test_undeploying_only_the_controller_keeps_the_nodes_as_they_are(fake: Path) -> None:
    done, st = undeploy(fake, "--components=controller")
    assert done.returncode == 0, done.stdout
    assert "undeploying the controller alone: the nodes stay as they are" in done.stdout
    assert LABEL in st["nodes"]["gpu-a"]["labels"]
    assert STATUS in st["nodes"]["gpu-a"]["annotations"]
    assert "Deployment/lj-runtimekit-controller" in st["deleted"]
    assert not [d for d in st["deleted"] if "DaemonSet" in d or "crds" in d], "only the controller"


def test_dry_run_says_what_it_would_do_and_changes_nothing(fake: Path) -> None:
    done, st = undeploy(fake, "--dry-run")
    assert done.returncode == 0, done.stdout
    assert "dry run: would remove the label lj_runtimekit_enable from: node/gpu-a node/gpu-b" in (
        done.stdout
    )
    assert not [c for c in st["calls"] if c.startswith(("label", "annotate"))]


def test_labelled_nodes_never_enabled_need_no_controller(fake: Path) -> None:
    data = json.loads(fake.read_text())
    for n in data["nodes"].values():
        n["annotations"].pop(STATUS, None)
    data["controller"] = False
    fake.write_text(json.dumps(data))
    done, st = undeploy(fake)
    assert done.returncode == 0, done.stdout
    assert LABEL not in st["nodes"]["gpu-a"]["labels"]


@pytest.mark.cluster
def test_undeploy_on_a_real_apiserver_waits_for_the_disable_and_cleans_the_nodes(
    cluster: Any, tmp_path: Path
) -> None:
    """The same sequence with the real kubectl and apiserver (its go-templates, label and
    annotate calls); the test plays the controller's part on the nodes."""
    from lj_runtimekit_testkit.manifests import tool_dir

    kubectl = str(tool_dir() / "kubectl")
    env = {
        **os.environ,
        "KUBECONFIG": cluster.kubeconfig,
        "KUBECTL": kubectl,
        "LJ_RUNTIMEKIT_LOG_DIR": str(tmp_path),
        "DISABLE_TIMEOUT": "60",
    }

    def k(*args: str) -> str:
        return subprocess.run(
            [kubectl, *args], env=env, capture_output=True, text=True, check=True, timeout=60
        ).stdout

    on, never = cluster.create_gpu_nodes(2, prefix="undeploy-real", enable=True)
    enabled = json.dumps({"action": "enable", "result": "succeeded", "message": "enable: done"})
    k("annotate", "node", on, f"{STATUS}={enabled}")
    k("label", "node", on, "lj-runtimekit.aliyun.com/gpu-model=H200")
    deploy = subprocess.run(
        [str(DEPLOY / "deploy-all.sh"), "deploy", "--components=controller"],
        env={**env, "ROLLOUT_TIMEOUT": "120s"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert deploy.returncode == 0, deploy.stdout
    script = subprocess.Popen(
        [str(DEPLOY / "deploy-all.sh"), "undeploy", "--yes", "--purge"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while LABEL in k("get", "node", on, "-o", "jsonpath={.metadata.labels}"):
            assert script.poll() is None, script.communicate()[0]
            assert time.monotonic() < deadline, "the label was never removed"
            time.sleep(0.2)
        time.sleep(2)
        assert script.poll() is None, "undeploy must wait for the node's disable"
        assert k("-n", "kube-system", "get", "deployment", "-o", "name").count("controller") == 1
        disabled = json.dumps(
            {"action": "disable", "result": "succeeded", "message": "disable: done"}
        )
        k("annotate", "--overwrite", "node", on, f"{STATUS}={disabled}")
        out, _ = script.communicate(timeout=240)
    finally:
        if script.poll() is None:
            script.kill()
    assert script.returncode == 0, out
    assert "cluster: context" in out
    assert "every node is disabled" in out
    for name in (on, never):
        meta = json.loads(k("get", "node", name, "-o", "json"))["metadata"]
        assert LABEL not in meta["labels"], name
        assert not [x for x in meta["labels"] if x.startswith("lj-runtimekit.aliyun.com/")]
        assert not [x for x in meta.get("annotations", {}) if x.startswith("lj-runtimekit-")]


def changes(st: Any) -> list[str]:
    return [c for c in st["calls"] if c.startswith(("label", "annotate", "delete"))]


def test_purge_also_removes_the_shared_runtime_class_and_crds(fake: Path) -> None:
    done, st = undeploy(fake, "--purge")
    assert done.returncode == 0, done.stdout
    assert "RuntimeClass/lj-runtime" in st["deleted"]
    assert [d for d in st["deleted"] if d.endswith("/crds/")], st["deleted"]


def test_purge_needs_all_components(fake: Path) -> None:
    done, st = undeploy(fake, "--purge", "--components=exporter")
    assert done.returncode == 1
    assert "--purge removes the objects all components share" in done.stderr
    assert "[HINT]" in done.stderr
    assert not st["calls"], "refused before touching the cluster"


def test_without_yes_and_without_a_terminal_undeploy_names_the_cluster_and_changes_nothing(
    fake: Path,
) -> None:
    done, st = undeploy(fake, yes=False)
    assert done.returncode == 1
    out = done.stdout
    assert (
        "not confirmed: undeploy device-plugin exporter scheduler controller from context " in out
    )
    assert "'ctx-test' (server https://fake-apiserver:6443)" in out
    assert "run again with --yes" in out
    assert not changes(st)


@pytest.mark.parametrize(("answer", "goes_on"), [("yes", True), ("no", False), ("", False)])
def test_on_a_terminal_undeploy_asks_and_only_yes_goes_on(
    fake: Path, answer: str, goes_on: bool
) -> None:
    primary, secondary = pty.openpty()
    try:
        os.write(primary, f"{answer}\n".encode())
        done, st = undeploy(fake, yes=False, stdin=secondary)
    finally:
        os.close(primary)
        os.close(secondary)
    assert "context 'ctx-test' (server https://fake-apiserver:6443)? Type yes" in done.stdout
    assert (done.returncode == 0) is goes_on, done.stdout
    assert bool(changes(st)) is goes_on
    if not goes_on:
        assert "not confirmed" in done.stdout
        assert "nothing was changed" in done.stdout


def test_the_log_file_is_named_first_and_last_and_holds_the_run(fake: Path) -> None:
    done, _ = undeploy(fake)
    lines = done.stdout.strip().splitlines()
    first, last = lines[0], lines[-1]
    assert "[INFO] log: " in first
    assert "[INFO] log: " in last
    path = Path(first.split("[INFO] log: ", 1)[1])
    assert path == Path(last.split("[INFO] log: ", 1)[1])
    assert path.parent == fake.parent / "logs"
    assert "every node is disabled" in path.read_text()
