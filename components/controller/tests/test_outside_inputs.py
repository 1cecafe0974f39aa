"""What reaches the controller from outside (issue 19), attacked: node labels and annotations,
agent termination messages, its ConfigMap. No crash, no hang, bounded values, and success only
on the job agent's own result for the same action and node."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lj_runtimekit_controller import reconcile, status
from lj_runtimekit_controller import settings as controller_settings
from lj_runtimekit_controller.errors import ConfigError

FAST = settings(max_examples=80, deadline=1000, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=20,
)
STATUS_KEYS = ["action", "result", "time", "job", "jobUid", "attempt", "reason", "message"]
texts = st.one_of(
    st.text(max_size=200),
    json_values.map(json.dumps),
    st.dictionaries(st.sampled_from(STATUS_KEYS), json_values).map(json.dumps),
    st.fixed_dictionaries(
        {
            "action": st.sampled_from(["enable", "disable"]),
            "result": st.sampled_from(["succeeded", "failed"]),
            "attempt": st.one_of(st.integers(-(10**12), 10**12), st.floats()),
            "time": st.text(max_size=30),
        }
    ).map(lambda d: json.dumps(d, allow_nan=True)),
    st.integers(1, 50_000).map(lambda n: "[" * n),
)


@FAST
@given(texts, st.sampled_from(["enable", "disable"]), st.booleans())
def test_any_status_annotation_is_read_or_ignored_and_the_decision_is_quick(
    text: str, desired: str, retry: bool
) -> None:
    recorded = status.parse(text)
    if recorded is not None:
        assert 1 <= recorded.attempt <= status.MAX_ATTEMPT
    node = reconcile.NodeView("n", desired, recorded, retry)
    reconcile.decide(node, [], 0, reconcile.Policy(), now=1.8e9)


def test_a_forged_huge_attempt_does_not_hang_the_backoff() -> None:
    forged = json.dumps(
        {"action": "enable", "result": "failed", "attempt": 10**12, "time": "2026-01-01T00:00:00Z"}
    )
    assert status.parse(forged) is None
    assert reconcile.Policy().backoff(10**12) == reconcile.Policy().backoff_max_s


@FAST
@given(texts, st.booleans())
def test_any_termination_message_gives_an_outcome_and_success_only_from_the_agent(
    message: str, completed: bool
) -> None:
    ended = status.Ended("pod", message, "Completed", 0)
    out = status.outcome(
        job="j", namespace="ns", action="enable", node="n", completed=completed, ended=ended
    )
    assert len(out.message) <= 4 * status.MAX_MESSAGE
    assert len(out.reason) <= status.MAX_WORD
    if out.succeeded:
        result = status.agent_result(message)
        assert result is not None
        assert (result.action, result.node, result.succeeded) == ("enable", "n", True)


def test_a_deeply_nested_termination_message_is_no_agent_result() -> None:
    assert status.agent_result("[" * 100_000) is None
    assert status.parse("{" * 100_000) is None


@FAST
@given(
    doc=st.dictionaries(
        st.one_of(st.sampled_from(sorted(controller_settings.FIELDS)), st.text(max_size=8)),
        json_values,
        max_size=4,
    )
)
def test_any_configmap_gives_settings_or_a_config_error_naming_it(
    doc: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> None:
    path = tmp_path_factory.mktemp("cfg") / "config.yaml"
    path.write_text(json.dumps({"version": "v1", **doc}, allow_nan=True))
    try:
        controller_settings.load(["--job-image=a:b", "--config", str(path)], environ={})
    except ConfigError as e:
        error = str(e)
    else:
        return
    assert str(path) in error or any(str(k) in error for k in doc), "the error names the input"


@pytest.mark.parametrize("value", ["True", "TRUE", " true", "yes", "1", "", "true\n"])
def test_an_odd_enable_label_value_means_disable(value: str) -> None:
    # Label values are exact (Kubernetes compares them byte for byte, as nodeSelector does);
    # only label_value enables. The controller's README says so.
    node = reconcile.NodeView("n", "enable" if value == "true" else "disable", None)
    assert isinstance(reconcile.decide(node, [], 0, reconcile.Policy(), 0.0), reconcile.InSync)


def test_config_keys_that_are_not_strings_are_named(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("version: v1\n1: x\nnull: y\n")
    with pytest.raises(ConfigError, match=r"unknown keys \['1', 'None'\]"):
        controller_settings.load(["--job-image=a:b", "--config", str(path)], environ={})
