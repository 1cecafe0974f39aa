"""The policy's spec read into plain data, and the objects rendered from it (pure, no cluster)."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lj_runtimekit_operator import bundled, render
from lj_runtimekit_operator.errors import PolicyError
from lj_runtimekit_operator.objects import BY_KIND
from lj_runtimekit_operator.policy import (
    COMMON,
    COMPONENTS,
    FINALIZER,
    POLICY_LABEL,
    in_force,
    parse,
)

BUNDLE = bundled.load()
NAMES = [c.name for c in COMPONENTS]


def policy(spec: dict[str, Any], name: str = "suite") -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": "u-1", "generation": 3}, "spec": spec}


def test_defaults_are_the_release_the_operator_ships_in_kube_system() -> None:
    p = parse(policy({}), BUNDLE.registry, BUNDLE.version)
    assert p.namespace == "kube-system"
    assert BUNDLE.version == "v1.14.0"
    for c in p.components:
        assert c.enabled
        assert c.node_selector is None
        assert c.config is None
        assert c.image == f"{BUNDLE.registry}/lj-runtimekit-{c.name}:v1.14.0"
    agent = p.component("controller").job_agent_image
    assert agent == f"{BUNDLE.registry}/lj-runtimekit-controller-job-agent:v1.14.0"


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        ({"namespace": "Kube_System"}, "spec.namespace: 'Kube_System' is not a namespace name"),
        ({"components": {"gpuOperator": {}}}, "spec.components.gpuOperator: unknown component"),
        ({"components": {"exporter": {"enabled": "yes"}}}, "spec.components.exporter.enabled"),
        ({"components": {"exporter": {"version": "v1 2"}}}, "'v1 2' is not an image tag"),
        ({"components": {"scheduler": {"image": "Bad Image"}}}, "is not an image repository"),
        ({"components": {"exporter": {"nodeSelector": {"a": 1}}}}, "1 is not a label value"),
        ({"components": {"exporter": {"config": "log_level: info"}}}, "version: v1"),
        ({"components": {"exporter": {"config": "a: [b"}}}, "not YAML"),
        ({"components": []}, "spec.components: expected an object"),
    ],
    ids=["namespace", "unknown", "enabled", "tag", "image", "selector", "version", "yaml", "list"],
)
def test_a_spec_that_cannot_be_used_names_its_field(spec: dict[str, Any], error: str) -> None:
    with pytest.raises(PolicyError) as e:
        parse(policy(spec), BUNDLE.registry, BUNDLE.version)
    assert error in str(e.value)


def test_an_image_with_a_slash_is_a_whole_repository() -> None:
    spec = {"registry": "r.example/p", "components": {"exporter": {"image": "other.io/x/exp"}}}
    p = parse(policy(spec), BUNDLE.registry, BUNDLE.version)
    assert p.component("exporter").image == "other.io/x/exp:v1.14.0"
    assert p.component("scheduler").image == "r.example/p/lj-runtimekit-scheduler:v1.14.0"


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner, max_size=3)
    ),
    max_leaves=12,
)
KEYS = st.sampled_from(["controller", "scheduler", "devicePlugin", "exporter", "x"])
FIELDS = st.sampled_from(["enabled", "image", "version", "nodeSelector", "config", "jobAgentImage"])


@settings(max_examples=200, deadline=None)
@given(
    spec=st.dictionaries(
        st.sampled_from(["registry", "namespace", "components"]),
        JSONISH | st.dictionaries(KEYS, st.dictionaries(FIELDS, JSONISH, max_size=4), max_size=4),
        max_size=3,
    )
)
def test_any_spec_is_read_or_refused_with_a_policy_error(spec: dict[str, Any]) -> None:
    with contextlib.suppress(PolicyError):
        parse(policy(spec), BUNDLE.registry, BUNDLE.version)


def test_the_oldest_policy_is_in_force_then_by_name() -> None:
    def p(name: str, ts: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "creationTimestamp": ts}}

    items = [
        p("b", "2026-01-01T00:00:01Z"),
        p("c", "2026-01-01T00:00:00Z"),
        p("a", "2026-01-01T00:00:01Z"),
    ]
    assert in_force(items) is items[1]
    assert in_force(items[::2]) is items[2]
    assert in_force([]) is None
    # the one in force (it carries the finalizer) stays in force, whatever its age
    items[0]["metadata"]["finalizers"] = [FINALIZER]
    assert in_force(items) is items[0]


NAMESPACE = st.from_regex(r"[a-z][a-z0-9-]{0,20}[a-z0-9]", fullmatch=True)
TAG = st.from_regex(r"v[0-9]{1,2}\.[0-9]{1,2}\.[0-9]{1,2}(-[a-z0-9]{1,6})?", fullmatch=True)
LABEL = st.from_regex(r"[a-z][a-z0-9]{0,10}", fullmatch=True)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    namespace=NAMESPACE,
    tag=TAG,
    selector=st.none() | st.dictionaries(LABEL, LABEL, max_size=3),
    level=st.sampled_from(["debug", "info"]),
    component=st.sampled_from(NAMES),
)
def test_rendered_objects_are_the_policys_in_its_namespace(
    namespace: str, tag: str, selector: dict[str, str] | None, level: str, component: str
) -> None:
    key = next(c.key for c in COMPONENTS if c.name == component)
    config = f"version: v1\nlog_level: {level}\n"
    spec: dict[str, Any] = {"version": tag, "config": config}
    if selector is not None:
        spec["nodeSelector"] = selector
    p = parse(
        policy({"namespace": namespace, "registry": "reg.test/p", "components": {key: spec}}),
        BUNDLE.registry,
        BUNDLE.version,
    )
    objs = render.render(p, component, BUNDLE.objects[component])
    assert [o["kind"] for o in objs] == sorted(
        (o["kind"] for o in objs), key=lambda k: list(BY_KIND).index(k)
    )
    assert len(objs) == len(BUNDLE.objects[component])
    text = yaml.safe_dump(objs)
    assert "system:serviceaccount:kube-system:" not in text or namespace == "kube-system"
    for obj in objs:
        meta = obj["metadata"]
        assert meta["labels"][POLICY_LABEL] == "suite"
        if BY_KIND[obj["kind"]].namespaced:
            assert meta["namespace"] == namespace
            assert [o["uid"] for o in meta["ownerReferences"]] == ["u-1"]
        else:
            assert "namespace" not in meta
            assert "ownerReferences" not in meta
        for subject in obj.get("subjects") or []:
            assert subject["namespace"] == namespace
        if obj["kind"] == "ConfigMap":
            assert obj["data"]["config.yaml"] == config
        if obj["kind"] in ("Deployment", "DaemonSet"):
            pod = obj["spec"]["template"]["spec"]
            main = pod["containers"][0]
            assert main["image"] == f"reg.test/p/lj-runtimekit-{component}:{tag}"
            if selector is not None:
                dra = obj["metadata"]["name"] == "lj-runtimekit-dra-plugin"
                mode = {render.DEVICE_MODE_LABEL: "dra"} if dra else {}
                assert pod["nodeSelector"] == selector | mode
            ann = obj["spec"]["template"]["metadata"]["annotations"]
            assert ann[render.CONFIG_HASH] == render.config_hash(config)
            if component == "controller":
                agent = f"--job-image=reg.test/p/lj-runtimekit-controller-job-agent:{tag}"
                assert agent in main["args"]


def test_rendering_does_not_change_the_bundle_and_a_config_change_changes_the_digest() -> None:
    before = yaml.safe_dump(BUNDLE.objects["exporter"])
    p1 = parse(policy({}), BUNDLE.registry, BUNDLE.version)
    p2 = parse(
        policy({"components": {"exporter": {"config": "version: v1\nlog_level: debug\n"}}}),
        BUNDLE.registry,
        BUNDLE.version,
    )
    a = render.render(p1, "exporter", BUNDLE.objects["exporter"])
    b = render.render(p2, "exporter", BUNDLE.objects["exporter"])
    assert render.digest(a) != render.digest(b)
    assert render.digest(a) == render.digest(
        render.render(p1, "exporter", BUNDLE.objects["exporter"])
    )
    assert yaml.safe_dump(BUNDLE.objects["exporter"]) == before
    common = render.render(p1, COMMON, BUNDLE.objects[COMMON])
    assert [o["kind"] for o in common] == ["RuntimeClass"]


def test_the_device_plugin_renders_its_dra_daemonset_and_device_classes() -> None:
    p = parse(
        policy({"components": {"devicePlugin": {"version": "v9.9.9", "nodeSelector": {"a": "b"}}}}),
        BUNDLE.registry,
        BUNDLE.version,
    )
    objs = render.render(p, "device-plugin", BUNDLE.objects["device-plugin"])
    by_kind: dict[str, list[str]] = {}
    for o in objs:
        by_kind.setdefault(o["kind"], []).append(o["metadata"]["name"])
    device = next(c for c in COMPONENTS if c.name == "device-plugin")
    assert by_kind["DaemonSet"] == list(device.workloads)
    assert by_kind["DeviceClass"] == [
        "gpu.lj-runtimekit.aliyun.com",
        "gpu-share.lj-runtimekit.aliyun.com",
        "ppu.lj-runtimekit.aliyun.com",
        "mig.lj-runtimekit.aliyun.com",
        "tdm.lj-runtimekit.aliyun.com",
    ]
    pods = {
        o["metadata"]["name"]: o["spec"]["template"]["spec"]
        for o in objs
        if o["kind"] == "DaemonSet"
    }
    image = f"{BUNDLE.registry}/lj-runtimekit-device-plugin:v9.9.9"
    assert {n: p["containers"][0]["image"] for n, p in pods.items()} == dict.fromkeys(pods, image)
    assert "--mode=dra" in pods["lj-runtimekit-dra-plugin"]["containers"][0]["args"]
    # The policy's nodeSelector replaces the manifests'; a node's mode still picks one of them.
    assert pods["lj-runtimekit-device-plugin"]["nodeSelector"] == {"a": "b"}
    assert pods["lj-runtimekit-dra-plugin"]["nodeSelector"] == {
        "a": "b",
        render.DEVICE_MODE_LABEL: "dra",
    }
    assert "affinity" in pods["lj-runtimekit-device-plugin"]
    for o in objs:
        if o["kind"] == "DeviceClass":
            assert "namespace" not in o["metadata"]
            assert o["metadata"]["labels"][POLICY_LABEL] == "suite"


def _prefixes(objs: list[dict[str, Any]]) -> str:
    [vap] = [
        o
        for o in objs
        if o["kind"] == "ValidatingAdmissionPolicy"
        and o["metadata"]["name"] == "lj-runtimekit-device-plugin-own-node"
    ]
    [expression] = [v["expression"] for v in vap["spec"]["variables"] if v["name"] == "prefixes"]
    return str(expression)


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (None, "['lj-runtimekit.aliyun.com/']"),
        ("version: v1\nlog_level: info\n", "['lj-runtimekit.aliyun.com/']"),
        (
            "version: v1\nnode_label_prefix: lj-runtimekit.aliyun.com\n",
            "['lj-runtimekit.aliyun.com/']",
        ),
        (
            "version: v1\nnode_label_prefix: gpu.example.com\n",
            "['lj-runtimekit.aliyun.com/', 'gpu.example.com/']",
        ),
    ],
    ids=["manifest", "no-prefix", "default", "renamed"],
)
def test_a_renamed_label_prefix_is_admitted_by_the_device_plugins_policy_besides_the_default(
    config: str | None, expected: str
) -> None:
    spec = {} if config is None else {"components": {"devicePlugin": {"config": config}}}
    p = parse(policy(spec), BUNDLE.registry, BUNDLE.version)
    objs = render.render(p, "device-plugin", BUNDLE.objects["device-plugin"])
    assert _prefixes(objs) == expected
    # the manifest's policy says the same for the default (deploy/deviceplugin/02-rbac.yaml)
    assert _prefixes(list(BUNDLE.objects["device-plugin"])) == "['lj-runtimekit.aliyun.com/']"


@pytest.mark.parametrize(
    "prefix",
    ["Gpu.Example.com", "gpu.example.com/", "a'] + ['", "x" * 64, "42", "-a.b"],
    ids=["upper", "slash", "cel", "long", "number", "dash"],
)
def test_a_label_prefix_the_plugin_would_refuse_is_refused_before_it_reaches_the_policy(
    prefix: str,
) -> None:
    config = yaml.safe_dump({"version": "v1", "node_label_prefix": yaml.safe_load(prefix)})
    spec = {"components": {"devicePlugin": {"config": config}}}
    with pytest.raises(PolicyError, match=r"devicePlugin\.config: node_label_prefix"):
        parse(policy(spec), BUNDLE.registry, BUNDLE.version)
