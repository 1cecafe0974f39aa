"""The shared settings loader: one precedence, one type rule, one boolean rule, clear errors."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.shape_tests.canonical import cli, config

PREFIX = "LJ_RUNTIMEKIT_TEST_"
OLD = (
    cli.Deprecated("listen_address", "metrics_bind_address", part="host", until="v1.15.0"),
    cli.Deprecated("port", "metrics_bind_address", kind="int", part="port", until="v1.15.0"),
    cli.Deprecated("waiting", "wait", kind="bool", until="v1.15.0"),
)


@dataclass(frozen=True)
class Settings:
    name: str = cli.setting("A name.", "x")
    count: int = cli.setting("A count.", 1)
    ratio: float = cli.setting("A ratio.", 0.5)
    wait: bool = cli.setting("Wait.", False)
    mode: str = cli.setting("A mode.", "a", choices=("a", "b"))
    leader_elect: bool = cli.leader_elect()
    metrics_bind_address: str = cli.metrics_bind_address("0.0.0.0:9500")
    log_format: str = cli.log_format()

    def __post_init__(self) -> None:
        config.validate(self)


def load(argv: list[str], env: dict[str, str] | None = None) -> tuple[Settings, list[str]]:
    import dataclasses

    p = cli.parser("t", "test", dataclasses.fields(Settings), env_prefix=PREFIX, version="1",
                   deprecated=OLD)  # fmt: skip
    values, notes = config.load(
        Settings, flags=vars(p.parse_args(argv)), environ=env or {}, env_prefix=PREFIX,
        deprecated=OLD,
    )  # fmt: skip
    return Settings(**values), notes


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return str(path)


def test_flag_beats_environment_beats_file_beats_default(tmp_path: Path) -> None:
    f = write(tmp_path, "version: v1\ncount: 3\nratio: 2\nname: file\n")
    env = {PREFIX + "COUNT": "4", PREFIX + "CONFIG": f, PREFIX + "NAME": "env"}
    s, _ = load(["--count", "5"], env)
    assert (s.count, s.ratio, s.name, s.mode) == (5, 2.0, "env", "a")


@pytest.mark.parametrize(
    ("argv", "yaml_value", "expected"),
    [
        (["--leader-elect"], None, True),
        (["--leader-elect=false"], None, False),
        (["--leader-elect", "false"], None, False),
        ([], "false", False),
        ([], "True", True),
    ],
    ids=["bare", "equals-false", "space-false", "yaml-false", "yaml-True"],
)
def test_booleans_the_kubernetes_way(
    tmp_path: Path, argv: list[str], yaml_value: str | None, expected: bool
) -> None:
    if yaml_value is not None:
        argv = [*argv, "--config", write(tmp_path, f"version: v1\nleader_elect: {yaml_value}\n")]
    assert load(argv)[0].leader_elect is expected


@pytest.mark.parametrize("spelling", ["yes", "on", "no", "off", "y"])
def test_yaml_1_1_booleans_are_not_booleans_anywhere(tmp_path: Path, spelling: str) -> None:
    # PyYAML's default reads `yes`/`on` as true in the file while the same text in a flag or the
    # environment was refused or read as a string: one spelling, one meaning, in every source
    f = write(tmp_path, f"version: v1\nwait: {spelling}\n")
    with pytest.raises(config.SettingsError, match=f"wait='{spelling}' is not a valid bool"):
        load(["--config", f])
    with pytest.raises(config.SettingsError, match=f"wait='{spelling}' is not a valid bool"):
        load([], {PREFIX + "WAIT": spelling})
    assert (
        load(["--config", write(tmp_path, f"version: v1\nname: {spelling}\n")])[0].name == spelling
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("version: v1\ncount: true\n", "count=True is not a valid int"),
        ("version: v1\ncount: 1.5\n", "count=1.5 is not a valid int"),
        ("version: v1\nratio: [1]\n", r"ratio=\[1\] is not a valid float"),
        ("version: v1\nname: null\n", "name=None is not a valid str"),
        ("version: v1\nname: {a: 1}\n", "is not a valid str"),
        ("version: v1\nratio: .inf\n", "ratio inf: expected a finite number"),
        ("version: v1\nmode: c\n", "mode 'c': expected one of"),
        ('version: v1\nname: "a\\0b"\n', "name 'a\\\\x00b': a NUL character"),
        ("version: v1\nmetrics_bind_address: x\n", "metrics_bind_address 'x': expected host:port"),
        ("version: v1\n7: a\nbogus: 1\n", r"unknown keys \['7', 'bogus'\]"),
        ("version: v2\n", "version 'v2' unknown"),
        ("[1, 2]\n", "expected a mapping"),
    ],
    ids=["bool-int", "float-int", "list", "null", "map", "inf", "choice", "nul", "address",
         "unknown-keys", "version", "not-a-map"],
)  # fmt: skip
def test_bad_values_are_named_with_key_and_value(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(config.SettingsError, match=message):
        load(["--config", write(tmp_path, text)])


def test_a_bad_environment_value_names_the_variable() -> None:
    with pytest.raises(config.SettingsError, match=f"environment {PREFIX}COUNT: count='x'"):
        load([], {PREFIX + "COUNT": "x"})
    with pytest.raises(config.SettingsError, match="flag --ratio: ratio='soon'"):
        load(["--ratio", "soon"])


def test_old_spellings_work_in_every_source_and_each_use_is_noted(tmp_path: Path) -> None:
    f = write(tmp_path, "version: v1\nport: 9600\nwaiting: true\nlog_format: console\n")
    s, notes = load(["--config", f, "--listen-address", "127.0.0.1"], {PREFIX + "PORT": "9700"})
    assert s.metrics_bind_address == "127.0.0.1:9700"
    assert s.wait is True
    assert s.log_format == "text"
    assert notes == [
        "log_format=console is deprecated: use log_format=text",
        f"config file {f}: key port is deprecated: use key metrics_bind_address (the old "
        "spelling goes in v1.15.0)",
        f"config file {f}: key waiting is deprecated: use key wait (the old spelling goes in "
        "v1.15.0)",
        f"environment {PREFIX}PORT is deprecated: use {PREFIX}METRICS_BIND_ADDRESS (the old "
        "spelling goes in v1.15.0)",
        "flag --listen-address is deprecated: use --metrics-bind-address (the old spelling goes "
        "in v1.15.0)",
    ]
    # the order of the notes is by source, then new keys before old ones
    assert load([])[1] == []


@pytest.mark.parametrize(
    ("address", "expected"),
    [(":9501", ("0.0.0.0", 9501)), ("127.0.0.1:0", ("127.0.0.1", 0)), ("[::1]:80", ("::1", 80))],
)
def test_bind_addresses(address: str, expected: tuple[str, int]) -> None:
    assert cli.bind_address(address) == expected
    assert cli.bind_address(cli.with_host(address, expected[0])) == expected


@pytest.mark.parametrize("address", ["9501", "host:", "h:70000", "h:-1", "h:1e3"])
def test_bad_bind_addresses_are_refused(address: str) -> None:
    with pytest.raises(ValueError, match="expected"):
        cli.bind_address(address)
