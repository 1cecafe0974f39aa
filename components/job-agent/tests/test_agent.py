"""The job agent end to end on a temp host root with a config daemon on a real socket."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import grpc
import pytest

from lj_runtimekit_job_agent import app, result, settings

SAMPLES = Path(__file__).parent / "samples"


async def run(argv: list[str]) -> tuple[int, dict[str, Any]]:
    config = settings.load(argv, environ={})
    code, _ = await app.run_async(config)
    return code, termination_message(config.termination_log)


def termination_message(path: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(Path(path).read_text())
    return data


async def test_enable_switches_runtime_and_writes_the_handler_once(node: Any) -> None:
    node.config.write_text((SAMPLES / "v2-nvidia.toml").read_text())
    code, res = await run(node.argv("enable"))
    assert code == result.EXIT_OK, res
    assert res["succeeded"]
    assert res["reason"] == "Done"
    assert res["containerd_restarted"]
    assert node.daemon.enabled
    once = node.config.read_bytes()
    assert b"runtimes.lj-runtime]" in once
    for _ in range(9):
        code, res = await run(node.argv("enable"))
        assert code == 0
        assert res["reason"] == "AlreadyDone"
    assert node.config.read_bytes() == once
    assert node.restart_count() == 1, "containerd restarted only when the file changed"


async def test_disable_restores_the_original_bytes(node: Any) -> None:
    original = (SAMPLES / "v3-nvidia.toml").read_bytes()
    node.config.write_bytes(original)
    assert (await run(node.argv("enable")))[0] == 0
    code, res = await run(node.argv("disable"))
    assert code == 0
    assert res["action"] == "disable"
    assert node.config.read_bytes() == original
    assert not node.daemon.enabled
    assert node.restart_count() == 2


async def test_malformed_config_is_refused_and_left_untouched(node: Any) -> None:
    bad = (SAMPLES / "malformed.toml").read_bytes()
    node.config.write_bytes(bad)
    code, res = await run(node.argv("enable"))
    assert code == result.EXIT_CONFIG_REFUSED
    assert res["reason"] == "ContainerdConfigRefused"
    assert "not valid TOML" in res["message"]
    assert node.config.read_bytes() == bad
    assert "SetFeatures" not in node.daemon.calls, "nothing changed on a refused config"


async def test_absent_socket_is_a_clear_failure(node: Any, tmp_path: Path) -> None:
    argv = [*node.argv("enable"), f"--socket-dir={tmp_path / 'nowhere'}"]
    code, res = await run(argv)
    assert code == result.EXIT_RUNTIME_UNAVAILABLE
    assert "config-daemon.sock not found" in res["message"]


async def test_runtime_refusal_is_reported(node: Any) -> None:
    node.daemon.refuse = grpc.StatusCode.FAILED_PRECONDITION
    code, res = await run(node.argv("enable"))
    assert code == result.EXIT_FAILED
    assert "FAILED_PRECONDITION" in res["message"]


async def test_interrupted_write_leaves_the_old_file_whole(
    node: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = (SAMPLES / "v2-plain.toml").read_bytes()
    node.config.write_bytes(original)

    def crash(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", crash)
    code, res = await run(node.argv("enable"))
    assert code == result.EXIT_FAILED
    assert "No space left" in res["message"]
    assert node.config.read_bytes() == original
    leftovers = [p.name for p in node.config.parent.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []


async def test_dropin_used_when_the_config_imports_conf_d(node: Any) -> None:
    original = (SAMPLES / "v2-imports.toml").read_bytes()
    node.config.write_bytes(original)
    assert (await run(node.argv("enable")))[0] == 0
    dropin = node.root / "etc/containerd/conf.d/99-lj-runtime.toml"
    assert b"lj-runtime" in dropin.read_bytes()
    assert node.config.read_bytes() == original
    assert (await run(node.argv("disable")))[0] == 0
    assert not dropin.exists()


async def test_missing_config_is_created_and_disable_of_nothing_is_a_no_op(node: Any) -> None:
    assert (await run(node.argv("disable")))[0] == 0
    assert not node.config.exists()
    assert node.restart_count() == 0
    assert (await run(node.argv("enable", "--new-config-version=3")))[0] == 0
    assert node.config.read_text().startswith("version = 3\n")


async def test_dry_run_prints_the_diff_and_changes_nothing(
    node: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    original = (SAMPLES / "v2-nvidia.toml").read_bytes()
    node.config.write_bytes(original)
    code, res = await run(node.argv("enable", "--dry-run"))
    assert code == 0
    assert res["reason"] == "DryRun"
    out = capsys.readouterr().out
    assert '+      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.lj-runtime]' in out
    assert node.config.read_bytes() == original
    assert not node.daemon.enabled


def test_restart_failure_maps_to_its_exit_code() -> None:
    from lj_runtimekit_job_agent import host

    assert app._exit_code(host.ContainerdNotBack("x"))[0] == result.EXIT_CONTAINERD_NOT_BACK


def test_termination_message_fits_the_kubelet_limit() -> None:
    r = result.Result("enable", "n", False, "X", "m" * 10000, "1.13.0")
    assert len(r.to_json().encode()) <= result.MAX_MESSAGE
    assert json.loads(r.to_json())["reason"] == "X"
