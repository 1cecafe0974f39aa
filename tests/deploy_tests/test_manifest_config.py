"""Each component accepts exactly what its manifest gives it: the ConfigMap's config.yaml and the
container's args, read by the component's own settings loader (a typo in a ConfigMap key or a
flag fails here, not in a CrashLoopBackOff on a cluster)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from lj_runtimekit_testkit.manifests import DEPLOY, FOLDERS, containers, static_objects

CONFIG_PATH = "/etc/lj-runtimekit/config.yaml"
#: What the downward API gives each container in the manifests.
DOWNWARD = {"NODE_NAME": "node-a", "NODE_IP": "10.0.0.1", "POD_NAME": "pod-a"}


def manifest_parts(
    component: str, workload_name: str = ""
) -> tuple[str, list[str], dict[str, str]]:
    """The ConfigMap's config.yaml and the args and env of the component's workload (another
    workload of its folder by ``workload_name``, e.g. the device plugin's DRA DaemonSet)."""
    objs = static_objects([component])
    (cm,) = [o for o in objs if o["kind"] == "ConfigMap"]
    name = workload_name or f"lj-runtimekit-{component}"
    (workload,) = [
        o
        for o in objs
        if o["kind"] in {"DaemonSet", "Deployment"} and o["metadata"]["name"] == name
    ]
    (c,) = containers(workload)
    env = {e["name"]: DOWNWARD[e["name"]] for e in c.get("env", []) if "valueFrom" in e}
    env.update({e["name"]: e["value"] for e in c.get("env", []) if "value" in e})
    return cm["data"]["config.yaml"], list(c.get("args", [])), env


@pytest.mark.parametrize("component", list(FOLDERS), ids=list(FOLDERS))
def test_component_loads_its_manifest_config_and_args(component: str, tmp_path: Path) -> None:
    text, args, env = manifest_parts(component)
    config = tmp_path / "config.yaml"
    config.write_text(text)
    argv = [a.replace(CONFIG_PATH, str(config)) for a in args]
    package = "lj_runtimekit_" + component.replace("-", "_")
    settings: Any = importlib.import_module(f"{package}.settings")
    loaded = settings.load(argv, env)
    assert loaded is not None


def test_the_dra_daemonset_runs_the_device_plugin_in_dra_mode_on_its_config(
    tmp_path: Path,
) -> None:
    from lj_runtimekit_device_plugin.settings import load

    text, args, env = manifest_parts("device-plugin", "lj-runtimekit-dra-plugin")
    config = tmp_path / "config.yaml"
    config.write_text(text)
    loaded = load([a.replace(CONFIG_PATH, str(config)) for a in args], env)
    assert loaded.mode == "dra"
    assert load([], {}).mode == "device-plugin"


@pytest.mark.parametrize("component", list(FOLDERS), ids=list(FOLDERS))
def test_component_rejects_an_unknown_configmap_key(component: str, tmp_path: Path) -> None:
    text, args, env = manifest_parts(component)
    config = tmp_path / "config.yaml"
    config.write_text(text + "no_such_key_anywhere: 1\n")
    argv = [a.replace(CONFIG_PATH, str(config)) for a in args]
    package = "lj_runtimekit_" + component.replace("-", "_")
    settings: Any = importlib.import_module(f"{package}.settings")
    errors: Any = importlib.import_module(f"{package}.errors")
    with pytest.raises(errors.ConfigError, match="no_such_key_anywhere"):
        settings.load(argv, env)


@pytest.mark.parametrize("component", list(FOLDERS), ids=list(FOLDERS))
def test_probes_and_ports_are_the_ones_the_component_listens_on(
    component: str, tmp_path: Path
) -> None:
    text, args, env = manifest_parts(component)
    config = tmp_path / "config.yaml"
    config.write_text(text)
    argv = [a.replace(CONFIG_PATH, str(config)) for a in args]
    package = "lj_runtimekit_" + component.replace("-", "_")
    loaded: Any = importlib.import_module(f"{package}.settings").load(argv, env)
    listens = getattr(loaded, "port", None) or loaded.metrics_port
    workloads = [o for o in static_objects([component]) if o["kind"] in {"DaemonSet", "Deployment"}]
    assert workloads
    for workload in workloads:  # the device plugin's DRA DaemonSet listens where it does
        (c,) = containers(workload)
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        for probe in ("readinessProbe", "livenessProbe"):
            port = c[probe]["httpGet"]["port"]
            assert ports.get(port, port) == listens, f"{probe} on {port}, the daemon on {listens}"
    if getattr(loaded, "listen_address", "0.0.0.0") not in ("0.0.0.0", "::", ""):
        pytest.fail(
            f"{component} listens on {loaded.listen_address}: the kubelet's probe misses it"
        )


def _header(path: Path) -> str:
    """The comment above a manifest's first object, as one line of prose."""
    lines = path.read_text().split("\napiVersion:", 1)[0].splitlines()
    return " ".join(line.lstrip("# ").strip() for line in lines if line.startswith("#"))


@pytest.mark.parametrize("component", list(FOLDERS), ids=list(FOLDERS))
def test_a_configmaps_header_calls_editable_only_what_it_holds(component: str) -> None:
    """#39: the device plugin's header said its annotation keys are edited here, and none is.
    What a header lists as editable must be keys of its config.yaml."""
    path = DEPLOY / FOLDERS[component] / "01-configmap.yaml"
    header = _header(path)
    config, _, _ = manifest_parts(component)
    keys = " ".join(yaml.safe_load(config))
    _, said, rest = header.partition("edits without rebuilding the image:")
    editable = rest.split(". ", 1)[0].lower() if said else ""
    for word in ("annotation", "label", "port", "resource", "mig", "pod"):
        if re.search(rf"\b{word}", editable):
            assert word in keys, f"{path.name} calls {word} keys editable; config.yaml has {keys}"


def test_the_device_plugins_header_says_its_annotation_keys_are_not_settings() -> None:
    """The guide (§3.6) calls annotation keys editable; the header says which are not, and why."""
    header = _header(DEPLOY / "deviceplugin" / "01-configmap.yaml")
    fixed = header.split("Not settings", 1)[1]
    for key in ("lj-runtimekit-scheduler/gpu-assignment", "lj-runtimekit-device-plugin/"):
        assert key in fixed, header
