"""``logs.configure(level, log_format)``: the ``--log-format`` value picks the renderer."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest
import structlog

from tests.shape_tests.canonical import logs


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    # configure() binds structlog and the root logger to this test's captured stderr, which is
    # closed after it: later tests must not log into it
    handlers, level = list(logging.root.handlers), logging.root.level
    yield
    structlog.reset_defaults()
    logging.root.handlers[:] = handlers
    logging.root.setLevel(level)


def emit(capsys: pytest.CaptureFixture[str]) -> str:
    structlog.get_logger("shape").info("format_checked", key="value")
    return capsys.readouterr().err.strip()


@pytest.mark.parametrize("spelling", ["json", True], ids=["json", "old-true"])
def test_json_writes_one_json_object_per_event(
    spelling: str | bool, capsys: pytest.CaptureFixture[str]
) -> None:
    logs.configure("info", spelling)
    record = json.loads(emit(capsys))
    assert (record["event"], record["key"], record["level"]) == ("format_checked", "value", "info")


@pytest.mark.parametrize("spelling", ["text", False], ids=["text", "old-false"])
def test_text_writes_a_readable_line(
    spelling: str | bool, capsys: pytest.CaptureFixture[str]
) -> None:
    logs.configure("info", spelling)
    line = emit(capsys)
    assert "format_checked" in line
    assert "value" in line
    with pytest.raises(json.JSONDecodeError):
        json.loads(line)


@pytest.mark.parametrize("spelling", ["auto", None], ids=["auto", "old-none"])
def test_auto_is_json_when_stderr_is_no_terminal(
    spelling: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    logs.configure("info", spelling)  # captured stderr is no terminal, as in a pod
    assert json.loads(emit(capsys))["event"] == "format_checked"


def test_the_level_filters_and_an_unknown_format_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    logs.configure("warning", "json")
    assert emit(capsys) == ""
    with pytest.raises(ValueError, match="expected auto, text or json"):
        logs.configure("info", "console")
