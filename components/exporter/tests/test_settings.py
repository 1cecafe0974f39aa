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
    f.write_text(
        "version: v1\nmetrics_bind_address: 0.0.0.0:9601\npoll_interval: 3\npods_source: none\n"
    )
    env = {
        "LJ_RUNTIMEKIT_EXPORTER_CONFIG": str(f),
        "LJ_RUNTIMEKIT_EXPORTER_METRICS_BIND_ADDRESS": ":9701",
        "LJ_RUNTIMEKIT_EXPORTER_POLL_INTERVAL": "2.5",
        "NODE_NAME": "node-a",
    }
    s = settings.load(["--metrics-bind-address", "127.0.0.1:9801"], env)
    assert s.metrics_address == ("127.0.0.1", 9801)
    assert settings.load([], env).metrics_address == ("0.0.0.0", 9701)
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
        ("version: v1\nrpc_timeout: .inf\n", "rpc_timeout inf: expected a finite number"),
        ('version: v1\nnode_name: "a\\0b"\n', "node_name .* NUL"),
        (b"version: v1\nnode_name: \xff\n", "not UTF-8"),
        ("- a\n", "expected a mapping"),
        ("version: [\n", "not valid YAML"),
    ],
    ids=[
        "bad-version",
        "no-version",
        "unknown-key",
        "bad-int",
        "bad-enum",
        "zero",
        "inf",
        "nul",
        "non-utf8",
        "list",
        "yaml",
    ],
)
def test_malformed_configmap_is_rejected_with_what_to_fix(
    tmp_path: Path, text: str | bytes, message: str
) -> None:
    # inf, NUL and non-UTF-8 went through before the shared loader (v1.13): an infinite
    # rpc_timeout made a stuck Runtime call wait forever
    f = tmp_path / "c.yaml"
    f.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        settings.load(["--config", str(f)], {})


def test_old_spellings_still_work_and_say_what_replaces_them(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("version: v1\nport: 9601\nlog_format: console\n")
    env = {"LJ_RUNTIMEKIT_EXPORTER_LISTEN_ADDRESS": "127.0.0.1", "NODE_NAME": "n"}
    s, notes = settings.load_noting(["--config", str(f)], env)
    assert s.metrics_address == ("127.0.0.1", 9601)
    assert s.log_format == "text"
    assert any("key port is deprecated: use key metrics_bind_address" in n for n in notes), notes
    assert any("LISTEN_ADDRESS is deprecated: use" in n for n in notes), notes
    assert any("log_format=console is deprecated" in n for n in notes), notes
    argv = ["--port", "9801", "--metrics-bind-address", "127.0.0.2:1"]
    s, notes = settings.load_noting(argv, {"NODE_NAME": "n"})
    assert s.metrics_address == ("127.0.0.2", 9801)  # the old part applied over the new whole
    assert notes == [
        "flag --port is deprecated: use --metrics-bind-address (the old spelling goes in v1.15.0)"
    ]


def test_every_setting_is_documented_in_help_and_readme() -> None:
    help_text = settings.parser().format_help()
    readme = README.read_text()
    for f in dataclasses.fields(settings.Settings):
        assert "--" + f.name.replace("_", "-") in help_text
        assert f"`{f.name}`" in readme, f"README lacks setting {f.name}"
