"""The agent's command line after issue 21: the shared shape (docs/shape.md), and every v1.13
argument the controller's Job or an operator passes keeps its meaning exactly.

The controller builds the args in ``components/controller/.../job_spec.py`` as
``[action, --node-name=<node>, --socket-dir=<dir>, *shlex.split(--job-agent-args)]``, and its
admission policy (``deploy/controller/05-admission-policy.yaml``) pins that shape: the action
first, then ``--flag=value`` words only. The oracle below is v1.13's parser, reduced to what it
did with a command line, so the new loader is compared with the old one on any mix of old args.
"""

from __future__ import annotations

import argparse
import socket
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lj_runtimekit_job_agent import runtime, runtime_channel
from lj_runtimekit_job_agent import settings as agent_settings
from lj_runtimekit_job_agent.errors import ConfigError

FAST = settings(max_examples=80, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
#: Valid v1.13 values per flag (text as typed on a command line).
OLD_VALUES: dict[str, list[str]] = {
    "node-name": ["gpu-1", "node.example"],
    "socket-dir": ["/run/amp/eKitC/xdm/sockets", "/tmp/s"],
    "host-root": ["/", "/host"],
    "containerd-config": ["/etc/containerd/config.toml", "/etc/c.toml"],
    "new-config-version": ["2", "3", "4"],
    "systemd-cgroup": ["auto", "true", "false"],
    "container-annotations": ["xdm.amp.com*", "xdm.amp.com*,io.x/*"],
    "restart-command": ["", "systemctl restart containerd", "/bin/true"],
    "confirm-command": ["", "true"],
    "restart-marker": ["", "/etc/containerd/.pending"],
    "containerd-socket": ["", "/run/containerd/containerd.sock"],
    "restart-timeout": ["60", "5", "0.5"],
    "rpc-timeout": ["10", "2.5"],
    "termination-log": ["", "/dev/termination-log"],
    "log-level": ["debug", "info", "warning", "error"],
    "log-format": ["auto", "json"],
}


def v113(argv: list[str]) -> dict[str, Any]:
    """What v1.13's ``settings.load`` made of ``argv`` (no environment): its parser, reduced."""
    p = argparse.ArgumentParser(exit_on_error=False)
    p.add_argument("action", choices=("enable", "disable"))
    kinds = {"new-config-version": int, "restart-timeout": float, "rpc-timeout": float}
    for flag in OLD_VALUES:
        p.add_argument(f"--{flag}", dest=flag.replace("-", "_"), type=kinds.get(flag, str))
    p.add_argument("--dry-run", dest="dry_run", action="store_true", default=None)
    return {k: v for k, v in vars(p.parse_args(argv)).items() if v is not None}


def new(argv: list[str]) -> dict[str, Any]:
    loaded = agent_settings.load(argv, environ={})
    return {k: getattr(loaded, k) for k in v113(argv)}


@st.composite
def old_command_lines(draw: st.DrawFn) -> list[str]:
    flags = draw(st.lists(st.sampled_from(sorted(OLD_VALUES)), unique=True, max_size=6))
    words: list[list[str]] = []
    for flag in flags:
        value = draw(st.sampled_from(OLD_VALUES[flag]))
        if value and draw(st.booleans()):
            words.append([f"--{flag}", value])
        else:
            words.append([f"--{flag}={value}"])
    if draw(st.booleans()):
        words.append(["--dry-run"])
    words = draw(st.permutations(words))
    at = draw(st.integers(0, len(words)))
    action = draw(st.sampled_from(["enable", "disable"]))
    return (
        [w for group in words[:at] for w in group]
        + [action]
        + [w for group in words[at:] for w in group]
    )


@FAST
@given(old_command_lines())
def test_any_v113_command_line_means_what_it_meant(argv: list[str]) -> None:
    assert new(argv) == v113(argv), argv


@pytest.mark.parametrize(
    "argv",
    [
        # the controller's Job as job_spec.py builds it, with and without --job-agent-args
        ["enable", "--node-name=gpu-1", "--socket-dir=/run/amp/eKitC/xdm/sockets"],
        ["disable", "--node-name=gpu-1", "--socket-dir=/s", "--restart-command=", "--dry-run"],
        ["enable", "--node-name=gpu-1", "--socket-dir=/s", "--systemd-cgroup=true"],
        # an operator on a node: the switch before the action, as v1.13's store_true allowed
        ["--dry-run", "enable"],
        ["--dry-run", "disable", "--node-name=n"],
        ["--dry", "enable"],  # argparse's abbreviation, as before
        ["--dry-run", "--node-name", "n", "enable"],
    ],
)
def test_the_args_the_controller_and_operators_pass_keep_their_meaning(argv: list[str]) -> None:
    assert new(argv) == v113(argv)


@pytest.mark.parametrize(
    ("argv", "dry"),
    [
        (["enable", "--dry-run=false"], False),
        (["enable", "--dry-run", "false"], False),
        (["--dry-run=true", "enable"], True),
        (["--dry-run", "0", "enable"], False),
        (["enable"], False),
    ],
)
def test_dry_run_is_a_bool_flag_in_the_shared_way(argv: list[str], dry: bool) -> None:
    assert agent_settings.load(argv, environ={}).dry_run is dry


def test_log_format_console_is_text_with_a_note() -> None:
    loaded, notes = agent_settings.load_noting(["enable", "--log-format", "console"], environ={})
    assert loaded.log_format == "text"
    assert notes == ["log_format=console is deprecated: use log_format=text"]


@pytest.mark.parametrize(
    ("raw", "dry"), [("yes", True), ("On", True), ("YES", True), ("no", False), ("off", False)]
)
def test_v113_environment_booleans_still_read_with_a_note(raw: str, dry: bool) -> None:
    env = {"LJ_RUNTIMEKIT_JOB_AGENT_DRY_RUN": raw}
    loaded, notes = agent_settings.load_noting(["enable"], environ=env)
    assert loaded.dry_run is dry
    assert len(notes) == 1
    assert "LJ_RUNTIMEKIT_JOB_AGENT_DRY_RUN" in notes[0]
    assert "deprecated" in notes[0]


def test_an_empty_dry_run_variable_is_false_as_in_v113() -> None:
    env = {"LJ_RUNTIMEKIT_JOB_AGENT_DRY_RUN": ""}
    assert agent_settings.load(["enable"], environ=env).dry_run is False


def test_a_shared_boolean_spelling_has_no_note() -> None:
    env = {"LJ_RUNTIMEKIT_JOB_AGENT_DRY_RUN": "true"}
    loaded, notes = agent_settings.load_noting(["enable"], environ=env)
    assert (loaded.dry_run, notes) == (True, [])


def test_a_boolean_nobody_spelled_is_refused_naming_the_variable() -> None:
    with pytest.raises(ConfigError, match="LJ_RUNTIMEKIT_JOB_AGENT_DRY_RUN"):
        agent_settings.load(["enable"], environ={"LJ_RUNTIMEKIT_JOB_AGENT_DRY_RUN": "maybe"})


def test_flag_beats_environment_beats_file(tmp_path: Path) -> None:
    file = tmp_path / "agent.yaml"
    file.write_text("version: v1\nrpc_timeout: 3\nrestart_timeout: 7\nnode_name: from-file\n")
    env = {"LJ_RUNTIMEKIT_JOB_AGENT_RESTART_TIMEOUT": "8", "NODE_NAME": "downward"}
    loaded = agent_settings.load(["enable", f"--config={file}", "--rpc-timeout=4"], environ=env)
    assert (loaded.rpc_timeout, loaded.restart_timeout) == (4.0, 8.0)
    assert loaded.node_name == "from-file"


def test_an_unknown_file_key_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "agent.yaml"
    file.write_text("version: v1\nrpc_timeout: 3\nrestart_timout: 7\n")
    with pytest.raises(ConfigError, match="restart_timout"):
        agent_settings.load(["enable", f"--config={file}"], environ={})


def test_node_name_falls_back_to_node_name_then_the_hostname() -> None:
    assert agent_settings.load(["enable"], environ={"NODE_NAME": "n1"}).node_name == "n1"
    assert agent_settings.load(["enable"], environ={}).node_name == socket.gethostname()


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["enable", "--new-config-version=5"], "new_config_version"),
        (["enable", "--new-config-version=two"], "new-config-version"),
        (["enable", "--systemd-cgroup=maybe"], "systemd_cgroup"),
        (["enable", "--containerd-config=etc/c.toml"], "containerd_config"),
        (["enable", "--restart-marker=pending"], "restart_marker"),
        (["enable", "--restart-timeout=0"], "restart_timeout"),
        (["enable", "--rpc-timeout=inf"], "rpc_timeout"),
        (["enable", "--log-level=trace"], "log_level"),
    ],
)
def test_bad_values_are_refused_naming_the_setting(argv: list[str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        agent_settings.load(argv, environ={})


def test_help_shows_the_action_and_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        agent_settings.load(["--help"], environ={})
    assert done.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "{enable,disable,partition}" in out
    assert "3 Runtime unavailable, 4 containerd config refused" in out
    assert "7 live allocations on GPUs to change (partition), 8 layout refused" in out
    assert "--dry-run [BOOL]" in out


async def test_the_config_daemon_channel_reconnects_with_the_guides_backoff(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[tuple[str, Any]] = []
    real = grpc.aio.insecure_channel

    def spy(target: str, options: Any = None, *args: Any, **kwargs: Any) -> grpc.aio.Channel:
        opened.append((target, options))
        return real(target, options, *args, **kwargs)

    monkeypatch.setattr(grpc.aio, "insecure_channel", spy)
    (tmp_path / "config-daemon.sock").touch()  # present; no call is made
    async with runtime.ConfigDaemon(str(tmp_path), 1.0):
        pass
    assert opened == [(f"unix://{tmp_path}/config-daemon.sock", runtime_channel.CHANNEL_OPTIONS)]
