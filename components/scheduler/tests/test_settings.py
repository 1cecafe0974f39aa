"""The scheduler's settings in the shared shape (docs/shape.md): flag > environment > ConfigMap >
default, kube-scheduler's names and client defaults, v1.13's spellings as deprecated aliases."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from lj_runtimekit_scheduler import settings
from lj_runtimekit_scheduler.errors import ConfigError
from lj_runtimekit_scheduler.metrics import Metrics
from lj_runtimekit_scheduler.profile import build_profile
from lj_runtimekit_scheduler.state import ClusterState

PACKAGE = Path(settings.__file__).parent


def write(tmp_path: Path, text: str) -> str:
    f = tmp_path / "config.yaml"
    f.write_text(text)
    return str(f)


def test_defaults_name_the_scheduler_and_binpack() -> None:
    s = settings.load([], {})
    assert s.scheduler_name == "lj-runtimekit-scheduler"
    assert s.gpu_strategy == "binpack"
    assert [p.name for p in s.plugins][-1] == "DefaultBinder"


def test_defaults_are_kube_scheduler_s_where_the_concept_is_the_same() -> None:
    s = settings.load([], {})
    assert (s.kube_api_qps, s.kube_api_burst) == (50.0, 100)  # clientConnection
    assert (
        s.leader_elect,
        s.leader_elect_lease_duration,
        s.leader_elect_renew_deadline,
        s.leader_elect_retry_period,
        s.leader_elect_resource_namespace,
        s.leader_elect_resource_name,
    ) == (True, 15.0, 10.0, 2.0, "kube-system", "lj-runtimekit-scheduler")
    # no longer kube-scheduler's own (HTTPS) port 10259
    assert s.metrics_address == ("0.0.0.0", 9503)


def test_config_file_enables_disables_and_weights(tmp_path: Path) -> None:
    f = write(
        tmp_path,
        "version: v1\nscheduler_name: mine\ngpu_strategy: spread\nplugins:\n"
        "  - {name: GpuTopology, weight: 5}\n  - {name: NodeAffinity, enabled: false}\n",
    )
    s = settings.load(["--config", f], {})
    weights = {p.name: p.weight for p in s.plugins}
    assert s.scheduler_name == "mine"
    assert s.gpu_strategy == "spread"
    assert weights["GpuTopology"] == 5
    assert "NodeAffinity" not in weights


def test_plugins_and_topology_labels_also_come_as_yaml_text_from_a_flag() -> None:
    s = settings.load(
        ["--plugins", "[{name: GpuFit, weight: 7}]", "--topology-labels", "[zone, rack]"], {}
    )
    assert {p.name: p.weight for p in s.plugins}["GpuFit"] == 7
    assert s.topology_labels == ("zone", "rack")


def test_flag_beats_env_beats_file(tmp_path: Path) -> None:
    f = write(tmp_path, "version: v1\nscheduler_name: from-file\n")
    env = {"LJ_RUNTIMEKIT_SCHEDULER_SCHEDULER_NAME": "from-env"}
    assert settings.load(["--config", f], env).scheduler_name == "from-env"
    assert settings.load(["--config", f, "--scheduler-name", "flag"], env).scheduler_name == "flag"


def test_v1_13_configmap_keys_still_work_and_are_noted(tmp_path: Path) -> None:
    f = write(
        tmp_path,
        "version: v1\nschedulerName: old\ngpuStrategy: spread\nfeatureLabel: gpu\n"
        "topologyLabels: [zone]\ngangTimeoutSeconds: 5\nassumeTTLSeconds: 6\n"
        "confirmTimeoutSeconds: 7\n",
    )
    s, notes = settings.load_noting(["--config", f], {})
    assert (s.scheduler_name, s.gpu_strategy, s.feature_label, s.topology_labels) == (
        "old",
        "spread",
        "gpu",
        ("zone",),
    )
    assert (s.gang_timeout, s.assume_ttl, s.confirm_timeout) == (5.0, 6.0, 7.0)
    assert len(notes) == 7
    assert f"config file {f}: key gangTimeoutSeconds is deprecated: use key gang_timeout" in (
        " ".join(notes)
    )


def test_v1_13_flags_still_work_and_are_noted() -> None:
    s, notes = settings.load_noting(
        ["--no-leader-elect", "--namespace", "ops", "--metrics-port", "10259",
         "--qps", "500", "--burst", "600"], {},
    )  # fmt: skip
    assert s.leader_elect is False
    assert s.leader_elect_resource_namespace == "ops"
    assert s.metrics_bind_address == "0.0.0.0:10259"
    assert (s.kube_api_qps, s.kube_api_burst) == (500.0, 600)
    assert "flag --no-leader-elect is deprecated: use --leader-elect" in notes[0]
    assert len(notes) == 5


def test_an_old_switch_stays_a_switch() -> None:
    # v1.13's --no-leader-elect was a bare switch; now, as every boolean, it may take a value
    assert settings.load(["--no-leader-elect", "--kubeconfig", "k"], {}).leader_elect is False
    with pytest.raises(ConfigError, match="flag --no-leader-elect: no_leader_elect='extra'"):
        settings.load(["--no-leader-elect", "extra"], {})
    assert settings.load(["--leader-elect=false"], {}).leader_elect is False
    assert settings.load(["--leader-elect", "--no-leader-elect=false"], {}).leader_elect is True


@pytest.mark.parametrize(
    ("old", "key", "value"),
    [
        ("LJ_SCHEDULER_NAME", "scheduler_name", "old-env"),
        ("LJ_SCHEDULER_LOG_LEVEL", "log_level", "debug"),
        ("KUBECONFIG", "kubeconfig", "/etc/kube.conf"),
    ],
    ids=["name", "log-level", "kubeconfig"],
)
def test_v1_13_environment_names_still_work_and_the_new_one_wins(
    old: str, key: str, value: str
) -> None:
    s, notes = settings.load_noting([], {old: value})
    assert getattr(s, key) == value
    assert notes == [
        f"environment {old} is deprecated: use LJ_RUNTIMEKIT_SCHEDULER_{key.upper()} "
        "(the old name goes in v1.15.0)"
    ]
    new = settings.load([], {old: value, f"LJ_RUNTIMEKIT_SCHEDULER_{key.upper()}": "debug"})
    assert getattr(new, key) == "debug"


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ("version: v2\n", "version 'v2' unknown"),
        ("scheduler_name: x\n", "version None unknown"),
        ("version: v1\nbogus: 1\n", "unknown keys"),
        ("version: v1\ngpu_strategy: random\n", "expected one of \\['binpack', 'spread'\\]"),
        ("version: v1\nplugins:\n  - {name: GpuFit, weight: -1}\n", "non-negative"),
        ("version: v1\nplugins:\n  - {weight: 1}\n", "each plugin needs a name"),
        ("version: v1\nplugins: GpuFit\n", "plugins=.* is not a valid yaml"),
        ("version: v1\ntopology_labels: [1, 2]\n", "must be a list of label keys"),
        ("version: v1\ngang_timeout: 0\n", "gang_timeout 0.0: expected a positive number"),
        ("version: v1\nkube_api_burst: 0\n", "kube_api_burst 0: expected 1 or more"),
        ("- a\n", "mapping"),
        ("version: v1\nplugins: [\n", "is not valid YAML"),
    ],
    ids=[
        "v2",
        "no-version",
        "unknown-key",
        "strategy",
        "weight",
        "nameless-plugin",
        "plugins-not-a-list",
        "labels",
        "zero-timeout",
        "burst",
        "list",
        "yaml",
    ],
)
def test_bad_config_is_a_clear_error(tmp_path: Path, doc: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        settings.load(["--config", write(tmp_path, doc)], {})


def test_an_unknown_plugin_is_refused_where_the_profile_is_built(tmp_path: Path) -> None:
    s = settings.load(["--config", write(tmp_path, "version: v1\nplugins: [{name: Nope}]\n")], {})
    with pytest.raises(ConfigError, match="unknown plugin 'Nope'; known: \\['AllocateHandshake'"):
        build_profile(s, ClusterState(), Metrics())


def test_each_plugin_gets_its_own_arguments_from_the_profile_builder() -> None:
    s = settings.load(["--gpu-strategy", "spread", "--feature-label", "gpus"], {})
    profile = build_profile(s, ClusterState(), Metrics())
    by_name = {p.NAME: p for p in profile.filter}
    assert vars(by_name["GpuFit"])["strategy"] == "spread"
    assert vars(by_name["GpuFit"])["feature_label"] == "gpus"
    assert vars(by_name["NodeResourcesFit"])["most"] is False


def test_resource_names_are_read_under_the_device_plugin_s_keys(tmp_path: Path) -> None:
    f = write(
        tmp_path,
        "version: v1\nresource_gpu_core: example.com/vcore\nresource_ppu: example.com/npu\n",
    )
    names = settings.load(["--config", f], {}).resources
    assert names.all == (
        "aliyun.com/gpu",
        "example.com/vcore",
        "aliyun.com/gpu-memory",
        "example.com/npu",
    )


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("resource_gpu_core: vcore\n", "expected <domain>/<name>"),
        ("resource_gpu_core: aliyun.com/gpu\n", "resource names must differ"),
        ("resource_gpu_core: ''\n", "must be a non-empty string"),
    ],
    ids=["no-domain", "duplicate", "empty"],
)
def test_a_bad_resource_name_is_a_clear_error(tmp_path: Path, text: str, error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        settings.load(["--config", write(tmp_path, "version: v1\n" + text)], {})


def test_no_module_imports_inside_a_function() -> None:
    # v1.13's settings.py imported the plugin registry inside a function to dodge a circle
    # (settings → registry → plugins → settings): every import is at the top now
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for fn in ast.walk(ast.parse(path.read_text())):
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                found += [
                    f"{path.name}:{n.lineno}"
                    for n in ast.walk(fn)
                    if isinstance(n, ast.Import | ast.ImportFrom)
                ]
    assert not found


def test_settings_import_no_plugin() -> None:
    code = (
        "import sys, lj_runtimekit_scheduler.settings as s; "
        "print(sorted(m for m in sys.modules if 'plugins' in m or m.endswith('.framework')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert out.strip() == "[]"


def test_spread_defaults_are_kube_scheduler_s_system_or_a_list(tmp_path: Path) -> None:
    # PodTopologySpreadArgs: defaultingType System (the default) or List with
    # defaultConstraints, which name no labelSelector; System with constraints is refused
    assert settings.Settings().spread_defaulting == "System"
    doc = tmp_path / "c.yaml"
    doc.write_text(
        "version: v1\nspread_defaulting: List\nspread_default_constraints:\n"
        "  - {maxSkew: 1, topologyKey: topology.kubernetes.io/zone, "
        "whenUnsatisfiable: DoNotSchedule}\n"
    )
    s = settings.load(["--config", str(doc)], {})
    assert [(c.max_skew, c.topology_key, c.hard) for c in s.spread_default_constraints] == [
        (1, "topology.kubernetes.io/zone", True)
    ]
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "version: v1\nspread_defaulting: List\nspread_default_constraints:\n"
        "  - {maxSkew: 1, topologyKey: zone, whenUnsatisfiable: DoNotSchedule, "
        "labelSelector: {}}\n"
    )
    with pytest.raises(ConfigError, match="no labelSelector"):
        settings.load(["--config", str(bad)], {})
    system = tmp_path / "system.yaml"
    system.write_text(
        "version: v1\nspread_default_constraints:\n"
        "  - {maxSkew: 1, topologyKey: zone, whenUnsatisfiable: DoNotSchedule}\n"
    )
    with pytest.raises(ConfigError, match="only with spread_defaulting List"):
        settings.load(["--config", str(system)], {})
