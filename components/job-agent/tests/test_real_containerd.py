"""A real containerd (Debian's package) loads the agent's config: `containerd config dump` shows
the lj-runtime handler, as the guide's verification step does. containerd 1.6 reads v1/v2."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from lj_runtimekit_job_agent import containerd_config as cc

pytestmark = pytest.mark.containerd
SAMPLES = Path(__file__).parent / "samples"
TOOL = Path(__file__).parents[3] / "tests/tools/debian-tool.sh"


@pytest.fixture(scope="module")
def containerd() -> str:
    found = subprocess.run(
        [str(TOOL), "containerd", "usr/bin/containerd"], capture_output=True, text=True, check=False
    )
    if found.returncode != 0:
        if shutil.which("apt-get") is None:
            pytest.skip("no apt-get to fetch Debian's containerd")
        pytest.fail(f"cannot fetch containerd: {found.stderr}")
    return found.stdout.strip()


def dump(containerd: str, config: Path) -> str:
    out = subprocess.run(
        [containerd, "--config", str(config), "config", "dump"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.parametrize("name", ["v2-nvidia", "v2-plain", "v1-legacy"], ids=str)
def test_containerd_loads_the_handler(containerd: str, tmp_path: Path, name: str) -> None:
    config = tmp_path / "config.toml"
    config.write_text(cc.with_handler((SAMPLES / f"{name}.toml").read_text()))
    dumped = cc.parse(dump(containerd, config))
    runtimes = dumped["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]
    handler = runtimes["lj-runtime"]
    assert handler["runtime_type"] == "io.containerd.runc.v2"
    assert handler["container_annotations"] == ["xdm.amp.com*"]
    assert handler["options"] == {
        "BinaryName": "/usr/local/harp/kitC/xpu-container-runtime",
        "SystemdCgroup": True,
    }


def test_containerd_loads_the_dropin(containerd: str, tmp_path: Path) -> None:
    (tmp_path / "conf.d").mkdir()
    config = tmp_path / "config.toml"
    config.write_text(f'version = 2\nimports = ["{tmp_path}/conf.d/*.toml"]\n')
    (tmp_path / "conf.d" / cc.DROPIN_NAME).write_text(cc.dropin_text(2))
    assert "runtimes.lj-runtime]" in dump(containerd, config)
