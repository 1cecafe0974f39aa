"""The job agent against the harness's runtime simulator: features switched, faults reported."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import grpc

from lj_runtimekit_job_agent import app, result, settings

SAMPLES = Path(__file__).parent / "samples"


def argv(root: Path, socket_dir: Path, action: str) -> list[str]:
    return [
        action,
        "--node-name=sim-node",
        f"--host-root={root}",
        f"--socket-dir={socket_dir}",
        "--restart-command=true",
        "--confirm-command=true",
        f"--termination-log={root / 'termination-log'}",
        "--rpc-timeout=2",
    ]


async def run(args: list[str]) -> tuple[int, dict[str, Any]]:
    config = settings.load(args, environ={})
    code, outcome = await app.run_async(config)
    data: dict[str, Any] = json.loads(outcome.to_json())
    return code, data


async def test_enable_then_disable_switch_the_simulated_runtime(
    runtime_sim: Any, tmp_path: Path
) -> None:
    (tmp_path / "etc/containerd").mkdir(parents=True)
    config = tmp_path / "etc/containerd/config.toml"
    original = (SAMPLES / "v2-nvidia.toml").read_bytes()
    config.write_bytes(original)
    code, res = await run(argv(tmp_path, runtime_sim.socket_dir, "enable"))
    assert code == 0, res
    assert runtime_sim.node.enabled
    assert res["runtime_version"]
    code, res = await run(argv(tmp_path, runtime_sim.socket_dir, "enable"))
    assert code == 0
    assert res["reason"] == "AlreadyDone"
    code, res = await run(argv(tmp_path, runtime_sim.socket_dir, "disable"))
    assert code == 0, res
    assert not runtime_sim.node.enabled
    assert config.read_bytes() == original


async def test_a_failing_config_daemon_fails_the_action_with_its_reason(
    runtime_sim: Any, tmp_path: Path
) -> None:
    runtime_sim.fail("ConfigService.SetFeatures", grpc.StatusCode.INTERNAL)
    code, res = await run(argv(tmp_path, runtime_sim.socket_dir, "enable"))
    assert code == result.EXIT_FAILED
    assert "SetFeatures failed: INTERNAL" in res["message"]


async def test_a_stopped_runtime_is_reported_unavailable(runtime_sim: Any, tmp_path: Path) -> None:
    await runtime_sim.stop()
    code, res = await run(argv(tmp_path, runtime_sim.socket_dir, "enable"))
    assert code == result.EXIT_RUNTIME_UNAVAILABLE
    assert res["reason"] == "RuntimeUnavailable"
