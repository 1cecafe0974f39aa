"""The work queue's dedup and the settings' precedence and errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from lj_runtimekit_controller import settings
from lj_runtimekit_controller.errors import ConfigError
from lj_runtimekit_controller.ratelimit import TokenBucket
from lj_runtimekit_controller.workqueue import WorkQueue


async def test_a_name_is_queued_once_and_never_in_two_workers() -> None:
    q = WorkQueue()
    q.add("a")
    q.add("a")
    assert len(q) == 1
    key = await q.get()
    q.add("a")  # changed while processing: queued again once done
    assert len(q) == 0
    q.done(key)
    assert len(q) == 1


def test_rate_limit_holds_the_burst_then_the_rate() -> None:
    clock = [0.0]
    rate = TokenBucket(qps=10, burst=3, clock=lambda: clock[0])
    assert [rate.reserve() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert rate.reserve() == pytest.approx(0.1)  # the fourth waits for the rate
    clock[0] += 0.2
    assert rate.reserve() == pytest.approx(0.0)


def test_flag_beats_env_beats_file(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("version: v1\njob_image: file\nconcurrency: 3\nretry_limit: 7\n")
    env = {"LJ_RUNTIMEKIT_CONTROLLER_CONCURRENCY": "4", "POD_NAME": "pod-1"}
    s = settings.load([f"--config={cfg}", "--job-image=flag"], env)
    assert (s.job_image, s.concurrency, s.retry_limit, s.identity) == ("flag", 4, 7, "pod-1")


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("version: v2\n", "version 'v2' unknown"),
        ("version: v1\nbogus: 1\n", "unknown keys"),
        ("version: v1\nconcurrency: many\n", "not a valid"),
        (": :\n", "not valid YAML"),
    ],
    ids=["version", "unknown-key", "bad-type", "bad-yaml"],
)
def test_bad_config_file_is_a_clear_error(tmp_path: Path, text: str, error: str) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    with pytest.raises(ConfigError, match=error):
        settings.load([f"--config={cfg}", "--job-image=x"], {})


def test_job_image_is_required() -> None:
    with pytest.raises(ConfigError, match="job_image is required"):
        settings.load([], {})
