"""Every refusal of `deploy-all.sh` says what is wrong and what to do, before it touches the
cluster; `--help` is the header comment and nothing else.

Run against a kubectl stand-in that records every call: a refusal must have made none.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from lj_runtimekit_testkit.manifests import DEPLOY

COMPONENTS = "device-plugin exporter scheduler controller"


@pytest.fixture
def calls(tmp_path: Path) -> Path:
    log = tmp_path / "calls"
    log.touch()
    kubectl = tmp_path / "kubectl"
    kubectl.write_text(f'#!/bin/sh\necho "$*" >> {log}\n')
    kubectl.chmod(0o755)
    return log


def run(calls: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(DEPLOY / "deploy-all.sh"), *args],
        env={
            **os.environ,
            "KUBECTL": str(calls.parent / "kubectl"),
            "LJ_RUNTIMEKIT_LOG_DIR": str(calls.parent / "logs"),
            **env,
        },
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_help_is_the_header_comment_without_the_code_after_it(calls: Path) -> None:
    for args in (["--help"], ["help"], ["deploy", "--help"]):
        done = run(calls, *args)
        assert done.returncode == 0
        assert done.stdout.startswith("Deploys or removes LJ RuntimeKit"), done.stdout[:80]
        assert "set -euo pipefail" not in done.stdout
        assert "--yes" in done.stdout
        assert "--purge" in done.stdout
        assert done.stdout.rstrip().endswith("removed only by `undeploy --purge`.")


@pytest.mark.parametrize(
    ("args", "env", "error", "hint"),
    [
        (
            ["deploy", "--components=devce-plugin"],
            {},
            "unknown component 'devce-plugin' in --components=devce-plugin",
            f"valid components: {COMPONENTS}",
        ),
        (
            ["undeploy", "--components=exporter,schedular"],
            {},
            "unknown component 'schedular'",
            f"valid components: {COMPONENTS}",
        ),
        (["deploy", "--components="], {}, "--components is empty", "name one or more of"),
        (["deplo"], {}, "unknown action 'deplo'", "use deploy, undeploy or verify"),
        (["deploy", "--yse"], {}, "unknown argument '--yse' for deploy", "--yes --purge"),
        (["deploy", "--purge"], {}, "--purge is an option of undeploy", "undeploy --purge"),
        (["deploy"], {"NODE_LABEL": "gpu"}, "NODE_LABEL='gpu' has no value", "NODE_LABEL=<key>="),
        (["deploy"], {"NODE_LABEL": "gpu="}, "NODE_LABEL value '' is not a valid", "<key>=<value>"),
        (["deploy"], {"NODE_LABEL": "my gpu=true"}, "key 'my gpu' is not a valid", "<key>="),
        (["deploy"], {"NODE_LABEL": "Bad.Prefix/gpu=true"}, "not a valid label key", "<key>="),
    ],
    ids=[
        "typo-component",
        "typo-second-component",
        "empty-components",
        "unknown-action",
        "unknown-option",
        "purge-on-deploy",
        "label-without-value",
        "label-empty-value",
        "label-key-with-space",
        "label-prefix-not-dns",
    ],
)
def test_a_refusal_says_what_is_wrong_and_what_to_do_and_touches_nothing(
    calls: Path, args: list[str], env: dict[str, str], error: str, hint: str
) -> None:
    done = run(calls, *args, **env)
    assert done.returncode == 1
    (error_line, hint_line) = done.stderr.splitlines()
    assert "[ERROR]" in error_line
    assert error in error_line
    assert "[HINT]" in hint_line
    assert hint in hint_line
    assert calls.read_text() == "", "refused before any kubectl call"


def test_the_scheduler_refuses_a_node_label_value_other_than_true_before_any_change(
    calls: Path,
) -> None:
    # The stand-in answers nothing, so preflight reads no server version: give it one.
    (calls.parent / "kubectl").write_text(
        f'#!/bin/sh\necho "$*" >> {calls}\n'
        'case "$*" in "version -o json") echo \'{"serverVersion": {"minor": "37"}}\';; esac\n'
    )
    done = run(calls, "deploy", NODE_LABEL="gpu=yes")
    assert done.returncode == 1
    assert 'the scheduler places pods only on nodes whose label gpu is "true"' in done.stdout
    assert "NODE_LABEL=gpu=true, or deploy without the scheduler" in done.stdout
    assert not [c for c in calls.read_text().splitlines() if c.startswith(("apply", "label"))]
