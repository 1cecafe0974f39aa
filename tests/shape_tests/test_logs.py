"""``logs.configure(level, log_format)``: the ``--log-format`` value picks the renderer."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

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


def test_json_writes_one_json_object_per_event(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure("info", "json")
    record = json.loads(emit(capsys))
    assert (record["event"], record["key"], record["level"]) == ("format_checked", "value", "info")


def test_text_writes_a_readable_line(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure("info", "text")
    line = emit(capsys)
    assert "format_checked" in line
    assert "value" in line
    with pytest.raises(json.JSONDecodeError):
        json.loads(line)


def test_auto_is_json_when_stderr_is_no_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure("info", "auto")  # captured stderr is no terminal, as in a pod
    assert json.loads(emit(capsys))["event"] == "format_checked"


def test_the_level_filters(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure("warning", "json")
    assert emit(capsys) == ""


# The spellings of the old tri-state argument (None, True, False) are refused too: every app.py
# passes the --log-format value.
@pytest.mark.parametrize("spelling", ["console", "JSON", "", None, True, False])
def test_an_unknown_format_is_refused(spelling: Any) -> None:
    with pytest.raises(ValueError, match="expected auto, text or json"):
        logs.configure("info", spelling)
