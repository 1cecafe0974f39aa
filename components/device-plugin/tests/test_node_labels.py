"""Node labels operators select on (issue 22, items 3-4): driver and compute capability, sharing,
partition profiles, the renameable prefix, and what an older Runtime leaves out."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lj_runtimekit_device_plugin.errors import ConfigError
from lj_runtimekit_device_plugin.kube import Publisher
from lj_runtimekit_device_plugin.model import GIB, Device, Partition, RuntimeInfo
from lj_runtimekit_device_plugin.nodedevices import (
    DEFAULT_LABEL_PREFIX,
    PREFIX_LABEL,
    label_patch,
    labels,
    owned_prefixes,
)
from lj_runtimekit_device_plugin.resources import ResourceNames
from lj_runtimekit_device_plugin.runtime import DriverFacts
from lj_runtimekit_device_plugin.settings import load

RT = RuntimeInfo("v1.14.0", "v1")
P = DEFAULT_LABEL_PREFIX + "/"
# Kubernetes' own rules (apimachinery validation): a qualified name part, a label value
NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def facts(devices: list[Device], cc: str = "9.0", driver: str = "550.54.15") -> DriverFacts:
    return DriverFacts(
        driver_version=driver,
        compute_capability={d.id: cc for d in devices},
        partition_modes={d.id: frozenset({"mig", "tdm"}) for d in devices},
    )


def ours(got: dict[str, str]) -> dict[str, str]:
    return {k.removeprefix(P): v for k, v in got.items()}


def test_driver_version_and_compute_capability_come_from_the_runtime(
    eight_gpus: list[Device],
) -> None:
    got = ours(labels(eight_gpus, RT, facts(eight_gpus)))
    assert got["driver-version"] == "550.54.15"
    assert (got["driver-version.major"], got["driver-version.minor"]) == ("550", "54")
    assert (got["compute.major"], got["compute.minor"]) == ("9", "0")
    assert got["runtime-version"] == "v1.14.0"
    assert got["mig.capable"] == got["tdm.capable"] == "true"
    assert got["mig.strategy"] == "single"


def test_compute_capability_is_the_lowest_and_only_when_every_device_gives_one(
    eight_gpus: list[Device],
) -> None:
    mixed = dataclasses.replace(
        facts(eight_gpus),
        compute_capability={"gpu-0": "8.9", **{f"gpu-{i}": "9.0" for i in (1, 2)}},
    )
    assert "compute.major" not in ours(labels(eight_gpus, RT, mixed))  # gpu-3.. give none
    mixed = dataclasses.replace(
        mixed, compute_capability={**{d.id: "9.0" for d in eight_gpus}, "gpu-5": "8.9"}
    )
    got = ours(labels(eight_gpus, RT, mixed))
    assert (got["compute.major"], got["compute.minor"]) == ("8", "9")


@pytest.mark.parametrize(
    "old", [None, DriverFacts()], ids=["no-facts", "runtime-without-the-new-fields"]
)
def test_an_older_runtime_leaves_the_new_labels_out(
    eight_gpus: list[Device], old: DriverFacts | None
) -> None:
    got = ours(labels(eight_gpus, RuntimeInfo(), old))
    for key in ("driver-version", "driver-version.major", "compute.major", "compute.minor"):
        assert key not in got
    assert "mig.capable" not in got
    assert "mig.strategy" not in got
    assert "runtime-version" not in got  # empty version: no label rather than an empty one
    assert got["count"] == "8"
    assert got["model"] == "A100"


def test_partition_profiles_are_counted_and_partitioned_gpus_are_capable(
    mig_tdm: list[Device],
) -> None:
    got = ours(labels(mig_tdm, RT, DriverFacts()))
    assert got["mig-1g.10gb.count"] == "2"
    assert got["mig-3g.40gb.count"] == "1"
    assert got["tdm-50.count"] == "2"
    assert got["partitioning"] == "mig_none_tdm"
    # the Runtime said nothing of capability, but a GPU in MIG mode is MIG-capable
    assert got["mig.capable"] == got["tdm.capable"] == "true"
    assert got["sharing-mode"] == "core-memory"  # gpu-2 is whole: shares of it are advertised


@pytest.mark.parametrize(
    ("enabled", "mode"),
    [
        ({"gpu", "gpu-core", "gpu-memory"}, "core-memory"),
        ({"gpu", "gpu-core"}, "core"),
        ({"gpu", "gpu-memory"}, "memory"),
        ({"gpu"}, "none"),
    ],
    ids=["core-memory", "core", "memory", "none"],
)
def test_sharing_mode_is_what_the_node_advertises(
    eight_gpus: list[Device], enabled: set[str], mode: str
) -> None:
    names = ResourceNames(enabled=frozenset(enabled))
    assert ours(labels(eight_gpus, RT, names=names))["sharing-mode"] == mode


def test_a_node_whose_gpus_are_all_partitioned_offers_no_shares(mig_tdm: list[Device]) -> None:
    assert ours(labels(mig_tdm[:2], RT))["sharing-mode"] == "none"


def test_every_label_is_under_the_configured_prefix(eight_gpus: list[Device]) -> None:
    got = labels(eight_gpus, RT, facts(eight_gpus), prefix="gpu.example.com")
    assert got
    assert all(k.startswith("gpu.example.com/") for k in got)
    assert got["gpu.example.com/count"] == "8"


def test_a_renamed_prefix_removes_the_old_labels_and_keeps_everyone_elses(
    eight_gpus: list[Device],
) -> None:
    before = labels(eight_gpus, RT)
    node = {**before, "kubernetes.io/hostname": "n1", "example.org/team": "a"}
    after = labels(eight_gpus, RT, prefix="gpu.example.com")
    patch = label_patch(node, after, owned_prefixes("gpu.example.com", DEFAULT_LABEL_PREFIX))
    assert {k for k, v in patch.items() if v is None} == set(before)
    assert {k: v for k, v in patch.items() if v is not None} == after
    # without knowing the old prefix the old labels would stay: the record label is what knows
    assert not any(v is None for v in label_patch(node, after, ("gpu.example.com",)).values())


def test_a_node_without_the_record_was_labelled_under_the_default_prefix() -> None:
    assert owned_prefixes("gpu.example.com", None) == ("gpu.example.com", DEFAULT_LABEL_PREFIX)
    assert owned_prefixes(DEFAULT_LABEL_PREFIX, None) == (DEFAULT_LABEL_PREFIX,)
    assert owned_prefixes("b.example.com", "a.example.com") == ("b.example.com", "a.example.com")


class FakeCore:
    """The two node calls the publisher makes, over one node's labels."""

    def __init__(self, labels: dict[str, str]) -> None:
        self.labels = labels
        self.patches: list[dict[str, Any]] = []

    async def read_node(self, name: str) -> Any:
        return SimpleNamespace(metadata=SimpleNamespace(labels=dict(self.labels), annotations={}))

    async def patch_node(self, name: str, body: dict[str, Any], **_: Any) -> None:
        # the plugin's admission policy (deploy/deviceplugin/02-rbac.yaml) refuses any other
        # change of a node than its labels: a patch with annotations would fail every write
        assert set(body) == {"metadata"}
        assert set(body["metadata"]) == {"labels"}, body
        self.patches.append(body)
        for k, v in body["metadata"]["labels"].items():
            if v is None:
                self.labels.pop(k, None)
            else:
                self.labels[k] = v


