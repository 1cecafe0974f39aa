"""Idempotent against effects (issue 19): "already done" means the running containerd has the
handler loaded, asked through its CRI Status, not only that the file holds it.

A fake CRI Status server stands for containerd in the unit cases (it "loads" the file when the
restart command runs); the last case runs a real containerd 2.x daemon and restarts it for real.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import json
import os
import signal
import stat
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc import aio

from lj_runtimekit_job_agent import app, cri, host, result, settings
from lj_runtimekit_job_agent import containerd_config as cc

SAMPLES = Path(__file__).parent / "samples"
CACHE = Path(
    os.environ.get("LJ_RUNTIMEKIT_CACHE")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lj-runtimekit"
)


@dataclass
class FakeContainerd:
    """CRI Status as containerd answers it: the handlers of the config read at its last start."""

    node: Any
    socket: Path
    loaded: frozenset[str]
    garbage: bool = False

    def restart(self) -> None:
        text = self.node.config.read_text()
        self.loaded = frozenset({"runc"} | ({cc.HANDLER} if cc.handler_block(text) else set()))

    async def status(self, request: Any, context: Any) -> Any:
        if self.node.restarts.exists() and self.node.restart_count() > self._seen:
            self._seen = self.node.restart_count()
            self.restart()
        reply: Any = cri.StatusResponse()
        for name in sorted(self.loaded):
            reply.runtime_handlers.add(name=name)
        return reply

    _seen: int = 0


@pytest.fixture
async def containerd(node: Any) -> AsyncIterator[FakeContainerd]:
    fake = FakeContainerd(node, node.socket_dir / "containerd.sock", frozenset({"runc"}))

    def serialize(m: Any) -> bytes:
        return b"\xff\xff\xff not protobuf" if fake.garbage else bytes(m.SerializeToString())

    handler = grpc.unary_unary_rpc_method_handler(
        fake.status,
        request_deserializer=cri.StatusRequest.FromString,
        response_serializer=serialize,
    )
    server = aio.server()
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler("runtime.v1.RuntimeService", {"Status": handler})]
    )
    server.add_insecure_port(f"unix://{fake.socket}")
    await server.start()
    try:
        yield fake
    finally:
        await server.stop(None)


def written_by_the_agent(text: str) -> str:
    return cc.with_handler(text, cc.Handler(systemd_cgroup=cc.node_systemd_cgroup([text])))


async def run(node: Any, fake: FakeContainerd, action: str, *extra: str) -> dict[str, Any]:
    argv = node.argv(action, f"--containerd-socket={fake.socket}", *extra)
    code, outcome = await app.run_async(settings.load(argv, environ={}))
    data: dict[str, Any] = json.loads(outcome.to_json())
    data["exit_code"] = code
    return data


async def test_a_handler_in_the_file_but_not_loaded_is_restarted_not_already_done(
    node: Any, containerd: FakeContainerd
) -> None:
    # An edit whose restart never happened and whose marker is gone (an older agent, a hand edit).
    node.config.write_text(written_by_the_agent((SAMPLES / "v2-nvidia.toml").read_text()))
    res = await run(node, containerd, "enable")
    assert (res["exit_code"], res["reason"], res["containerd_restarted"]) == (0, "Done", True)
    assert cc.HANDLER in containerd.loaded
    res = await run(node, containerd, "enable")
    assert (res["exit_code"], res["reason"]) == (0, "AlreadyDone")
    assert node.restart_count() == 1


async def test_disable_restarts_a_containerd_that_still_has_the_handler_loaded(
    node: Any, containerd: FakeContainerd
) -> None:
    node.config.write_text((SAMPLES / "v2-nvidia.toml").read_text())
    containerd.loaded = frozenset({"runc", cc.HANDLER})
    res = await run(node, containerd, "disable")
    assert (res["exit_code"], res["containerd_restarted"]) == (0, True), res
    assert cc.HANDLER not in containerd.loaded


async def test_containerd_back_without_the_handler_is_a_failure_that_says_so(
    node: Any, containerd: FakeContainerd
) -> None:
    node.config.write_text((SAMPLES / "v3-nvidia.toml").read_text())
    containerd.restart = lambda: None  # type: ignore[method-assign]  # it ignores the file
    res = await run(node, containerd, "enable", "--restart-timeout=0.5")
    assert (res["exit_code"], res["reason"]) == (
        result.EXIT_CONTAINERD_NOT_BACK,
        "HandlerNotLoaded",
    )
    assert "lj-runtime" in res["message"]
    marker = node.root / "etc/containerd/.lj-runtimekit-restart-pending"
    assert marker.exists(), "the next run restarts again"


async def test_a_cri_answering_garbage_is_not_trusted_and_the_file_decides(
    node: Any, containerd: FakeContainerd
) -> None:
    node.config.write_text(written_by_the_agent((SAMPLES / "v2-nvidia.toml").read_text()))
    containerd.garbage = True
    res = await run(node, containerd, "enable")
    assert (res["exit_code"], res["containerd_restarted"]) == (0, False), res


# --- a real containerd ---------------------------------------------------------------------------


def _containerd2() -> Path:
    built = sorted(glob.glob(str(CACHE / "node/node-*_containerd-v2*/bin/containerd")))
    if not built:
        pytest.skip(f"no containerd 2.x under {CACHE}/node (tests/cluster/build-node-binaries.sh)")
    return Path(built[-1])


@dataclass
class RealContainerd:
    binary: Path
    dir: Path
    config: Path
    socket: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def pidfile(self) -> Path:
        return self.dir / "pid"

    def start(self) -> None:
        log = open(self.dir / "log", "ab")  # noqa: SIM115 - the daemon's own log, kept open by it
        proc = subprocess.Popen(
            [str(self.binary), "--config", str(self.config)], stdout=log, stderr=log
        )
        log.close()
        self.proc = proc
        self.pidfile.write_text(str(proc.pid))

    def stop(self) -> None:
        if self.pidfile.exists():
            pid = int(self.pidfile.read_text())
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)  # the restarted daemon is the shell's, not ours
            self.pidfile.unlink()
        if self.proc is not None:  # the first one, ours (already gone after a restart)
            self.proc.terminate()
            self.proc.wait(timeout=30)


@pytest.fixture
def real_containerd(node: Any) -> Iterator[RealContainerd]:
    short = Path(f"/tmp/ljc-{os.getpid()}-{id(node) % 10000}")  # unix socket paths are short
    short.mkdir()
    config = node.config
    real = RealContainerd(_containerd2(), short, config, short / "c.sock")
    config.write_text(
        "version = 3\n"
        f'root = "{short}/root"\nstate = "{short}/state"\n'
        f"[plugins.'io.containerd.server.v1.grpc']\n  address = \"{real.socket}\"\n"
        f"[plugins.'io.containerd.server.v1.ttrpc']\n  address = \"{real.socket}.ttrpc\"\n"
        f"[plugins.'io.containerd.internal.v1.opt']\n  path = \"{short}/opt\"\n"
        "[plugins.'io.containerd.nri.v1.nri']\n  disable = true\n"
        "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]\n"
        '  runtime_type = "io.containerd.runc.v2"\n'
    )
    # The node's restart command restarts this daemon, as systemctl would.
    script = node.root / "restart.sh"
    script.write_text(
        "#!/bin/sh\n"
        f"echo restarted >> {node.restarts}\n"
        f"p=$(cat {real.pidfile}); kill $p 2>/dev/null\n"
        # Gone, or a zombie (the first daemon is the test's child, reaped at the end).
        'while [ -e /proc/$p ] && ! grep -q "^State:.*Z" /proc/$p/status 2>/dev/null; do '
        "sleep 0.05; done\n"
        f"nohup {real.binary} --config {config} >> {short}/log 2>&1 &\n"
        f"echo $! > {real.pidfile}\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    real.start()
    try:
        yield real
    finally:
        real.stop()
        subprocess.run(["rm", "-rf", str(short)], check=False)


async def _loaded_eventually(real: RealContainerd) -> frozenset[str]:
    for _ in range(100):
        try:
            return await cri.loaded_handlers(str(real.socket), 2.0)
        except cri.ContainerdUnreachable:
            await asyncio.sleep(0.1)
    raise AssertionError(
        f"containerd never answered; log: {(real.dir / 'log').read_text()[-2000:]}"
    )


class Killed(BaseException):
    """The agent's process dying (SIGKILL): nothing after it runs."""


