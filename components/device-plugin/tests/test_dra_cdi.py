"""The CDI spec of a prepared claim: what the container runtime will apply, and its ids."""

from __future__ import annotations

import json
import re
import string
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lj_runtimekit_device_plugin.dra.cdi import (
    CDI_VERSION,
    InvalidCDI,
    PreparedDevice,
    claim_spec,
    device_name,
    spec_file_name,
    validate_kind,
)
from lj_runtimekit_device_plugin.model import Injection

UID = "6f1f0c3e-2b7a-4a51-9a0e-5c1d8f5e2a10"
INJECTION = Injection(
    envs=(("NVIDIA_VISIBLE_DEVICES", "GPU-1"), ("LJ_CORE", "30")),
    annotations=(("xdm.amp.com.devices", "gpu-0"),),
    device_nodes=(("/dev/nvidia0", "/dev/nvidia0", "rw"), ("/dev/nvidiactl", "", "")),
    mounts=(("/usr/lib/x.so", "/opt/x.so", True), ("/data", "/host/data", False)),
)


def _cdi_device_name_ok(name: str) -> bool:
    # The CDI parser's rule, spelled out character by character (not the module's regex).
    alnum = set(string.ascii_letters + string.digits)
    if not name or name[0] not in alnum or name[-1] not in alnum:
        return False
    return all(c in alnum or c in "_-.:" for c in name)


def test_spec_carries_the_injection_as_container_edits() -> None:
    dev = PreparedDevice("gpu", "node-a", "gpu-0", INJECTION)
    spec, ids = claim_spec(UID, [dev])
    assert spec["cdiVersion"] == CDI_VERSION == "0.6.0"
    assert spec["kind"] == "aliyun.com/gpu"
    (cdi,) = spec["devices"]
    assert ids[dev] == f"aliyun.com/gpu={cdi['name']}"
    edits = cdi["containerEdits"]
    assert edits["env"] == ["NVIDIA_VISIBLE_DEVICES=GPU-1", "LJ_CORE=30"]
    assert edits["deviceNodes"] == [
        {"path": "/dev/nvidia0", "hostPath": "/dev/nvidia0", "permissions": "rw"},
        {"path": "/dev/nvidiactl"},
    ]
    assert edits["mounts"] == [
        {"hostPath": "/opt/x.so", "containerPath": "/usr/lib/x.so", "options": ["bind", "ro"]},
        {"hostPath": "/host/data", "containerPath": "/data", "options": ["bind", "rw"]},
    ]
    assert cdi["annotations"] == {"xdm.amp.com.devices": "gpu-0"}


def test_one_cdi_device_per_claim_device_with_the_configured_kind() -> None:
    devs = [PreparedDevice("gpus", "node-a", f"gpu-{i}", INJECTION) for i in range(3)]
    spec, ids = claim_spec(UID, devs, kind="alibabacloud.com/ppu")
    assert len(spec["devices"]) == 3
    assert len(set(ids.values())) == 3
    assert all(i.startswith("alibabacloud.com/ppu=") for i in ids.values())


@pytest.mark.parametrize(
    ("injection", "message"),
    [
        (Injection(device_nodes=(("dev/nvidia0", "", "rw"),)), "absolute"),
        (Injection(device_nodes=(("/dev/nvidia0", "nvidia0", ""),)), "absolute"),
        (Injection(device_nodes=(("/dev/nvidia0", "", "rx"),)), "r, w, m"),
        (Injection(mounts=(("/a", "relative/b", True),)), "absolute"),
        (Injection(envs=(("A=B", "c"),)), "env var"),
        (Injection(envs=(("", "c"),)), "env var"),
        (Injection(annotations=(("bad key!", "v"),)), "annotation key"),
        (Injection(annotations=(("k", "v" * (256 * 1024)),)), "256 KiB"),
    ],
)
def test_an_injection_cdi_cannot_carry_is_refused(injection: Injection, message: str) -> None:
    with pytest.raises(InvalidCDI, match=message):
        claim_spec(UID, [PreparedDevice("r", "p", "d", injection)])


@pytest.mark.parametrize("kind", ["aliyun.com", "/gpu", "aliyun.com/", "1vendor/gpu", "a/b-"])
def test_a_bad_kind_is_refused(kind: str) -> None:
    with pytest.raises(InvalidCDI):
        validate_kind(kind)


