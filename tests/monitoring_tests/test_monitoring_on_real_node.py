"""The monitoring kit against the suite deployed from its images on a real node: a real
Prometheus, started with the shipped scrape config and rule file, finds every daemon through the
apiserver (Kubernetes service discovery, EndpointSlices of the shipped Services), keeps the
exporter's pod labels, evaluates the rules, fires LJRuntimeKitDeviceUnhealthy when the Runtime
marks a device unhealthy, and answers every query of the dashboard with data.

Prometheus runs as this test's child in the node's network namespace only (its files are the
host's): there it reaches the node's host-network ports, the pod addresses of the scheduler and
the controller, and the apiserver on the bridge — as an in-cluster Prometheus would. The tests of
this module run in order, each from the state the previous one left."""

from __future__ import annotations

import functools
import json
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from lj_runtimekit_testkit.cluster.kubeconfig import write_kubeconfig
from lj_runtimekit_testkit.node import RealNode
from lj_runtimekit_testkit.suite import (
    LAST_ACTION,
    simulator_control,
    wait_for,
    workload,
)

from ..guide_tests.conftest import RealCluster, real_cluster  # noqa: F401  (the fixture)
from .sync_kit import DASHBOARD, KIT, RULES

pytestmark = [pytest.mark.realnode, pytest.mark.images, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
WORK_NS = "monitoring"
PROMETHEUS_PORT = 19090
UNHEALTHY = "gpu-7"
SHARERS = ("share-a", "share-b")
JOBS = {  # job → targets: one per node for node agents, one per replica otherwise
    "lj-runtimekit-device-plugin": 1,
    "lj-runtimekit-exporter": 1,
    "lj-runtimekit-scheduler": 2,
    "lj-runtimekit-controller": 1,
}
# What Grafana puts for its variables when "All" is chosen, and for its interval macros.
GRAFANA_MACROS = {
    "$__rate_interval": "1m",
    "$__range": "10m",
    "$__interval": "15s",
    "$node": ".*",
    "$device": ".*",
    "$namespace": ".*",
    "$pod": ".*",
}


class Prometheus:
    """Upstream Prometheus in the node's network namespace, with the kit's config."""

    def __init__(self, binary: Path, node: RealNode, config: Path, workdir: Path) -> None:
        self.url = f"http://{node.ip}:{PROMETHEUS_PORT}"
        self.log = (workdir / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            [
                "nsenter",
                f"--net=/proc/{node.pid}/ns/net",
                "--",
                str(binary),
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=0.0.0.0:{PROMETHEUS_PORT}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def get(self, path: str, **params: str) -> Any:
        url = self.url + path + ("?" + urllib.parse.urlencode(params) if params else "")
        with urllib.request.urlopen(url, timeout=10) as r:
            body = r.read()
        doc = json.loads(body)
        assert doc["status"] == "success", doc
        return doc["data"]

    def query(self, promql: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.get("/api/v1/query", query=promql)["result"]
        return result

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited {self.proc.returncode}: {self.log_tail()}")
        try:
            with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def log_tail(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def prometheus_config(kubeconfig: Path) -> dict[str, Any]:
    """The shipped scrape job and rule file as an operator merges them into prometheus.yml; the
    only additions are how an out-of-cluster Prometheus reaches the apiserver and a short
    interval so the test need not wait minutes."""
    config: dict[str, Any] = yaml.safe_load((KIT / "scrape-config.yaml").read_text())
    for job in config["scrape_configs"]:
        for sd in job["kubernetes_sd_configs"]:
            sd["kubeconfig_file"] = str(kubeconfig)
    config["global"] = {
        "scrape_interval": "2s",
        "scrape_timeout": "2s",
        "evaluation_interval": "2s",
    }
    config["rule_files"] = [str(RULES)]
    return config


@pytest.fixture(scope="module")
def prometheus_binary() -> Path:
    out = subprocess.run(
        [str(Path(__file__).with_name("build-prometheus.sh"))],
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    if out.returncode != 0:
        pytest.fail(f"cannot build Prometheus: {out.stderr[-2000:]}", pytrace=False)
    return Path(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def suite(real_cluster: RealCluster) -> RealCluster:  # noqa: F811
    """One accelerator node, labelled, the suite deployed by deploy-all.sh, the node enabled by
    the controller's agent Job, and two pods sharing a GPU."""
    rc = real_cluster
    node = rc.add_node("gpu", "gpu-8x-nvlink")
    rc.operator.label(node.name, True)
    out = rc.operator.deploy_all("deploy")
    assert "all selected components are ready" in out.stdout, out.stdout
    try:
        wait_for(
            f"the agent's enable recorded on {node.name}",
            functools.partial(_enabled, rc, node.name),
            240,
        )
    except TimeoutError as e:
        raise AssertionError(f"{e}\n{_kube_system(rc)}") from None
    rc.operator.kubectl("create", "namespace", WORK_NS)
    wait_for(
        "the workload namespace's default ServiceAccount",
        lambda: (
            rc.operator.kubectl("-n", WORK_NS, "get", "sa", "default", check=False).returncode == 0
        ),
        30,
        0.2,
    )
    for name in SHARERS:
        body = workload(name, WORK_NS, {"aliyun.com/gpu-core": "30", "aliyun.com/gpu-memory": "4"})
        path = rc.work / f"{name}.json"
        path.write_text(json.dumps(body))
        rc.operator.kubectl("create", "-f", str(path))
    for name in SHARERS:
        try:
            wait_for(f"pod {name} Running", functools.partial(_running, rc, name), 120)
        except TimeoutError as e:
            raise AssertionError(f"{e}\n{_kube_system(rc)}") from None
    return rc


def _kube_system(rc: RealCluster) -> str:
    """What an operator looks at when the suite misbehaves (guide §3.4)."""
    out = []
    for args in (
        ("-n", "kube-system", "get", "jobs,pods", "-o", "wide"),
        ("get", "events", "-A", "--sort-by=.lastTimestamp"),
        ("-n", "kube-system", "logs", "deployment/lj-runtimekit-controller", "--tail=40"),
    ):
        got = rc.operator.kubectl(*args, check=False)
        out.append(f"$ kubectl {' '.join(args)}\n{got.stdout[-4000:]}{got.stderr[-1000:]}")
    return "\n".join(out)


def _enabled(rc: RealCluster, node: str) -> bool:
    annotations = rc.operator.node(node)["metadata"].get("annotations", {})
    status = json.loads(annotations.get(LAST_ACTION, "{}") or "{}")
    if status.get("action") == "enable" and status.get("result") == "failed":
        raise AssertionError(f"enable failed on {node}: {status}")
    return bool(status.get("action") == "enable" and status.get("result") == "succeeded")


def _running(rc: RealCluster, name: str) -> bool:
    pod = rc.operator.json("-n", WORK_NS, "get", "pod", name)
    phase = pod["status"].get("phase")
    if phase in ("Failed", "Succeeded"):
        raise AssertionError(f"pod {name} ended {phase}: {json.dumps(pod['status'])[:2000]}")
    return bool(phase == "Running")


@pytest.fixture(scope="module")
def prometheus(
    suite: RealCluster, prometheus_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Prometheus]:
    work = tmp_path_factory.mktemp("prometheus")
    cp = suite.control_plane
    assert cp.bridge is not None
    kubeconfig = write_kubeconfig(
        work / "kubeconfig", f"https://{cp.bridge.ip}:{cp.apiserver_port}", cp.pki
    )
    config = work / "prometheus.yml"
    config.write_text(yaml.safe_dump(prometheus_config(kubeconfig)))
    prom = Prometheus(prometheus_binary, suite.named["gpu"], config, work)
    try:
        wait_for("prometheus ready", prom.ready, 60, 0.5)
        yield prom
    finally:
        prom.stop()


def test_prometheus_finds_every_daemon_through_kubernetes_discovery(
    prometheus: Prometheus, suite: RealCluster
) -> None:
    node = suite.named["gpu"].name

    def all_up() -> list[dict[str, Any]] | None:
        up = prometheus.query('up{job=~"lj-runtimekit-.*"} == 1')
        counts = {j: sum(1 for s in up if s["metric"]["job"] == j) for j in JOBS}
        return up if counts == JOBS else None

    try:
        up = wait_for("every daemon scraped", all_up, 90)
    except TimeoutError:
        targets = prometheus.get("/api/v1/targets")["activeTargets"]
        raise AssertionError(
            f"targets: {json.dumps(targets)[:4000]}\nlog: {prometheus.log_tail()}"
        ) from None
    assert {s["metric"]["node"] for s in up} == {node}
    assert {s["metric"]["namespace"] for s in up} == {"kube-system"}


def test_the_exporters_pod_and_namespace_labels_name_the_workload(
    prometheus: Prometheus,
) -> None:
    def shared() -> list[dict[str, Any]] | None:
        got = prometheus.query(
            f'lj_runtimekit_container_allocated_core_ratio{{namespace="{WORK_NS}"}}'
        )
        return got if {s["metric"]["pod"] for s in got} == set(SHARERS) else None

    got = wait_for("the sharing pods' series", shared, 60)
    assert all(float(s["value"][1]) == pytest.approx(0.3) for s in got), got
    assert prometheus.query('{__name__=~"lj_.*", exported_pod!=""}') == []
    assert prometheus.query('{__name__=~"lj_.*", exported_namespace!=""}') == []


def test_every_rule_loads_and_evaluates_without_error(prometheus: Prometheus) -> None:
    shipped = yaml.safe_load(RULES.read_text())
    names = {r["alert"] for g in shipped["groups"] for r in g["rules"]}

    def evaluated() -> list[dict[str, Any]] | None:
        groups = prometheus.get("/api/v1/rules")["groups"]
        rules = [r for g in groups for r in g["rules"]]
        done = all(not r["lastEvaluation"].startswith("0001") for r in rules)
        return rules if rules and done else None

    rules = wait_for("every rule evaluated", evaluated, 30)
    assert {r["name"] for r in rules} == names
    bad = {r["name"]: r.get("lastError") for r in rules if r["health"] != "ok"}
    assert not bad, bad
    firing = prometheus.query('ALERTS{alertname=~"LJRuntimeKit.*", alertstate="firing"}')
    assert firing == [], "a healthy suite fires nothing"


def test_an_unhealthy_device_fires_its_alert(prometheus: Prometheus, suite: RealCluster) -> None:
    node = suite.named["gpu"]
    simulator_control(node, "/health", {"device": UNHEALTHY, "healthy": False, "reason": "XID 79"})
    selector = f'alertname="LJRuntimeKitDeviceUnhealthy", device="{UNHEALTHY}"'
    pending = wait_for(
        "the alert pending",
        lambda: prometheus.query(f'ALERTS{{{selector}, alertstate="pending"}}'),
        60,
    )
    assert pending[0]["metric"]["node"] == node.name
    firing = wait_for(
        "the alert firing after its 1 minute",
        lambda: prometheus.query(f'ALERTS{{{selector}, alertstate="firing"}}'),
        120,
    )
    assert firing[0]["metric"]["severity"] == "critical"
    alerts = prometheus.get("/api/v1/alerts")["alerts"]
    (alert,) = [a for a in alerts if a["labels"].get("device") == UNHEALTHY]
    print("firing:", json.dumps(alert, indent=1, sort_keys=True))  # the evidence, with -rP
    assert alert["annotations"]["summary"] == f"Device {UNHEALTHY} on {node.name} is unhealthy"
    others = prometheus.query('ALERTS{alertname=~"LJRuntimeKit.*", alertstate="firing"}')
    assert {s["metric"]["alertname"] for s in others} == {"LJRuntimeKitDeviceUnhealthy"}


def _dashboard_queries() -> list[tuple[str, str]]:
    doc = json.loads(DASHBOARD.read_text())
    out = []
    for p in doc["panels"]:
        for t in p.get("targets", []):
            out.append((f"{p['title']}/{t['refId']}", t["expr"]))
    for v in doc["templating"]["list"]:
        if v["type"] == "query":
            # label_values(series, label): the values of label among the series
            inner, label = v["query"]["query"][len("label_values(") : -1].rsplit(", ", 1)
            out.append((f"variable {v['name']}", f"group by ({label}) ({inner})"))
    return out


def _grafana(promql: str) -> str:
    for macro in sorted(GRAFANA_MACROS, key=len, reverse=True):
        promql = promql.replace(macro, GRAFANA_MACROS[macro])
    return promql


def test_every_dashboard_query_returns_data(prometheus: Prometheus) -> None:
    """Each panel's and variable's PromQL as Grafana sends it with "All" chosen."""
    empty = {}
    for title, promql in _dashboard_queries():
        result = prometheus.query(_grafana(promql))
        if not result:
            empty[title] = _grafana(promql)
    assert not empty, f"panels without data: {json.dumps(empty, indent=1)}"
