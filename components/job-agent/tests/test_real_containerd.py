"""Real containerd binaries load the agent's config: `containerd config dump` shows the lj-runtime
handler, as the guide's verification step does (`containerd config dump | grep -A 5 lj-runtime`).

Two binaries: Debian's containerd 1.6 (reads v1/v2) and containerd 2.x built from Go modules by
tests/cluster/build-node-binaries.sh (reads v2 to v4; its own `config default` writes version 4
with `imports = ['/etc/containerd/conf.d/*.toml']`). Each also checks that the SystemdCgroup the
agent chose equals the one containerd itself resolves for the node's runc runtime.
"""

from __future__ import annotations

import asyncio
import glob
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from lj_runtimekit_job_agent import app, result, settings
from lj_runtimekit_job_agent import containerd_config as cc

pytestmark = pytest.mark.containerd
SAMPLES = Path(__file__).parent / "samples"
TOOL = Path(__file__).parents[3] / "tests/tools/debian-tool.sh"
CACHE = Path(
    os.environ.get("LJ_RUNTIMEKIT_CACHE")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lj-runtimekit"
)
DEBIAN = "containerd-1.6-debian"
GO_BUILT = "containerd-2.x"
SAMPLES_FOR = {
    DEBIAN: ["v2-nvidia", "v2-plain", "v1-legacy"],
    GO_BUILT: ["v2-nvidia", "v2-plain", "v3-nvidia", "v3-default", "v4-containerd2.4-default"],
}


def _debian() -> str:
    found = subprocess.run(
        [str(TOOL), "containerd", "usr/bin/containerd"], capture_output=True, text=True, check=False
    )
    if found.returncode != 0:
        if shutil.which("apt-get") is None:
            pytest.skip("no apt-get to fetch Debian's containerd")
        pytest.fail(f"cannot fetch containerd: {found.stderr}")
    return found.stdout.strip()


def _go_built() -> str:
    built = sorted(glob.glob(str(CACHE / "node/node-*_containerd-v2*/bin/containerd")))
    if not built:
        pytest.skip(
            f"no containerd 2.x under {CACHE}/node: build it with "
            "tests/cluster/build-node-binaries.sh"
        )
    return built[-1]


@pytest.fixture(scope="module", params=[DEBIAN, GO_BUILT])
def containerd(request: pytest.FixtureRequest) -> tuple[str, str]:
    kind = str(request.param)
    return kind, _debian() if kind == DEBIAN else _go_built()


def dump(binary: str, config: Path) -> str:
    out = subprocess.run(
        [binary, "--config", str(config), "config", "dump"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def runtimes_of(dumped: str) -> dict[str, Any]:
    """The CRI runtimes as containerd resolved them (1.6 dumps v2, 2.x dumps v3 or later)."""
    doc = cc.parse(dumped)
    plugins = doc["plugins"]
    section = plugins.get("io.containerd.cri.v1.runtime") or plugins["io.containerd.grpc.v1.cri"]
    runtimes: dict[str, Any] = section["containerd"]["runtimes"]
    return runtimes


def point_imports_at(text: str, directory: Path) -> str:
    """The sample with its host imports moved under the test's own directory."""
    return text.replace("'/etc/containerd/conf.d/*.toml'", f"'{directory}/*.toml'")


def test_every_sample_is_covered() -> None:
    names = {p.stem for p in SAMPLES.glob("*.toml")} - {"malformed", "v2-imports"}
    assert names == {n for ns in SAMPLES_FOR.values() for n in ns}


@pytest.mark.parametrize("name", sorted({n for ns in SAMPLES_FOR.values() for n in ns}), ids=str)
def test_containerd_loads_the_handler_with_the_nodes_cgroup_driver(
    containerd: tuple[str, str], tmp_path: Path, name: str
) -> None:
    kind, binary = containerd
    if name not in SAMPLES_FOR[kind]:
        pytest.skip(f"{kind} does not read {name}")
    original = point_imports_at((SAMPLES / f"{name}.toml").read_text(), tmp_path / "conf.d")
    systemd = cc.node_systemd_cgroup([original])
    config = tmp_path / "config.toml"
    config.write_text(cc.with_handler(original, cc.Handler(systemd_cgroup=systemd)))
    dumped = dump(binary, config)
    assert "lj-runtime" in dumped
    runtimes = runtimes_of(dumped)
    handler = runtimes["lj-runtime"]
    assert handler["runtime_type"] == "io.containerd.runc.v2"
    assert handler["container_annotations"] == ["xdm.amp.com*"]
    assert handler["options"]["BinaryName"] == "/usr/local/harp/kitC/xpu-container-runtime"
    assert handler["options"]["SystemdCgroup"] is systemd
    runc_systemd = runtimes.get("runc", {}).get("options", {}).get("SystemdCgroup", False)
    assert runc_systemd is systemd, "the handler's cgroup driver is the node's runc's"


def test_containerd_loads_the_dropin(containerd: tuple[str, str], tmp_path: Path) -> None:
    kind, binary = containerd
    confd = tmp_path / "conf.d"
    confd.mkdir()
    config = tmp_path / "config.toml"
    if kind == DEBIAN:
        config.write_text(f'version = 2\nimports = ["{confd}/*.toml"]\n')
        version = 2
    else:
        text = (SAMPLES / "v4-containerd2.4-default.toml").read_text()
        config.write_text(point_imports_at(text, confd))
        version = 4
    (confd / cc.DROPIN_NAME).write_text(cc.dropin_text(version, cc.Handler(systemd_cgroup=False)))
    handler = runtimes_of(dump(binary, config))["lj-runtime"]
    assert handler["container_annotations"] == ["xdm.amp.com*"]
    assert handler["options"]["SystemdCgroup"] is False


async def test_the_agent_on_containerd2s_own_default_config(node: Any, tmp_path: Path) -> None:
    """The whole agent on `containerd config default` of 2.x: the drop-in goes to conf.d, its
    'restart' is containerd loading the result, and disable leaves the config as it was."""
    binary = _go_built()
    etc = tmp_path / "etc-containerd"
    (etc / "conf.d").mkdir(parents=True)
    (etc / "conf.d/10-runc.toml").write_text(
        "version = 4\n"
        "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]\n"
        "  SystemdCgroup = true\n"
    )
    config = etc / "config.toml"
    generated = (
        await asyncio.to_thread(
            subprocess.run,
            [binary, "config", "default"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
    ).stdout
    original = point_imports_at(generated, etc / "conf.d")
    config.write_text(original)
    loads = f"{binary} --config {config} config dump"
    argv = [
        *node.argv("enable"),
        "--host-root=/",
        f"--containerd-config={config}",
        f"--restart-command={loads}",
    ]
    code, outcome = await app.run_async(settings.load(argv, environ={}))
    res = json.loads(outcome.to_json())
    assert code == result.EXIT_OK, res
    assert res["containerd_files"] == [str(etc / "conf.d" / cc.DROPIN_NAME)]
    assert res["systemd_cgroup"] is True, "read from the node's own drop-in"
    handler = runtimes_of(dump(binary, config))["lj-runtime"]
    assert handler["options"]["SystemdCgroup"] is True
    assert config.read_text() == original

    argv[0] = "disable"
    code, outcome = await app.run_async(settings.load(argv, environ={}))
    assert code == result.EXIT_OK, outcome
    assert "lj-runtime" not in dump(binary, config)
    assert not (etc / "conf.d" / cc.DROPIN_NAME).exists()