class FakeCustom:
    async def create_cluster_custom_object(self, *args: Any, **kwargs: Any) -> None:
        return None

    async def patch_cluster_custom_object_status(self, *args: Any, **kwargs: Any) -> None:
        return None


def publisher(core: FakeCore, prefix: str) -> Publisher:
    pub = Publisher(SimpleNamespace(), "n1", label_prefix=prefix)  # type: ignore[arg-type]
    pub.core, pub.custom = core, FakeCustom()  # type: ignore[assignment]
    return pub


def under(prefix: str, node: dict[str, str]) -> list[str]:
    return sorted(k for k in node if k.startswith(prefix + "/") and k != PREFIX_LABEL)


async def test_plugin_restarted_with_a_new_prefix_removes_the_labels_of_the_old_one(
    eight_gpus: list[Device],
) -> None:
    # a node labelled by a plugin that recorded no prefix (before this setting existed)
    core = FakeCore({**labels(eight_gpus, RT), "example.org/team": "a"})
    await publisher(core, "gpu.example.com").publish(eight_gpus, RT, facts(eight_gpus))
    assert under(DEFAULT_LABEL_PREFIX, core.labels) == []
    assert core.labels["gpu.example.com/count"] == "8"
    assert core.labels["example.org/team"] == "a"
    assert core.labels[PREFIX_LABEL] == "gpu.example.com"
    # restarted with the same prefix: nothing to write
    pub = publisher(core, "gpu.example.com")
    written = len(core.patches)
    await pub.publish(eight_gpus, RT, facts(eight_gpus))
    assert len(core.patches) == written
    # renamed again: the recorded prefix, not the default, says whose labels go
    await publisher(core, "accel.example.net").publish(eight_gpus, RT, facts(eight_gpus))
    assert under("gpu.example.com", core.labels) == []
    assert core.labels["accel.example.net/driver-version"] == "550.54.15"
    assert core.labels[PREFIX_LABEL] == "accel.example.net"
    # and back to the default: the record stays, everything else under the default is new
    await publisher(core, DEFAULT_LABEL_PREFIX).publish(eight_gpus, RT, facts(eight_gpus))
    assert under("accel.example.net", core.labels) == []
    assert core.labels[P + "count"] == "8"
    assert core.labels[PREFIX_LABEL] == DEFAULT_LABEL_PREFIX


