"""The job agent as a process (issue 19): each failure its own non-zero exit code, a result for
the controller whatever happens, and a signal mid-action leaves whole files, a pending restart for
the next run, and exit 130 (a second signal: 130 at once)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from lj_runtimekit_job_agent import app, lifecycle, result, settings

SAMPLES = Path(__file__).parent / "samples"


async def agent(argv: list[str], **extra: str) -> asyncio.subprocess.Process:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LJ_RUNTIMEKIT_JOB_AGENT_")}
    env.update(extra)
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "lj_runtimekit_job_agent",
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**env, "LJ_RUNTIMEKIT_JOB_AGENT_LOG_FORMAT": "json"},
    )


async def finished(argv: list[str], **extra: str) -> tuple[int, str]:
    proc = await agent(argv, **extra)
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode()


def termination(node: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((node.root / "termination-log").read_text())
    return data


async def test_each_failure_has_its_exit_code_and_a_result(node: Any, tmp_path: Path) -> None:
    code, out = await finished(node.argv("enable", "--rpc-timeout=-1"))
    assert code == result.EXIT_USAGE, out
    assert "rpc_timeout" in out

    node.config.write_bytes(b"\xff\xfeversion = 2")
    code, out = await finished(node.argv("enable"))
    assert code == result.EXIT_CONFIG_REFUSED, out
    assert termination(node)["reason"] == "ContainerdConfigRefused"

    node.config.write_text((SAMPLES / "v2-nvidia.toml").read_text())
    code, out = await finished(node.argv("enable", f"--socket-dir={tmp_path / 'none'}"))
    assert code == result.EXIT_RUNTIME_UNAVAILABLE, out
    assert termination(node)["reason"] == "RuntimeUnavailable"


async def test_v113_spellings_still_run_and_each_logs_a_deprecation(node: Any) -> None:
    # issue 21: an operator's v1.13 command line (the switch before the action, the old log
    # format, an old boolean in the environment) runs as before, with a warning naming the new
    original = (SAMPLES / "v2-nvidia.toml").read_text()
    node.config.write_text(original)
    argv = ["--dry-run", *node.argv("enable"), "--log-format", "console"]
    code, out = await finished(argv, LJ_RUNTIMEKIT_JOB_AGENT_DRY_RUN="yes")
    assert code == result.EXIT_OK, out
    assert termination(node)["reason"] == "DryRun"
    assert node.config.read_text() == original, "a dry run changes nothing"
    warnings = [line for line in out.splitlines() if "deprecated_setting" in line]
    assert any("log_format=console is deprecated: use log_format=text" in w for w in warnings)
    assert any("LJ_RUNTIMEKIT_JOB_AGENT_DRY_RUN='yes' is deprecated" in w for w in warnings)


async def _blocked_in_restart(node: Any) -> asyncio.subprocess.Process:
    """An agent stopped inside containerd's restart (a restart command that hangs)."""
    node.config.write_text((SAMPLES / "v2-nvidia.toml").read_text())
    script = node.root / "restart.sh"
    started = node.root / "restart-started"
    script.write_text(f"#!/bin/sh\necho $$ > {started}\nexec sleep 60\n")
    proc = await agent(node.argv("enable"))
    for _ in range(600):
        if started.exists() and started.read_text().strip():
            return proc
        await asyncio.sleep(0.05)
    raise AssertionError("the restart command never ran")


async def test_a_signal_mid_action_exits_130_with_whole_files_and_the_restart_left_pending(
    node: Any,
) -> None:
    proc = await _blocked_in_restart(node)
    proc.send_signal(signal.SIGTERM)
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == result.EXIT_INTERRUPTED, out.decode()
    assert termination(node)["reason"] == "Interrupted"
    assert "runtimes.lj-runtime]" in node.config.read_text(), "the edit is whole"
    assert (node.root / "etc/containerd/.lj-runtimekit-restart-pending").exists()
    restart = int((node.root / "restart-started").read_text())
    for _ in range(200):  # SIGKILLed by the agent: gone (or a zombie) once the kernel ran it
        if _gone(restart):
            break
        await asyncio.sleep(0.05)
    assert _gone(restart), "the agent leaves no restart command of its running"


def _gone(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return any(line.startswith("State:") and "Z" in line for line in status.splitlines())


async def test_a_second_signal_exits_130_at_once(node: Any) -> None:
    proc = await _blocked_in_restart(node)
    proc.send_signal(signal.SIGTERM)
    proc.send_signal(signal.SIGINT)
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    # Out at once means its restart command is left behind: the test's own to end.
    with contextlib.suppress(ProcessLookupError):
        os.kill(int((node.root / "restart-started").read_text()), signal.SIGKILL)
    assert proc.returncode == result.EXIT_INTERRUPTED, out.decode()


async def _until_signal_with(
    monkeypatch: Any, tmp_path: Path, outcome: Any, signal_first: bool
) -> tuple[int, str]:
    """``app._until_signal`` under ``lifecycle.Tasks`` with ``run_async`` replaced by ``outcome``;
    ``signal_first``: the stop a first signal sets comes while the action still runs."""
    log = tmp_path / "termination-log"
    config = settings.load(["enable", f"--termination-log={log}"], environ={})
    monkeypatch.setattr(app, "run_async", outcome)
    tasks = lifecycle.Tasks()
    if signal_first:
        asyncio.get_running_loop().call_later(0.05, tasks.stop.set)
    code = await app._until_signal(config, tasks)
    return code, log.read_text() if log.exists() else ""


async def test_the_actions_own_exit_code_is_the_agents(monkeypatch: Any, tmp_path: Path) -> None:
    async def unavailable(_: Any) -> tuple[int, Any]:
        return result.EXIT_RUNTIME_UNAVAILABLE, None

    code, written = await _until_signal_with(monkeypatch, tmp_path, unavailable, False)
    assert (code, written) == (result.EXIT_RUNTIME_UNAVAILABLE, "")  # run_async writes its own


async def test_a_stop_mid_action_cancels_it_and_writes_interrupted(
    monkeypatch: Any, tmp_path: Path
) -> None:
    cancelled = asyncio.Event()

    async def hangs(_: Any) -> tuple[int, Any]:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return result.EXIT_OK, None

    code, written = await _until_signal_with(monkeypatch, tmp_path, hangs, True)
    assert code == result.EXIT_INTERRUPTED
    assert json.loads(written)["reason"] == "Interrupted"
    assert cancelled.is_set(), "the action was cancelled, not left running"
