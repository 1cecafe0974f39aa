from pathlib import Path

import pytest

from lj_runtimekit_scheduler import settings
from lj_runtimekit_scheduler.errors import ConfigError


def test_defaults_name_the_scheduler_and_binpack() -> None:
    s = settings.load([], env={})
    assert s.scheduler_name == "lj-runtimekit-scheduler"
    assert s.gpu_strategy == "binpack"
    assert [p.name for p in s.plugins][-1] == "DefaultBinder"


def test_config_file_enables_disables_and_weights(tmp_path: Path) -> None:
    f = tmp_path / "config.yaml"
    f.write_text(
        "version: v1\nschedulerName: mine\ngpuStrategy: spread\nplugins:\n"
        "  - {name: GpuTopology, weight: 5}\n  - {name: NodeAffinity, enabled: false}\n"
    )
    s = settings.load(["--config", str(f)], env={})
    weights = {p.name: p.weight for p in s.plugins}
    assert s.scheduler_name == "mine"
    assert s.gpu_strategy == "spread"
    assert weights["GpuTopology"] == 5
    assert "NodeAffinity" not in weights


def test_flag_beats_env_beats_file(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("version: v1\nschedulerName: from-file\n")
    env = {"LJ_SCHEDULER_NAME": "from-env"}
    assert settings.load(["--config", str(f)], env=env).scheduler_name == "from-env"
    s = settings.load(["--config", str(f), "--scheduler-name", "flag"], env=env)
    assert s.scheduler_name == "flag"


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ("version: v2\n", "unknown config version"),
        ("schedulerName: x\n", "unknown config version"),
        ("version: v1\nbogus: 1\n", "unknown keys"),
        ("version: v1\ngpuStrategy: random\n", "binpack or spread"),
        ("version: v1\nplugins:\n  - {name: Nope}\n", "unknown plugin"),
        ("version: v1\nplugins:\n  - {name: GpuFit, weight: -1}\n", "non-negative"),
        ("- a\n", "mapping"),
        ("version: v1\nplugins: [\n", "cannot read"),
    ],
    ids=["v2", "no-version", "unknown-key", "strategy", "plugin", "weight", "list", "yaml"],
)
def test_bad_config_is_a_clear_error(tmp_path: Path, doc: str, message: str) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(doc)
    with pytest.raises(ConfigError, match=message):
        settings.load(["--config", str(f)], env={})


def test_resource_names_are_read_under_the_device_plugin_s_keys(tmp_path: Path) -> None:
    f = tmp_path / "config.yaml"
    f.write_text(
        "version: v1\nresource_gpu_core: example.com/vcore\nresource_ppu: example.com/npu\n"
    )
    names = settings.load(["--config", str(f)], env={}).resources
    assert names.all == (
        "aliyun.com/gpu",
        "example.com/vcore",
        "aliyun.com/gpu-memory",
        "example.com/npu",
    )


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("resource_gpu_core: vcore\n", "expected <domain>/<name>"),
        ("resource_gpu_core: aliyun.com/gpu\n", "resource names must differ"),
        ("resource_gpu_core: ''\n", "must be a non-empty string"),
    ],
    ids=["no-domain", "duplicate", "empty"],
)
def test_a_bad_resource_name_is_a_clear_error(tmp_path: Path, text: str, error: str) -> None:
    f = tmp_path / "config.yaml"
    f.write_text("version: v1\n" + text)
    with pytest.raises(ConfigError, match=error):
        settings.load(["--config", str(f)], env={})
