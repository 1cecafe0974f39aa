"""Settings: flag > env > ConfigMap file > default, versioned file, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from lj_runtimekit_device_plugin.errors import ConfigError
from lj_runtimekit_device_plugin.settings import load


def test_flag_beats_env_beats_file_beats_default(tmp_path: Path) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text("version: v1\nhealth_interval: 7\nresource_gpu_memory: aliyun.com/gpu-mem\n")
    env = {"LJ_RUNTIMEKIT_DEVICE_PLUGIN_HEALTH_INTERVAL": "3", "NODE_NAME": "n1"}
    s = load(["--config", str(cfg)], env)
    assert s.health_interval == 3.0
    assert s.resource_gpu_memory == "aliyun.com/gpu-mem"
    assert s.node_name == "n1"
    s = load(["--config", str(cfg), "--health-interval", "1.5"], env)
    assert s.health_interval == 1.5
    assert load([], {"NODE_NAME": "n1"}).health_interval == 5.0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("version: v2\n", "version 'v2' unknown"),
        ("health_interval: 1\n", "version None unknown"),
        ("version: v1\nbogus: 1\n", "unknown keys ['bogus']"),
        ("version: v1\nhealth_interval: [1]\n", "is not a valid float"),
        ("version: v1\nmig_strategy: half\n", "mig_strategy 'half'"),
        ("version: v1\nresources: gpu,tpu\n", "unknown kinds ['tpu']"),
        ("version: v1\nresource_gpu: gpu\n", "expected <domain>/<name>"),
        (
            "version: v1\ndra_topology_labels: network.topology/super-block\n",
            "'network.topology/super-block' cannot be a DRA attribute name",
        ),
        (": : :\n", "not valid YAML"),
    ],
    ids=[
        "future-version",
        "no-version",
        "unknown-key",
        "list",
        "bad-choice",
        "bad-kind",
        "bad-name",
        "topology-label-not-an-attribute",
        "garbage",
    ],
)
def test_bad_config_file_is_a_clear_error(tmp_path: Path, text: str, message: str) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(text)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load(["--config", str(cfg)], {"NODE_NAME": "n1"})


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("node_label_prefix", "gpu.example.com"),
        ("dra_driver_name", "gpu.example.com"),
        ("cdi_kind", "aliyun.com/gpu"),
    ],
    ids=["label-prefix", "dra-driver", "cdi-kind"],
)
def test_a_name_with_a_trailing_newline_is_refused(key: str, value: str) -> None:
    # a check ending in $ also matched before a final newline
    env = {"NODE_NAME": "n1", f"LJ_RUNTIMEKIT_DEVICE_PLUGIN_{key.upper()}": value}
    assert getattr(load([], env), key) == value
    env[f"LJ_RUNTIMEKIT_DEVICE_PLUGIN_{key.upper()}"] = value + "\n"
    with pytest.raises(ConfigError, match=key):
        load([], env)


def test_resource_name_per_kind() -> None:
    s = load([], {"NODE_NAME": "n1"})
    assert s.resource_name("gpu-core") == "aliyun.com/gpu-core"
    assert s.enabled == ("gpu", "gpu-core", "gpu-memory", "ppu", "gpu-vfio")
    assert s.resource_name("gpu-vfio") == "aliyun.com/gpu-vfio"
