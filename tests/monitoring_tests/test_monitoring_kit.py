"""The monitoring kit as shipped: every daemon's metrics behind a Service, the scrape config and
ServiceMonitor keep the exporter's labels, the rules pass promtool and its unit tests, rules and
dashboard ask only for metrics the daemons expose, the copies agree with their sources, and the
chart renders the same objects into the release namespace."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from lj_runtimekit_controller.metrics import Metrics as ControllerMetrics
from lj_runtimekit_device_plugin.metrics import PluginMetrics
from lj_runtimekit_exporter import naming
from lj_runtimekit_scheduler.metrics import Metrics as SchedulerMetrics
from lj_runtimekit_testkit.manifests import CHART, DEPLOY, FOLDERS, Obj, load_objects, tool_dir

from .sync_kit import DASHBOARD, DASHBOARD_KEY, KIT, RULES, expected

WORKLOAD_FILES = {
    "device-plugin": "03-daemonset.yaml",
    "exporter": "03-daemonset.yaml",
    "scheduler": "03-deployment.yaml",
    "controller": "03-deployment.yaml",
}
PROMETHEUS_OWN = {"up", "ALERTS"}


def _sample_names(registry: CollectorRegistry) -> set[str]:
    """What a registry's families put on /metrics (labelled families included before their
    first child exists), as client_python names the samples."""
    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_sum", "_count", "_created"),
        "gauge": ("",),
    }
    return {f.name + s for f in registry.collect() for s in suffixes[f.type]}


def exposed_names() -> set[str]:
    names = {m.exposed for m in naming.ALL}
    for registry in (
        PluginMetrics().registry,
        SchedulerMetrics().registry,
        ControllerMetrics().registry,
    ):
        names |= _sample_names(registry)
    return names


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return doc


def panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title / refId, PromQL) of every panel target and template variable."""
    out = [(f"{p['title']}/{t['refId']}", t["expr"]) for p in panels() for t in p["targets"]]
    for v in dashboard()["templating"]["list"]:
        if v["type"] == "query":
            out.append((f"variable {v['name']}", v["query"]["query"]))
    return out


def metric_names(promql: str) -> set[str]:
    # Every metric of the suite starts with lj_ and no label or function does.
    return set(re.findall(r"\blj_[a-z0-9_]+", promql))


def service(component: str) -> Obj:
    (svc,) = load_objects([DEPLOY / FOLDERS[component] / "04-service.yaml"])
    return svc


def workload(component: str) -> Obj:
    objs = load_objects([DEPLOY / FOLDERS[component] / WORKLOAD_FILES[component]])
    (obj,) = [o for o in objs if o["kind"] in ("DaemonSet", "Deployment")]
    return obj


# --------------------------------------------------------------------------- Services


