"""The inventory loader: the shipped files load, bad files are refused with the field named."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lj_runtimekit_testkit.simulator import InventoryError, load_inventory, parse_inventory
from lj_runtimekit_testkit.simulator.inventory import Kind, LinkKind, Mode
from lj_runtimekit_testkit.simulator.inventory_file import INVENTORY_DIR_ENV

GOOD = """
version: v1
node: n1
devices:
  - {id: gpu-0, model: M, memory_gib: 16, compute_units: 10, pci_bus_id: "0000:01:00.0"}
  - {id: gpu-1, model: M, memory_gib: 16, compute_units: 10, pci_bus_id: "0000:02:00.0"}
topology:
  - {type: nvlink, devices: [gpu-0, gpu-1], bandwidth_gbps: 50, lanes: 2}
"""


def _good() -> dict[str, object]:
    doc = yaml.safe_load(GOOD)
    assert isinstance(doc, dict)
    return doc


def test_shipped_inventories_describe_their_nodes() -> None:
    gpu8 = load_inventory("gpu-8x-nvlink")
    assert len(gpu8.devices) == 8
    assert {d.numa_node for d in gpu8.devices} == {0, 1}
    nvlink = {
        d.id: {lk.peer_id for lk in d.links if lk.kind is LinkKind.NVLINK} for d in gpu8.devices
    }
    assert nvlink["gpu-0"] == {"gpu-1", "gpu-2", "gpu-3"}
    assert nvlink["gpu-4"] == {"gpu-5", "gpu-6", "gpu-7"}
    ppu = load_inventory("ppu-8x")
    assert {d.kind for d in ppu.devices} == {Kind.PPU}
    mixed = load_inventory("mig-tdm")
    assert [d.mode for d in mixed.devices] == [Mode.MIG, Mode.MIG, Mode.TDM, Mode.NONE]
    assert len(mixed.devices[1].partitions) == 7
    assert len(load_inventory("gpu-1x").devices) == 1


def test_path_and_env_override_resolve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "mine.yaml").write_text(GOOD)
    assert load_inventory(tmp_path / "mine.yaml").node == "n1"
    monkeypatch.setenv(INVENTORY_DIR_ENV, str(tmp_path))
    assert load_inventory("mine").node == "n1"
    with pytest.raises(InventoryError, match="cannot read"):
        load_inventory("gpu-8x-nvlink")  # not in the overriding folder


def _with_device(**fields: object) -> dict[str, object]:
    doc = _good()
    devices = doc["devices"]
    assert isinstance(devices, list)
    devices[0] = {**devices[0], **fields}
    return doc


@pytest.mark.parametrize(
    ("doc", "words"),
    [
        ({**_good(), "version": "v2"}, "version: expected 'v1'"),
        ({**_good(), "colour": "red"}, "unknown keys ['colour']"),
        ({**_good(), "devices": []}, "devices: expected a non-empty list"),
        (_with_device(memory_gib="lots"), "devices[0].memory_gib"),
        (_with_device(kind="tpu"), "devices[0].kind: expected one of"),
        (_with_device(id="gpu-1"), "id 'gpu-1' is used twice"),
        (_with_device(pci_bus_id="0000:02:00.0"), "pci_bus_id"),
        (_with_device(partitioning={"mode": "mig", "profiles": ["1g.5gb"]}), "not in supports"),
        (
            _with_device(supports=["mig"], partitioning={"mode": "mig", "profiles": ["9g.5gb"]}),
            "not like '3g.40gb'",
        ),
        (_with_device(supports=["tdm"], partitioning={"mode": "tdm", "slices": [70, 40]}), "110%"),
        (
            _with_device(
                supports=["mig", "tdm"],
                partitioning={"mode": "mig", "profiles": ["1g.5gb"], "slices": [5]},
            ),
            "MIG profiles and TDM slices",
        ),
        (_with_device(health={"healthy": "no"}), "health.healthy"),
        (
            {
                **_good(),
                "topology": [
                    {"type": "nvlink", "devices": ["gpu-0", "gpu-9"], "bandwidth_gbps": 1}
                ],
            },
            "unknown: ['gpu-9']",
        ),
    ],
    ids=[
        "version",
        "unknown-key",
        "no-devices",
        "memory-type",
        "kind",
        "dup-id",
        "dup-pci",
        "mode-unsupported",
        "bad-mig-profile",
        "tdm-over-100",
        "mig-and-tdm",
        "health-type",
        "link-to-unknown",
    ],
)
def test_bad_inventory_is_refused_naming_the_field(doc: dict[str, object], words: str) -> None:
    with pytest.raises(InventoryError) as err:
        parse_inventory(yaml.safe_dump(doc), source="bad.yaml")
    assert str(err.value).startswith("bad.yaml")
    assert words in str(err.value)


def test_invalid_yaml_is_an_inventory_error() -> None:
    with pytest.raises(InventoryError, match="not valid YAML"):
        parse_inventory("devices: [unclosed", source="x.yaml")


_scalars = st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats() | st.text(max_size=8)
_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    key=st.sampled_from(
        [
            "id",
            "uuid",
            "index",
            "kind",
            "vendor",
            "model",
            "memory_gib",
            "compute_units",
            "numa_node",
            "pci_bus_id",
            "device_nodes",
            "supports",
            "partitioning",
            "health",
        ]
    ),
    value=_values,
)
def test_any_field_value_loads_or_fails_with_an_inventory_error(key: str, value: object) -> None:
    message = ""
    try:
        inv = parse_inventory(yaml.safe_dump(_with_device(**{key: value})), source="fuzz.yaml")
    except InventoryError as e:
        message = str(e)
    else:
        assert len(inv.devices) == 2
    assert not message or message.startswith("fuzz.yaml")


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=200))
def test_arbitrary_text_loads_or_fails_with_an_inventory_error(text: str) -> None:
    with contextlib.suppress(InventoryError):
        parse_inventory(text, source="fuzz.yaml")
