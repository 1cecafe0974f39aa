"""The operator's settings in the shared shape (docs/shape.md): flag > environment > file >
default, each refusal a clear message and exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from lj_runtimekit_operator import settings
from lj_runtimekit_operator.errors import ConfigError


def test_defaults() -> None:
    s = settings.load([], {"POD_NAME": "op-0"})
    assert (s.rollout_deadline, s.progress_interval, s.resync_period) == (300.0, 2.0, 300.0)
    assert s.identity == "op-0"
    assert s.metrics_bind_address == "0.0.0.0:9504"
    assert s.leader_elect
    assert s.leader_elect_resource_name == "lj-runtimekit-operator"
    assert (s.kube_api_qps, s.kube_api_burst) == (20.0, 40)


def test_flag_over_environment_over_file(tmp_path: Path) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text("version: v1\nrollout_deadline: 120\nprogress_interval: 5\nresync_period: 60\n")
    env = {"LJ_RUNTIMEKIT_OPERATOR_PROGRESS_INTERVAL": "4"}
    s = settings.load([f"--config={cfg}", "--resync-period=30"], env)
    assert (s.rollout_deadline, s.progress_interval, s.resync_period) == (120.0, 4.0, 30.0)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rollout-deadline=0"], "rollout_deadline 0.0: expected a positive finite number"),
        (["--progress-interval=-1"], "progress_interval -1.0: expected a positive finite number"),
        (["--leader-elect-renew-deadline=20"], "leader_elect_renew_deadline must be shorter"),
    ],
    ids=["deadline", "interval", "renew"],
)
def test_a_bad_value_is_refused_naming_it(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as e:
        settings.load(argv, {})
    assert message in str(e.value)


def test_bad_settings_exit_2_with_the_reason() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "lj_runtimekit_operator", "--rollout-deadline=inf"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2
    assert out.stderr.startswith("lj-runtimekit-operator: ")
    assert "rollout_deadline" in out.stderr