async def test_labels_are_written_only_when_they_change(eight_gpus: list[Device]) -> None:
    core = FakeCore({})
    pub = publisher(core, DEFAULT_LABEL_PREFIX)
    await pub.publish(eight_gpus, RT, facts(eight_gpus))
    await pub.publish(eight_gpus, RT, facts(eight_gpus))
    assert len(core.patches) == 1
    await pub.publish(eight_gpus, RT, facts(eight_gpus, driver="560.28.03"))
    assert len(core.patches) == 2
    assert core.patches[-1]["metadata"]["labels"] == {
        P + "driver-version": "560.28.03",
        P + "driver-version.major": "560",
        P + "driver-version.minor": "28",
    }


_text = st.text(max_size=90)
_profiles = st.lists(st.text(min_size=1, max_size=70), min_size=1, max_size=4)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    model=_text,
    vendor=_text,
    version=_text,
    driver=_text,
    cc=_text,
    profiles=_profiles,
    mode=st.sampled_from(["mig", "tdm"]),
    prefix=st.from_regex(DNS_SUBDOMAIN, fullmatch=True).filter(lambda p: len(p) <= 253),
)
def test_every_key_and_value_is_one_kubernetes_accepts(
    *,
    model: str,
    vendor: str,
    version: str,
    driver: str,
    cc: str,
    profiles: list[str],
    mode: str,
    prefix: str,
) -> None:
    parts = tuple(Partition(f"p-{i}", p, GIB) for i, p in enumerate(profiles))
    devices = [
        Device(id="gpu-0", model=model, vendor=vendor, memory_bytes=80 * GIB),
        Device(id="gpu-1", model=model, partition_mode=mode, partitions=parts),
    ]
    got = labels(
        devices,
        RuntimeInfo(version),
        DriverFacts(driver, {"gpu-0": cc, "gpu-1": cc}, {"gpu-0": frozenset({mode})}),
        prefix=prefix,
    )
    assert got[f"{prefix}/count"] == "2"
    for key, value in got.items():
        head, _, name = key.rpartition("/")
        assert head == prefix
        assert len(name) <= 63, key
        assert NAME.match(name), key
        assert len(value) <= 63, (key, value)
        assert VALUE.match(value), (key, value)


def test_the_prefix_is_read_from_the_configmap_file(tmp_path: Path) -> None:
    file = tmp_path / "config.yaml"
    file.write_text("version: v1\nnode_label_prefix: gpu.example.com\n")
    assert load([f"--config={file}"], environ={}).node_label_prefix == "gpu.example.com"
    assert load([], environ={}).node_label_prefix == DEFAULT_LABEL_PREFIX


@pytest.mark.parametrize(
    "prefix",
    ["GPU.example.com", "gpu.example.com/", "-gpu.example.com", "gpu..example.com", "a" * 64, ""],
    ids=["upper-case", "slash", "leading-dash", "empty-part", "over-63", "empty"],
)
def test_a_prefix_that_is_not_a_short_dns_subdomain_is_refused(prefix: str) -> None:
    with pytest.raises(ConfigError, match="node_label_prefix"):
        load([f"--node-label-prefix={prefix}"], environ={})
