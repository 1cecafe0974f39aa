"""containerd config files as operators really leave them (issue 19): encodings, CRLF, comments,
symlinks, an operator's own handler — attacked with hypothesis. The edit is exact or refused with
a clear error naming the file, never a crash, a half-written file or a lost byte."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lj_runtimekit_job_agent import app, host, result
from lj_runtimekit_job_agent import containerd_config as cc
from lj_runtimekit_job_agent import settings as agent_settings
from lj_runtimekit_job_agent.errors import ConfigError

SAMPLES = Path(__file__).parent / "samples"
GOOD = ["v1-legacy", "v2-nvidia", "v2-plain", "v3-nvidia", "v3-default", "v4-containerd2.4-default"]
FAST = settings(max_examples=60, deadline=2000, suppress_health_check=[HealthCheck.too_slow])


def sample(name: str) -> str:
    return (SAMPLES / f"{name}.toml").read_text()


def crlf(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\n", "\r\n")


comments = st.text(
    st.characters(blacklist_categories=["Cc", "Cs"], blacklist_characters="\n\r"), max_size=30
)


@FAST
@given(
    name=st.sampled_from(GOOD),
    line_endings=st.sampled_from(["lf", "crlf"]),
    bom=st.booleans(),
    comment=comments,
    final_newline=st.booleans(),
)
def test_enable_disable_is_exact_whatever_the_formatting(
    name: str, line_endings: str, bom: bool, comment: str, final_newline: bool
) -> None:
    text = f"# {comment}\n" + sample(name)
    if not final_newline:
        text = text.rstrip("\n")
    if line_endings == "crlf":
        text = crlf(text)
    if bom:
        text = "\ufeff" + text
    enabled = cc.with_handler(text)
    assert cc.handler_in(cc.parse(enabled)) == cc.Handler().as_table()
    assert cc.with_handler(enabled) == enabled, "idempotent"
    assert cc.without_handler(enabled) == text, "disable gives back every byte"
    assert enabled.startswith("\ufeff") == bom
    if line_endings == "crlf":
        assert "\n" not in enabled.replace("\r\n", ""), "no bare LF in a CRLF file"


@FAST
@given(st.text(max_size=300))
def test_any_text_is_edited_or_refused_never_crashes(text: str) -> None:
    try:
        enabled = cc.with_handler(text)
    except cc.MalformedConfig:
        return  # refused, with the parser's reason (the only exception allowed out)
    assert cc.handler_in(cc.parse(enabled)) == cc.Handler().as_table()


async def run(argv: list[str]) -> tuple[int, dict[str, Any]]:
    code, outcome = await app.run_async(agent_settings.load(argv, environ={}))
    data: dict[str, Any] = json.loads(outcome.to_json())
    return code, data


@pytest.mark.parametrize(
    "raw",
    [
        sample("v2-nvidia").encode("utf-16"),
        b"version = 2\n# caf\xe9 latin-1\n",
        b"\xff\xfe\x00garbage",
    ],
    ids=["utf-16", "latin-1", "binary"],
)
async def test_a_config_that_is_not_utf8_is_refused_naming_the_file(node: Any, raw: bytes) -> None:
    node.config.write_bytes(raw)
    code, res = await run(node.argv("enable"))
    assert code == result.EXIT_CONFIG_REFUSED, res
    assert str(node.config).removeprefix(str(node.root)) in res["message"]
    assert "UTF-8" in res["message"]
    assert node.config.read_bytes() == raw, "left untouched"
    assert node.restart_count() == 0


async def test_a_symlinked_config_is_edited_at_its_target_and_stays_a_link(node: Any) -> None:
    real = node.root / "etc/containerd/managed/config.toml"
    real.parent.mkdir()
    real.write_text(sample("v2-nvidia"))
    node.config.symlink_to("/etc/containerd/managed/config.toml")  # absolute, as on the host
    code, res = await run(node.argv("enable"))
    assert code == result.EXIT_OK, res
    assert node.config.is_symlink()
    assert cc.handler_in(cc.parse(real.read_text())) is not None
    code, res = await run(node.argv("disable"))
    assert code == result.EXIT_OK, res
    assert node.config.is_symlink()
    assert real.read_text() == sample("v2-nvidia")


async def test_mode_and_owner_of_the_config_are_kept(node: Any) -> None:
    node.config.write_text(sample("v3-nvidia"))
    node.config.chmod(0o600)
    os.chown(node.config, 1234, 5678)
    code, res = await run(node.argv("enable"))
    assert code == result.EXIT_OK, res
    st_ = node.config.stat()
    assert (st_.st_mode & 0o7777, st_.st_uid, st_.st_gid) == (0o600, 1234, 5678)
    backup = node.config.with_name("config.toml.lj-runtimekit.bak").stat()
    assert (backup.st_mode & 0o7777, backup.st_uid, backup.st_gid) == (0o600, 1234, 5678)


async def test_a_crlf_bom_config_round_trips_through_the_agent(node: Any) -> None:
    original = ("\ufeff" + crlf(sample("v3-default"))).encode()
    node.config.write_bytes(original)
    code, res = await run(node.argv("enable"))
    assert code == result.EXIT_OK, res
    code, res = await run(node.argv("disable"))
    assert code == result.EXIT_OK, res
    assert node.config.read_bytes() == original


async def test_the_backup_is_never_overwritten_with_ours(node: Any) -> None:
    node.config.write_text(sample("v2-nvidia"))
    await run(node.argv("enable"))
    backup = node.config.with_name("config.toml.lj-runtimekit.bak")
    assert backup.read_text() == sample("v2-nvidia")
    await run(node.argv("enable", "--systemd-cgroup=true"))  # ours rewritten
    assert backup.read_text() == sample("v2-nvidia")


def test_a_dangling_absolute_link_is_resolved_under_the_host_root(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    link = tmp_path / "etc/config.toml"
    link.symlink_to("/etc/real.toml")
    host.write_atomic(host.resolve(str(tmp_path), link), "version = 2\n")
    assert link.is_symlink()
    assert (tmp_path / "etc/real.toml").read_text() == "version = 2\n"


@FAST
@given(
    env=st.dictionaries(
        st.sampled_from(sorted(agent_settings.FIELDS)).map(
            lambda n: agent_settings.ENV_PREFIX + n.upper()
        ),
        st.text(max_size=12) | st.sampled_from(["nan", "inf", "-1", "0", "1e9", "yes", ""]),
        max_size=4,
    )
)
def test_any_environment_gives_settings_or_an_error_naming_the_variable(
    env: dict[str, str],
) -> None:
    try:
        loaded = agent_settings.load(["enable"], environ=env)
    except ConfigError as e:
        error = str(e)
    else:
        assert loaded.restart_timeout < float("inf")
        assert loaded.rpc_timeout < float("inf")
        return
    named = [k.removeprefix(agent_settings.ENV_PREFIX).lower() for k in env]
    assert any(k in error for k in env) or any(n in error for n in named), error


async def test_an_unexpected_error_still_writes_a_result(
    node: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    node.config.write_text(sample("v2-nvidia"))

    def broken(*_: Any, **__: Any) -> str:
        raise RecursionError("a bug or an input nobody foresaw")

    monkeypatch.setattr(cc, "with_handler", broken)
    code, res = await run(node.argv("enable"))
    assert (code, res["reason"]) == (result.EXIT_FAILED, "InternalError")
    assert "RecursionError" in res["message"]
    assert node.config.read_text() == sample("v2-nvidia")
