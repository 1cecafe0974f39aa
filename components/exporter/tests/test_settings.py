"""Settings: flag > environment > ConfigMap file > default; bad config gets a clear error."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from lj_runtimekit_exporter import settings
from lj_runtimekit_exporter.errors import ConfigError

README = Path(__file__).parents[1] / "README.md"


def test_flag_beats_environment_beats_file_beats_default(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("version: v1\nport: 9601\npoll_interval: 3\npods_source: none\n")
    env = {
        "LJ_RUNTIMEKIT_EXPORTER_CONFIG": str(f),
        "LJ_RUNTIMEKIT_EXPORTER_PORT": "9701",
        "LJ_RUNTIMEKIT_EXPORTER_POLL_INTERVAL": "2.5",
        "NODE_NAME": "node-a",
    }
    s = settings.load(["--port", "9801"], env)
    assert s.port == 9801
    assert s.poll_interval == 2.5
    assert s.pods_source == "none"
    assert s.rpc_timeout == 2.0
    assert s.node_name == "node-a"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("version: v2\n", "version 'v2' unknown"),
        ("port: 1\n", "version None unknown"),
        ("version: v1\nprot: 1\n", "unknown keys ['prot']"),
        ("version: v1\nport: eighty\n", "port='eighty' is not a valid int"),
        ("version: v1\npods_source: dns\n", "pods_source 'dns'"),
        ("version: v1\npoll_interval: 0\n", "poll_interval 0.0: expected a positive number"),
        ("- a\n", "expected a mapping"),
        ("version: [\n", "not valid YAML"),
    ],
    ids=["bad-version", "no-version", "unknown-key", "bad-int", "bad-enum", "zero", "list", "yaml"],
)
def test_malformed_configmap_is_rejected_with_what_to_fix(
    tmp_path: Path, text: str, message: str
) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        settings.load(["--config", str(f)], {})


def test_every_setting_is_documented_in_help_and_readme() -> None:
    help_text = settings.parser().format_help()
    readme = README.read_text()
    for f in dataclasses.fields(settings.Settings):
        assert "--" + f.name.replace("_", "-") in help_text
        assert f"`{f.name}`" in readme, f"README lacks setting {f.name}"
