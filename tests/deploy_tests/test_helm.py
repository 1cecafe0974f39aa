"""The Helm chart renders the static manifests, object by object, and its values switch
components, registry, version, namespace, the node label and resource names as documented.

What the chart adds to deploy/ is checked, not ignored: Helm's standard labels (with their
values), the explicit `--namespace` of the scheduler and controller, and config.yaml compared as
the YAML the components read (the chart writes the shared keys first, with its own comments)."""

from __future__ import annotations

import copy
import importlib
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from lj_runtimekit_testkit.manifests import (
    CHART,
    DEPLOY,
    Obj,
    containers,
    key,
    pod_spec,
    static_objects,
    tool_dir,
)

CLUSTER_SCOPED = {
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "DeviceClass",
    "RuntimeClass",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}


@pytest.fixture(scope="module")
def helm() -> Path:
    return tool_dir() / "helm"


STANDARD_LABELS = {
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/component",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
}


def render(helm: Path, *sets: str, namespace: str = "kube-system") -> list[Obj]:
    args = [str(helm), "template", "lj-runtimekit", str(CHART), "--include-crds", "-n", namespace]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, check=True, capture_output=True, text=True, timeout=120).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def by_key(objs: list[Obj]) -> dict[tuple[str, str, str], Obj]:
    return {key(o): o for o in objs}


def without_chart_additions(obj: Obj, static: Obj) -> Obj:
    """The chart's object less what the chart adds on purpose, each addition checked here."""
    obj = copy.deepcopy(obj)
    for meta, want in ((obj["metadata"], static["metadata"]), *_templates(obj, static)):
        labels = meta.get("labels", {})
        extra = set(labels) - set(want.get("labels", {}))
        assert extra <= STANDARD_LABELS, (key(obj), extra - STANDARD_LABELS)
        for k in extra:
            del labels[k]
    for c in containers(obj):
        # the namespace of the scheduler's Lease, of the controller's Jobs and Lease
        flag = {
            "lj-runtimekit-scheduler": "--leader-elect-resource-namespace=kube-system",
            "lj-runtimekit-controller": "--namespace=kube-system",
        }.get(c["name"])
        if flag is not None:
            assert flag in c["args"], c["name"]
            want_args = next(x for x in containers(static) if x["name"] == c["name"])["args"]
            if flag not in want_args:
                c["args"].remove(flag)
    if obj["kind"] == "ConfigMap":
        obj["data"] = {k: yaml.safe_load(v) for k, v in obj["data"].items()}
    return obj


def _templates(obj: Obj, static: Obj) -> list[tuple[Obj, Obj]]:
    if "template" not in obj.get("spec", {}):
        return []
    return [(obj["spec"]["template"]["metadata"], static["spec"]["template"]["metadata"])]


def test_default_values_render_the_static_manifests_object_by_object(helm: Path) -> None:
    chart = by_key(render(helm))
    static = by_key(static_objects())
    assert sorted(chart) == sorted(static)
    for k, obj in static.items():
        want = obj
        if obj["kind"] == "ConfigMap":
            want = {**obj, "data": {n: yaml.safe_load(v) for n, v in obj["data"].items()}}
        assert without_chart_additions(chart[k], want) == want, f"{k} differs: deploy/ and chart"


def test_chart_lints_clean(helm: Path) -> None:
    subprocess.run([str(helm), "lint", "--strict", str(CHART)], check=True, capture_output=True)


def test_a_disabled_component_renders_none_of_its_objects(helm: Path) -> None:
    objs = render(helm, "exporter.enabled=false")
    names = {o["metadata"]["name"] for o in objs}
    assert "lj-runtimekit-exporter" not in names
    assert "lj-runtimekit-device-plugin" in names


