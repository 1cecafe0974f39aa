"""What a real node showed (issue 17), on a temp host root: the restart that failed and was never
retried, SystemdCgroup on a cgroupfs node, containerd 2.x configs, an operator's own handler."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import pytest

from lj_runtimekit_job_agent import app, host, plan, result, settings
from lj_runtimekit_job_agent import containerd_config as cc
from lj_runtimekit_job_agent.errors import ConfigError

SAMPLES = Path(__file__).parent / "samples"


async def run(argv: list[str]) -> tuple[int, dict[str, Any]]:
    config = settings.load(argv, environ={})
    code, outcome = await app.run_async(config)
    data: dict[str, Any] = json.loads(outcome.to_json())
    return code, data


def failing_restart(node: Any, failures: int) -> None:
    """The restart command fails ``failures`` times, then works (as a hand restart later did)."""
    left = node.root / "failures-left"
    left.write_text(str(failures))
    node.root.joinpath("restart.sh").write_text(
        "#!/bin/sh\n"
        f'n=$(cat {left}); if [ "$n" -gt 0 ]; then echo $((n-1)) > {left}; '
        'echo "Job for containerd.service failed" >&2; exit 1; fi\n'
        f"echo restarted >> {node.restarts}\n"
    )
    script = node.root / "restart.sh"
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


def handler(node: Any) -> dict[str, Any]:
    table = cc.handler_in(cc.parse(node.config.read_text()))
    assert table is not None
    return table


async def test_a_failed_restart_is_redone_by_the_next_run_not_reported_already_done(
    node: Any,
) -> None:
    node.config.write_text((SAMPLES / "v2-nvidia.toml").read_text())
    failing_restart(node, failures=1)
    code, res = await run(node.argv("enable"))
    assert code == result.EXIT_CONTAINERD_NOT_BACK
    assert res["reason"] == "ContainerdNotBack"
    assert "runtimes.lj-runtime]" in node.config.read_text(), "the edit itself was done"

    code, res = await run(node.argv("enable"))  # the controller's retried Job
    assert code == result.EXIT_OK, res
    assert res["reason"] == "Done", "never AlreadyDone while containerd has not loaded the edit"
    assert res["containerd_restarted"]
    assert node.restart_count() == 1
    assert res["restart_was_pending"]
    assert not res["containerd_changed"]
    assert "finishing a restart an earlier run left pending" in res["message"]
    assert not (node.root / "etc/containerd/.lj-runtimekit-restart-pending").exists()

    code, res = await run(node.argv("enable"))
    assert (code, res["reason"]) == (0, "AlreadyDone")
    assert node.restart_count() == 1


class Killed(BaseException):
    """The agent's pod killed (OOM, node drain, activeDeadlineSeconds)."""