@pytest.mark.containerd
async def test_killed_between_write_and_restart_ends_with_the_handler_loaded_by_real_containerd(
    node: Any, real_containerd: RealContainerd, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert cc.HANDLER not in await _loaded_eventually(real_containerd)
    real_write = host.write_atomic

    def write_then_die(path: Path, text: str, backup: bool = True) -> Path | None:
        saved = real_write(path, text, backup)
        if path == node.config:
            raise Killed
        return saved

    monkeypatch.setattr(host, "write_atomic", write_then_die)
    argv = node.argv("enable", f"--containerd-socket={real_containerd.socket}")
    with pytest.raises(Killed):
        await app.run_async(settings.load(argv, environ={}))
    monkeypatch.undo()
    # Worse than the kill: the marker is lost too (a host /etc restored from an image, say).
    (node.root / "etc/containerd/.lj-runtimekit-restart-pending").unlink()
    assert cc.handler_block(node.config.read_text()) is not None
    assert cc.HANDLER not in await _loaded_eventually(real_containerd)

    code, outcome = await app.run_async(settings.load(argv, environ={}))
    assert (code, outcome.reason, outcome.containerd_restarted) == (0, "Done", True), outcome
    assert cc.HANDLER in await _loaded_eventually(real_containerd)
    code, outcome = await app.run_async(settings.load(argv, environ={}))
    assert (code, outcome.reason) == (0, "AlreadyDone")