def test_registry_version_and_node_label_flow_into_every_workload(helm: Path) -> None:
    objs = render(
        helm,
        "registry=registry.example/ljrk",
        "version=v1.14.0",
        "exporter.tag=v1.14.1",
        "nodeLabel.key=example.com/gpu-node",
    )
    images: dict[str, str] = {}
    for o in objs:
        spec = o.get("spec", {}).get("template", {}).get("spec", {})
        for c in spec.get("containers", []):
            images[o["metadata"]["name"]] = c["image"]
            for a in c.get("args", []):
                if a.startswith("--job-image="):
                    images["job-agent"] = a.split("=", 1)[1]
        if o["kind"] == "DaemonSet":
            dra = {"lj_runtimekit_device_mode": "dra"} if "dra" in o["metadata"]["name"] else {}
            assert spec["nodeSelector"] == {"example.com/gpu-node": "true", **dra}
    assert images == {
        "lj-runtimekit-device-plugin": "registry.example/ljrk/lj-runtimekit-device-plugin:v1.14.0",
        "lj-runtimekit-dra-plugin": "registry.example/ljrk/lj-runtimekit-device-plugin:v1.14.0",
        "lj-runtimekit-exporter": "registry.example/ljrk/lj-runtimekit-exporter:v1.14.1",
        "lj-runtimekit-scheduler": "registry.example/ljrk/lj-runtimekit-scheduler:v1.14.0",
        "lj-runtimekit-controller": "registry.example/ljrk/lj-runtimekit-controller:v1.14.0",
        "job-agent": "registry.example/ljrk/lj-runtimekit-controller-job-agent:v1.14.0",
    }