@pytest.mark.parametrize("component", list(FOLDERS), ids=list(FOLDERS))
def test_every_daemon_has_a_headless_metrics_service_that_selects_its_pods(component: str) -> None:
    svc, wl = service(component), workload(component)
    name = f"lj-runtimekit-{component}"
    assert (svc["kind"], svc["metadata"]["name"]) == ("Service", name)
    assert svc["metadata"]["namespace"] == wl["metadata"]["namespace"] == "kube-system"
    assert svc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "lj-runtimekit"
    # headless: every pod (every node, every replica) is its own target
    assert svc["spec"]["clusterIP"] == "None"
    labels = wl["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
    (container,) = wl["spec"]["template"]["spec"]["containers"]
    (port,) = [p for p in container["ports"] if p["name"] == "metrics"]
    (sport,) = svc["spec"]["ports"]
    assert (sport["name"], sport["port"], sport["targetPort"]) == (
        "metrics",
        port["containerPort"],
        "metrics",
    )
    assert svc["metadata"]["annotations"]["prometheus.io/port"] == str(port["containerPort"])


# --------------------------------------------------------------------------- scrape config


def test_the_scrape_config_keeps_the_exporters_pod_labels_and_finds_only_suite_services() -> None:
    (job,) = yaml.safe_load((KIT / "scrape-config.yaml").read_text())["scrape_configs"]
    assert job["honor_labels"] is True
    (sd,) = job["kubernetes_sd_configs"]
    assert sd["role"] == "endpointslice"
    keep = job["relabel_configs"][0]
    assert keep["action"] == "keep"
    assert keep["regex"] == "lj-runtimekit;metrics"
    # the job label is the Service's name, as a ServiceMonitor's
    assert {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job"} in job[
        "relabel_configs"
    ]


def test_the_servicemonitor_keeps_the_exporters_pod_labels_and_selects_every_service() -> None:
    (sm,) = load_objects([KIT / "servicemonitor.yaml"])
    assert sm["kind"] == "ServiceMonitor"
    (ep,) = sm["spec"]["endpoints"]
    assert ep["honorLabels"] is True
    assert ep["port"] == "metrics"
    for component in FOLDERS:
        svc = service(component)
        assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
        assert svc["metadata"]["namespace"] in sm["spec"]["namespaceSelector"]["matchNames"]


# --------------------------------------------------------------------------- rules


def test_promtool_checks_the_rules(promtool: Path) -> None:
    out = subprocess.run(
        [str(promtool), "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_promtool_unit_tests_of_the_rules_pass(promtool: Path) -> None:
    tests = KIT / "tests" / "rules_test.yaml"
    out = subprocess.run(
        [str(promtool), "test", "rules", tests.name],
        cwd=tests.parent,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_alert_has_a_unit_test_and_a_documented_answer() -> None:
    tests = (KIT / "tests" / "rules_test.yaml").read_text()
    doc = (DEPLOY.parent / "docs" / "monitoring.md").read_text()
    for rule in rules():
        assert f"alertname: {rule['alert']}" in tests, rule["alert"]
        assert f"`{rule['alert']}`" in doc, rule["alert"]
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}
        assert rule["annotations"]["summary"]
        assert rule["annotations"]["description"]


@pytest.mark.parametrize("rule", rules(), ids=[r["alert"] for r in rules()])
def test_alerts_ask_only_for_metrics_the_daemons_expose(rule: dict[str, Any]) -> None:
    names = metric_names(rule["expr"])
    unknown = names - exposed_names()
    assert not unknown, f"{rule['alert']} queries {sorted(unknown)}, which no daemon exposes"


# --------------------------------------------------------------------------- dashboard


@pytest.mark.parametrize("query", dashboard_queries(), ids=[t for t, _ in dashboard_queries()])
def test_dashboard_asks_only_for_metrics_the_daemons_expose(query: tuple[str, str]) -> None:
    title, promql = query
    unknown = metric_names(promql) - exposed_names()
    assert not unknown, f"{title} queries {sorted(unknown)}, which no daemon exposes"


def test_dashboard_drills_down_from_node_to_device_to_namespace_to_pod() -> None:
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    chain = ["node", "device", "namespace", "pod"]
    for i, name in enumerate(chain):
        query = variables[name]["query"]["query"]
        assert query.startswith("label_values("), query
        assert query.endswith(f", {name})"), query
        # each level narrows to the choices above it
        for above in chain[:i]:
            assert f'{above}=~"${above}"' in query, (name, above)
        assert variables[name]["includeAll"]
        assert variables[name]["allValue"] == ".*"
    pod_panels = [p for p in panels() if any("$pod" in t["expr"] for t in p["targets"])]
    assert pod_panels, "no panel shows the chosen pods"


def test_dashboard_panels_are_unique_and_use_the_chosen_datasource() -> None:
    ids = [p["id"] for p in dashboard()["panels"]]
    assert len(ids) == len(set(ids))
    for p in panels():
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"], p["title"]
        assert p["description"], p["title"]
    sections = [p["title"] for p in dashboard()["panels"] if p["type"] == "row"]
    assert sections[0] == "Cluster"
    assert {"Scheduler", "Controller", "Device plugin"} <= set(sections)


# --------------------------------------------------------------------------- copies and chart


@pytest.mark.parametrize("path", list(expected()), ids=[p.name for p in expected()])
def test_generated_copies_match_their_sources(path: Path) -> None:
    assert path.is_file(), path
    assert path.read_text() == expected()[path], (
        f"{path} is out of date: run `.venv/bin/python tests/monitoring_tests/sync_kit.py`"
    )


def test_raw_copies_load_as_their_sources() -> None:
    (rule,) = load_objects([KIT / "prometheusrule.yaml"])
    assert rule["spec"] == yaml.safe_load(RULES.read_text())
    (cm,) = load_objects([KIT / "grafana-dashboard-configmap.yaml"])
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"][DASHBOARD_KEY]) == dashboard()


def helm_template(*sets: str, namespace: str = "gpu-system") -> list[Obj]:
    args = [str(tool_dir() / "helm"), "template", "lj-runtimekit", str(CHART), "-n", namespace]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, check=True, capture_output=True, text=True, timeout=120).stdout
    return [d for d in yaml.safe_load_all(out) if d]


MONITORING_KINDS = {"ServiceMonitor", "PrometheusRule"}


def test_chart_renders_the_services_always_and_operator_objects_only_when_enabled() -> None:
    objs = helm_template()
    services = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Service"}
    assert sorted(services) == sorted(f"lj-runtimekit-{c}" for c in FOLDERS)
    for component in FOLDERS:
        svc = services[f"lj-runtimekit-{component}"]
        assert svc["metadata"]["namespace"] == "gpu-system"
        raw = service(component)
        assert svc["spec"] == raw["spec"]
    assert not [o for o in objs if o["kind"] in MONITORING_KINDS]
    assert "lj-runtimekit-dashboard" not in {o["metadata"]["name"] for o in objs}


def test_chart_monitoring_objects_equal_the_raw_ones_in_the_release_namespace() -> None:
    objs = helm_template(
        "monitoring.serviceMonitor.enabled=true",
        "monitoring.serviceMonitor.interval=15s",
        "monitoring.serviceMonitor.labels.release=kps",
        "monitoring.prometheusRule.enabled=true",
        "monitoring.prometheusRule.labels.release=kps",
        "monitoring.grafanaDashboard.enabled=true",
    )
    by_kind = {o["kind"]: o for o in objs if o["kind"] in MONITORING_KINDS}
    (raw_sm,) = load_objects([KIT / "servicemonitor.yaml"])
    sm = by_kind["ServiceMonitor"]
    assert sm["metadata"]["namespace"] == "gpu-system"
    assert sm["metadata"]["labels"]["release"] == "kps"
    assert sm["spec"]["namespaceSelector"] == {"matchNames": ["gpu-system"]}
    assert sm["spec"]["endpoints"] == [{**raw_sm["spec"]["endpoints"][0], "interval": "15s"}]
    # the raw selector, narrowed to this release
    assert sm["spec"]["selector"]["matchLabels"] == {
        **raw_sm["spec"]["selector"]["matchLabels"],
        "app.kubernetes.io/instance": "lj-runtimekit",
    }
    services = [o for o in objs if o["kind"] == "Service"]
    for svc in services:
        assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    rule = by_kind["PrometheusRule"]
    assert rule["metadata"]["labels"]["release"] == "kps"
    assert rule["spec"] == yaml.safe_load(RULES.read_text())
    (cm,) = [o for o in objs if o["metadata"]["name"] == "lj-runtimekit-dashboard"]
    assert cm["metadata"]["namespace"] == "gpu-system"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"][DASHBOARD_KEY]) == dashboard()