async def test_an_agent_killed_between_edit_and_restart_leaves_the_restart_to_the_next_run(
    node: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    node.config.write_text((SAMPLES / "v3-nvidia.toml").read_text())
    marker = node.root / "etc/containerd/.lj-runtimekit-restart-pending"
    real_write = host.write_atomic
    seen: list[bool] = []

    def write_then_die(path: Path, text: str, backup: bool = True) -> Path | None:
        saved = real_write(path, text, backup)
        if path == node.config:
            seen.append(marker.exists())
            raise Killed
        return saved

    monkeypatch.setattr(host, "write_atomic", write_then_die)
    with pytest.raises(Killed):
        await run(node.argv("enable"))
    assert seen == [True], "the marker is durable before the config is edited"
    monkeypatch.undo()
    code, res = await run(node.argv("enable"))
    assert (code, res["reason"], res["containerd_restarted"]) == (0, "Done", True)
    assert node.restart_count() == 1
    assert not marker.exists()


@pytest.mark.parametrize(
    ("sample", "flag", "systemd"),
    [
        ("v2-plain", None, True),
        ("v2-nvidia", None, False),
        ("v3-default", None, False),
        ("v3-default", "--systemd-cgroup=true", True),
        ("v2-plain", "--systemd-cgroup=false", False),
    ],
    ids=["systemd-node", "no-runc-options", "containerd2-cgroupfs", "forced-true", "forced-false"],
)
async def test_handler_systemd_cgroup_follows_the_nodes_runc(
    node: Any, sample: str, flag: str | None, systemd: bool
) -> None:
    node.config.write_text((SAMPLES / f"{sample}.toml").read_text())
    code, res = await run(node.argv("enable", *([flag] if flag else [])))
    assert code == 0, res
    assert handler(node)["options"]["SystemdCgroup"] is systemd
    assert res["systemd_cgroup"] is systemd
    assert f"SystemdCgroup={str(systemd).lower()}" in res["message"]


async def test_systemd_cgroup_read_from_an_imported_dropin(node: Any) -> None:
    node.config.write_text((SAMPLES / "v2-imports.toml").read_text())
    confd = node.root / "etc/containerd/conf.d"
    confd.mkdir()
    (confd / "10-runc.toml").write_text(
        'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]\n'
        "  SystemdCgroup = true\n"
    )
    assert (await run(node.argv("enable")))[0] == 0
    dropin = cc.parse((confd / cc.DROPIN_NAME).read_text())
    assert cc.handler_in(dropin)["options"]["SystemdCgroup"] is True  # type: ignore[index]


async def test_a_containerd2_config_is_enabled_and_disabled_byte_for_byte(node: Any) -> None:
    original = (SAMPLES / "v3-default.toml").read_bytes()
    node.config.write_bytes(original)
    code, res = await run(node.argv("enable"))
    assert (code, res["reason"]) == (0, "Done")
    runtimes = cc.parse(node.config.read_text())["plugins"]["io.containerd.cri.v1.runtime"]
    lj = runtimes["containerd"]["runtimes"]["lj-runtime"]
    assert lj["container_annotations"] == ["xdm.amp.com*"]
    assert lj["options"]["SystemdCgroup"] is False
    assert (await run(node.argv("disable")))[0] == 0
    assert node.config.read_bytes() == original


OPERATOR = (
    "\n"
    '      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.lj-runtime]\n'
    '        runtime_type = "io.containerd.runc.v2"  # the operator\'s own\n'
    '        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.lj-runtime.options]\n'
    '          BinaryName = "/opt/vendor/xpu-container-runtime"\n'
)


async def test_an_operators_handler_is_kept_in_the_backup_and_restored_by_disable(
    node: Any,
) -> None:
    base = (SAMPLES / "v2-nvidia.toml").read_text()
    at = base.index("\n      # runc comment")
    original = base[:at] + OPERATOR + base[at:]
    assert cc.handler_block(original) is not None
    node.config.write_text(original)
    backup = node.config.with_name("config.toml.lj-runtimekit.bak")
    saved = Path(str(node.config) + plan.SAVED_SUFFIX)

    assert (await run(node.argv("enable")))[0] == 0
    assert handler(node)["options"]["BinaryName"] == cc.BINARY_NAME
    assert backup.read_text() == original
    assert "/opt/vendor/" in (host.read(saved) or "")
    # A changed setting rewrites our handler: the backup stays the operator's file.
    assert (await run(node.argv("enable", "--systemd-cgroup=true")))[0] == 0
    assert backup.read_text() == original

    code, res = await run(node.argv("disable"))
    assert code == 0, res
    assert node.config.read_text() == original
    assert host.read(saved) is None


async def test_the_result_says_what_the_agent_did(node: Any) -> None:
    node.config.write_text((SAMPLES / "v2-nvidia.toml").read_text())
    _, done = await run(node.argv("enable"))
    assert done["containerd_files"] == ["/etc/containerd/config.toml"]
    assert "Runtime features switched on" in done["message"]
    assert "/etc/containerd/config.toml edited" in done["message"]
    assert "containerd restarted and answering" in done["message"]
    _, again = await run(node.argv("enable"))
    assert again["reason"] == "AlreadyDone"
    assert "already on" in again["message"]
    assert "lj-runtime handler already in /etc/containerd/config.toml" in again["message"]
    assert not again["containerd_restarted"]


async def test_no_restart_command_says_containerd_must_be_restarted(node: Any) -> None:
    node.config.write_text((SAMPLES / "v2-nvidia.toml").read_text())
    code, res = await run(node.argv("enable", "--restart-command="))
    assert code == 0
    assert not res["containerd_restarted"]
    assert "containerd NOT restarted" in res["message"]


@pytest.mark.parametrize(
    "patterns", ["xdm.amp.com/*", "xdm.amp.com["], ids=["drops-the-keys", "malformed"]
)
async def test_container_annotations_that_drop_injection_keys_are_refused(
    node: Any, patterns: str
) -> None:
    original = (SAMPLES / "v2-nvidia.toml").read_bytes()
    node.config.write_bytes(original)
    code, res = await run(node.argv("enable", f"--container-annotations={patterns}"))
    assert code == result.EXIT_USAGE
    assert res["reason"] == "InvalidSettings"
    assert node.config.read_bytes() == original
    assert "SetFeatures" not in node.daemon.calls


def test_systemd_cgroup_setting_is_checked() -> None:
    with pytest.raises(ConfigError, match="systemd_cgroup"):
        settings.load(["enable", "--systemd-cgroup=maybe"], environ={})