def helm_run(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(helm), *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_the_crd_is_a_file_of_the_chart_equal_to_deploys() -> None:
    for crd in sorted((DEPLOY / "crds").glob("*.yaml")):
        copy_in_chart = CHART / "crds" / crd.name
        assert not copy_in_chart.is_symlink(), "a symlink: helm warns on every command"
        assert not (CHART / "crds").is_symlink()
        assert copy_in_chart.read_text() == crd.read_text(), f"{crd.name}: copy the new CRD"


GOOD_VALUES = [
    "imagePullSecrets[0].name=my-registry",
    "devicePlugin.tolerations[0].key=gpu",
    "devicePlugin.tolerations[0].operator=Exists",
    "exporter.nodeSelector.zone=a",
    "scheduler.priorityClassName=",
    "controller.resources.limits.memory=1Gi",
    "controller.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    ".nodeSelectorTerms[0].matchExpressions[0].key=kubernetes.io/os",
    "controller.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    ".nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
    "runtimeClass.enabled=true",
    "monitoring.serviceMonitor.enabled=false",
    "monitoring.serviceMonitor.interval=30s",
    "monitoring.serviceMonitor.labels.release=prom",
    "monitoring.prometheusRule.enabled=false",
    "monitoring.grafanaDashboard.labels.grafana_dashboard=dash",
    "security.anything=goes",
]


def test_good_values_pass_the_schema_and_reach_the_pods(helm: Path) -> None:
    objs = render(helm, *GOOD_VALUES)
    specs = {o["metadata"]["name"]: pod_spec(o) for o in objs if pod_spec(o)}
    assert len(specs) == 5  # the device plugin twice: its DaemonSet and the DRA mode's
    for spec in specs.values():
        assert spec["imagePullSecrets"] == [{"name": "my-registry"}]
    assert specs["lj-runtimekit-device-plugin"]["tolerations"] == [
        {"key": "gpu", "operator": "Exists"}
    ]
    assert specs["lj-runtimekit-exporter"]["nodeSelector"] == {
        "lj_runtimekit_enable": "true",
        "zone": "a",
    }
    assert "priorityClassName" not in specs["lj-runtimekit-scheduler"]
    (c,) = specs["lj-runtimekit-controller"]["containers"]
    assert c["resources"]["limits"] == {"memory": "1Gi"}
    assert "nodeAffinity" in specs["lj-runtimekit-controller"]["affinity"]


@pytest.mark.parametrize(
    ("typo", "where"),
    [
        ("nodelabel.key=gpu", "additional properties 'nodelabel'"),
        ("devicePlugin.enabeld=true", "additional properties 'enabeld'"),
        ("nodeLabel.keys=gpu", "additional properties 'keys'"),
        ("resourceNames.gpucore=x.io/core", "additional properties 'gpucore'"),
        ("exporter.resources.limit.memory=1Gi", "additional properties 'limit'"),
        ("monitoring.serviceMonitor.intervall=30s", "additional properties 'intervall'"),
        ("monitoring.alerts.enabled=true", "additional properties 'alerts'"),
        ("nodeLabel.key=bad key", "/nodeLabel/key"),
        ("resourceNames.gpu=gpu", "/resourceNames/gpu"),
        ("scheduler.imagePullPolicy=Sometimes", "/scheduler/imagePullPolicy"),
    ],
    ids=lambda v: v.split("=")[0] if "=" in v else "",
)
def test_a_typo_or_a_bad_value_is_rejected_by_the_schema(helm: Path, typo: str, where: str) -> None:
    done = helm_run(helm, "template", "x", str(CHART), "--set", typo)
    assert done.returncode != 0, f"{typo} was accepted"
    assert "values don't meet the specifications of the schema" in done.stderr
    assert where in done.stderr, done.stderr


def test_everything_goes_to_the_release_namespace(helm: Path) -> None:
    objs = render(helm, namespace="gpu-system")
    for o in objs:
        if o["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in o["metadata"], key(o)
        else:
            assert o["metadata"]["namespace"] == "gpu-system", key(o)
        for s in o.get("subjects", []):
            assert s["namespace"] == "gpu-system", key(o)
        if o["kind"] != "CustomResourceDefinition":  # RuntimeKitPolicy's default namespace
            assert "kube-system" not in json.dumps(o), f"{key(o)} still names kube-system"


def test_every_object_carries_the_standard_labels_and_selectors_stay_the_guides(
    helm: Path,
) -> None:
    for o in render(helm, "version=v1.14.0", "exporter.tag=v1.14.2"):
        if o["kind"] == "CustomResourceDefinition":
            continue  # crds/ is not templated
        labels = o["metadata"]["labels"]
        assert labels["app.kubernetes.io/instance"] == "lj-runtimekit", key(o)
        assert labels["app.kubernetes.io/managed-by"] == "Helm", key(o)
        assert labels["app.kubernetes.io/part-of"] == "lj-runtimekit", key(o)
        assert labels["helm.sh/chart"] == f"lj-runtimekit-{chart_version()}", key(o)
        assert labels["app.kubernetes.io/name"].startswith("lj-runtimekit"), key(o)
        want = "v1.14.2" if labels.get("app") == "lj-runtimekit-exporter" else "v1.14.0"
        assert labels["app.kubernetes.io/version"] == want, key(o)
        if "app" in labels:
            component = labels["app"].removeprefix("lj-runtimekit-")
            assert labels["app.kubernetes.io/component"] == component, key(o)
        if o["kind"] in {"DaemonSet", "Deployment"}:
            name = o["metadata"]["name"]
            assert o["spec"]["selector"] == {"matchLabels": {"app": name}}, "immutable: keep it"
            pod_labels = o["spec"]["template"]["metadata"]["labels"]
            assert pod_labels["app"] == name
            assert "helm.sh/chart" not in pod_labels, "a chart bump alone must not roll pods"


def chart_version() -> str:
    return str(yaml.safe_load((CHART / "Chart.yaml").read_text())["version"])


def load_settings(objs: list[Obj], component: str, tmp_path: Path) -> Any:
    """The component's settings as it loads them from the chart's ConfigMap and args."""
    name = f"lj-runtimekit-{component}"
    (cm,) = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == name]
    (wl,) = [
        o
        for o in objs
        if o["kind"] in {"DaemonSet", "Deployment"} and name == o["metadata"]["name"]
    ]
    config = tmp_path / f"{component}.yaml"
    config.write_text(cm["data"]["config.yaml"])
    (c,) = containers(wl)
    argv = [a.replace("/etc/lj-runtimekit/config.yaml", str(config)) for a in c["args"]]
    module = importlib.import_module(f"lj_runtimekit_{component.replace('-', '_')}.settings")
    return module.load(argv, {"NODE_NAME": "n", "POD_NAME": "p"})


def test_node_label_resource_names_and_namespace_reach_every_component_as_it_loads_them(
    helm: Path, tmp_path: Path
) -> None:
    objs = render(
        helm,
        "nodeLabel.key=example.com/accelerator",
        "resourceNames.gpu=example.com/gpu",
        "resourceNames.gpuCore=example.com/gpu-core",
        "resourceNames.gpuMemory=example.com/gpu-mem",
        "resourceNames.ppu=example.com/ppu",
        namespace="gpu-system",
    )
    scheduler = load_settings(objs, "scheduler", tmp_path)
    assert scheduler.leader_elect_resource_namespace == "gpu-system"
    assert scheduler.feature_label == "example.com/accelerator"
    assert (scheduler.resources.gpu, scheduler.resources.gpu_core) == (
        "example.com/gpu",
        "example.com/gpu-core",
    )
    assert (scheduler.resources.gpu_memory, scheduler.resources.ppu) == (
        "example.com/gpu-mem",
        "example.com/ppu",
    )
    controller = load_settings(objs, "controller", tmp_path)
    assert controller.namespace == "gpu-system"
    assert (controller.label_key, controller.label_value) == ("example.com/accelerator", "true")
    plugin = load_settings(objs, "device-plugin", tmp_path)
    assert (plugin.resource_gpu, plugin.resource_gpu_core) == (
        "example.com/gpu",
        "example.com/gpu-core",
    )
    assert (plugin.resource_gpu_memory, plugin.resource_ppu) == (
        "example.com/gpu-mem",
        "example.com/ppu",
    )
    assert load_settings(objs, "exporter", tmp_path) is not None
    for o in objs:
        if o["kind"] in {"DaemonSet", "RuntimeClass"}:
            sel = pod_spec(o).get("nodeSelector") or o["scheduling"]["nodeSelector"]
            dra = {"lj_runtimekit_device_mode": "dra"} if "dra" in o["metadata"]["name"] else {}
            assert sel == {"example.com/accelerator": "true", **dra}, key(o)


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (
            ["nodeLabel.value=yes"],
            'the scheduler only places onto nodes whose label lj_runtimekit_enable is "true"',
        ),
        (
            ["devicePlugin.config=resource_gpu: other.io/gpu"],
            "devicePlugin.config sets resource_gpu, which the chart sets from resourceNames.gpu",
        ),
        (
            ["controller.config=label_key: other"],
            "controller.config sets label_key, which the chart sets from nodeLabel.key",
        ),
        (["exporter.config=version: v2"], "exporter.config sets version"),
        (["scheduler.config=a: b: c"], "scheduler.config is not valid YAML"),
    ],
    ids=["label-value-for-scheduler", "resource-name-twice", "label-twice", "version", "yaml"],
)
def test_a_setting_the_chart_owns_is_refused_where_it_would_be_lost(
    helm: Path, sets: list[str], message: str
) -> None:
    args = ["template", "x", str(CHART)]
    for s in sets:
        args += ["--set-string" if s.endswith("yes") else "--set", s]
    done = helm_run(helm, *args)
    assert done.returncode != 0
    assert message in done.stderr, done.stderr


def test_another_node_label_value_is_fine_without_the_scheduler(helm: Path) -> None:
    objs = render(helm, "nodeLabel.value=yes", "scheduler.enabled=false")
    (cm,) = [
        o
        for o in objs
        if o["metadata"]["name"] == "lj-runtimekit-controller" and o["kind"] == "ConfigMap"
    ]
    assert yaml.safe_load(cm["data"]["config.yaml"])["label_value"] == "yes"


def test_notes_say_what_to_check_in_the_release_namespace(helm: Path) -> None:
    done = helm_run(
        helm, "install", "ljrk", str(CHART), "--dry-run=client", "-n", "gpu-system",
        "--set", "nodeLabel.key=example.com/accelerator",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    notes = done.stdout.split("NOTES:", 1)[1]
    assert "kubectl get nodes -l example.com/accelerator=true" in notes
    assert "kubectl -n gpu-system rollout status daemonset/lj-runtimekit-device-plugin" in notes
    assert "kubectl -n gpu-system get pods -l app.kubernetes.io/instance=ljrk" in notes
    assert "kubectl apply --server-side --force-conflicts -f crds/" in notes
    assert "kube-system" not in notes