def test_spec_file_name_is_per_claim() -> None:
    assert spec_file_name("aliyun.com/gpu", UID) == f"aliyun.com-gpu_{UID}.json"
    assert spec_file_name("aliyun.com/gpu", "a/../b") == "aliyun.com-gpu_a_.._b.json"


texts = st.text(max_size=40)
paths = st.one_of(st.text(max_size=20), st.text(max_size=20).map(lambda s: "/" + s))
injections = st.builds(
    Injection,
    envs=st.lists(st.tuples(texts, texts), max_size=3).map(tuple),
    annotations=st.lists(st.tuples(texts, texts), max_size=2).map(tuple),
    device_nodes=st.lists(
        st.tuples(paths, paths, st.sampled_from(["", "rw", "rwm", "x"])), max_size=3
    ).map(tuple),
    mounts=st.lists(st.tuples(paths, paths, st.booleans()), max_size=3).map(tuple),
)
prepared = st.builds(PreparedDevice, request=texts, pool=texts, device=texts, injection=injections)


def _check_valid(spec: dict[str, Any]) -> None:
    names = [d["name"] for d in spec["devices"]]
    assert len(names) == len(set(names))
    for dev in spec["devices"]:
        assert _cdi_device_name_ok(dev["name"]), dev["name"]
        edits = dev["containerEdits"]
        for env in edits.get("env", []):
            assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]*=.*", env, re.S)
        for node in edits.get("deviceNodes", []):
            assert node["path"].startswith("/")
            assert node.get("hostPath", "/").startswith("/")
            assert set(node.get("permissions", "")) <= set("rwm")
        for mount in edits.get("mounts", []):
            assert mount["hostPath"].startswith("/")
            assert mount["containerPath"].startswith("/")


@settings(max_examples=80, deadline=None)
@given(uid=texts, devices=st.lists(prepared, min_size=1, max_size=4))
def test_every_spec_built_is_valid_or_refused(uid: str, devices: list[PreparedDevice]) -> None:
    try:
        spec, ids = claim_spec(uid, devices)
    except InvalidCDI:
        return
    _check_valid(spec)
    assert set(ids) == set(devices)
    names = {d["name"] for d in spec["devices"]}
    assert {i.split("=", 1)[1] for i in ids.values()} == names


@settings(max_examples=100, deadline=None)
@given(a=st.tuples(texts, texts, texts), b=st.tuples(texts, texts, texts))
def test_device_names_are_valid_stable_and_unique(
    a: tuple[str, str, str], b: tuple[str, str, str]
) -> None:
    assert _cdi_device_name_ok(device_name(*a))
    assert device_name(*a) == device_name(*a)
    if a != b:
        assert device_name(*a) != device_name(*b)


def test_device_name_reads_as_its_claim_request_and_device() -> None:
    name = device_name(UID, "gpus", "gpu-3")
    assert name.startswith(f"{UID}-gpus-gpu-3-")
    # a first-available subrequest's "/" is not a CDI character
    assert _cdi_device_name_ok(device_name(UID, "main/sub", "gpu-3"))


abs_paths = st.text(st.characters(blacklist_characters="\0"), max_size=20).map(lambda s: "/" + s)
env_keys = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True)
good_injections = st.builds(
    Injection,
    envs=st.lists(
        st.tuples(env_keys, st.text(st.characters(blacklist_characters="\0"))), max_size=3
    ).map(tuple),
    device_nodes=st.lists(
        st.tuples(abs_paths, abs_paths, st.sampled_from(["", "r", "rw", "rwm"])), max_size=3
    ).map(tuple),
    mounts=st.lists(st.tuples(abs_paths, abs_paths, st.booleans()), max_size=3).map(tuple),
)


@settings(max_examples=100, deadline=None)
@given(
    uid=st.uuids().map(str),
    devices=st.lists(
        st.builds(
            PreparedDevice, request=texts, pool=texts, device=texts, injection=good_injections
        ),
        min_size=1,
        max_size=4,
    ),
)
def test_an_injection_cdi_can_carry_is_always_written(
    uid: str, devices: list[PreparedDevice]
) -> None:
    spec, _ = claim_spec(uid, devices)
    _check_valid(spec)
    assert json.loads(json.dumps(spec)) == spec
