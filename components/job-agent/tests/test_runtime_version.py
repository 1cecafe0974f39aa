"""The agent asks the Runtime's version before acting and refuses a feature the Runtime is too
old for (issue 22, item 3): the feature table, then the whole agent against the harness's
runtime simulator over its unix sockets."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import grpc
import pytest

from lj_runtimekit_job_agent import app, result, settings, versions
from lj_runtimekit_testkit.simulator.inventory_file import load_inventory

SAMPLES = Path(__file__).parent / "samples"


@pytest.mark.parametrize(
    ("runtime", "features", "expected"),
    [
        ("v1.13.0", ["sharing", "monitoring"], []),
        ("v1.14.2", ["sharing"], []),
        ("v1.12.9", ["sharing", "monitoring"], ["sharing", "monitoring"]),
        ("1.12.0", ["device-injection"], ["device-injection"]),
        ("v1.12.0-rc1", ["mig"], ["mig"]),
        ("v1.12.0", ["a-feature-the-table-does-not-know"], []),
        ("", ["sharing"], []),
        ("not-a-version", ["sharing"], []),
        ("v0.99.0", [], []),
    ],
    ids=[
        "at-minimum",
        "newer",
        "older",
        "without-v",
        "suffix",
        "unknown-feature",
        "empty-version",
        "unreadable-version",
        "no-feature",
    ],
)
def test_features_the_runtime_is_too_old_for(
    runtime: str, features: list[str], expected: list[str]
) -> None:
    assert [u.feature for u in versions.unmet(runtime, features)] == expected


def test_versions_compare_as_numbers_not_text() -> None:
    table = {"f": "v1.9.0"}
    assert versions.unmet("v1.10.0", ["f"], table) == []
    assert versions.unmet("v1.8.10", ["f"], table) == [versions.Unmet("f", "v1.9.0")]


def argv(root: Path, socket_dir: Path, action: str) -> list[str]:
    return [
        action,
        "--node-name=sim-node",
        f"--host-root={root}",
        f"--socket-dir={socket_dir}",
        "--restart-command=true",
        "--confirm-command=true",
        f"--termination-log={root / 'termination-log'}",
        "--rpc-timeout=2",
        "--containerd-socket=",
    ]


async def run(root: Path, socket_dir: Path, action: str) -> tuple[int, dict[str, Any]]:
    code, outcome = await app.run_async(settings.load(argv(root, socket_dir, action), environ={}))
    written = json.loads((root / "termination-log").read_text())
    assert written == json.loads(outcome.to_json())
    return code, written


def host(root: Path) -> Path:
    (root / "etc/containerd").mkdir(parents=True)
    config = root / "etc/containerd/config.toml"
    config.write_bytes((SAMPLES / "v2-nvidia.toml").read_bytes())
    return config


async def test_enable_under_a_runtime_older_than_its_features_is_refused_before_any_change(
    runtime_sim_factory: Any, tmp_path: Path
) -> None:
    old = dataclasses.replace(load_inventory("gpu-1x"), runtime_version="v1.12.3")
    sim = await runtime_sim_factory(inventory=old)
    config = host(tmp_path)
    before = config.read_bytes()
    code, res = await run(tmp_path, sim.socket_dir, "enable")
    assert code == result.EXIT_RUNTIME_TOO_OLD
    assert res["reason"] == "RuntimeTooOld"
    assert not res["succeeded"]
    assert "v1.12.3" in res["message"]
    assert "v1.13.0" in res["message"]
    assert res["runtime_version"] == "v1.12.3"
    assert res["driver_version"] == "550.54.15"
    assert sim.calls("GetVersion") == 1
    assert sim.calls("SetFeatures") == 0
    assert not sim.node.enabled
    assert config.read_bytes() == before


async def test_a_feature_newer_than_the_runtime_is_refused_naming_both_versions(
    runtime_sim_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        versions, "FEATURE_MINIMUM", {**versions.FEATURE_MINIMUM, "gang-topology": "v1.14.0"}
    )
    inv = load_inventory("gpu-1x")
    sim = await runtime_sim_factory(
        inventory=dataclasses.replace(inv, features=(*inv.features, "gang-topology"))
    )
    host(tmp_path)
    code, res = await run(tmp_path, sim.socket_dir, "enable")
    assert code == result.EXIT_RUNTIME_TOO_OLD
    assert "Runtime is v1.13.0" in res["message"]
    assert "gang-topology needs v1.14.0" in res["message"]
    assert not sim.node.enabled


async def test_enable_records_the_runtime_and_driver_versions_it_asked_for(
    runtime_sim_factory: Any, tmp_path: Path
) -> None:
    inv = dataclasses.replace(
        load_inventory("gpu-1x"), runtime_version="v1.14.1", driver_version="560.28.03"
    )
    sim = await runtime_sim_factory(inventory=inv)
    host(tmp_path)
    code, res = await run(tmp_path, sim.socket_dir, "enable")
    assert code == result.EXIT_OK, res
    assert res["runtime_version"] == "v1.14.1"
    assert res["driver_version"] == "560.28.03"
    assert sim.calls("GetVersion") == 1
    assert sim.node.enabled


async def test_disable_is_never_refused_for_the_runtimes_version(
    runtime_sim_factory: Any, tmp_path: Path
) -> None:
    old = dataclasses.replace(
        load_inventory("gpu-1x"), runtime_version="v1.12.0", features_enabled=True
    )
    sim = await runtime_sim_factory(inventory=old)
    host(tmp_path)
    code, res = await run(tmp_path, sim.socket_dir, "disable")
    assert code == result.EXIT_OK, res
    assert res["runtime_version"] == "v1.12.0"
    assert not sim.node.enabled


async def test_a_runtime_that_cannot_say_its_version_falls_back_to_the_config_daemons(
    runtime_sim_factory: Any, tmp_path: Path
) -> None:
    old = dataclasses.replace(load_inventory("gpu-1x"), runtime_version="v1.12.0")
    sim = await runtime_sim_factory(inventory=old)
    sim.fail("GetVersion", grpc.StatusCode.UNIMPLEMENTED)
    host(tmp_path)
    code, res = await run(tmp_path, sim.socket_dir, "enable")
    # GetFeatureState says v1.12.0 too: still refused, and the result says which version
    assert code == result.EXIT_RUNTIME_TOO_OLD
    assert res["runtime_version"] == "v1.12.0"
    assert res["driver_version"] == ""


async def test_a_later_failure_still_records_the_runtime_version(
    runtime_sim_factory: Any, tmp_path: Path
) -> None:
    sim = await runtime_sim_factory(inventory="gpu-1x")
    sim.fail("ConfigService.SetFeatures", grpc.StatusCode.INTERNAL)
    host(tmp_path)
    code, res = await run(tmp_path, sim.socket_dir, "enable")
    assert code == result.EXIT_FAILED
    assert res["runtime_version"] == "v1.13.0"
    assert res["driver_version"] == "550.54.15"
