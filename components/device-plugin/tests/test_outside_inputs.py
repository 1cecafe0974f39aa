"""Every input from outside the process, fuzzed: no crash, bounded, a clear error naming it.

Inputs: the ConfigMap file and environment, the Runtime's device facts (at their extremes and as
raw bytes), the kubelet's ``/pods`` answer, and the annotations a pod's owner can write (a forged
scheduler assignment must never make the plugin over-commit a device).
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lj_runtimekit_device_plugin.deviceplugin.assignment import ASSIGNMENT, Share, candidates
from lj_runtimekit_device_plugin.deviceplugin.headroom import share_error
from lj_runtimekit_device_plugin.domains import MAX_DEVICE_MEMORY_BYTES, MAX_DEVICES, screen
from lj_runtimekit_device_plugin.errors import ConfigError
from lj_runtimekit_device_plugin.inventory import Inventory
from lj_runtimekit_device_plugin.kubelet import MAX_PODS_BYTES, PodsUnavailable, kubelet_pods
from lj_runtimekit_device_plugin.model import GIB, Allocation, Device, Injection, Partition
from lj_runtimekit_device_plugin.podview import PodView, pod_view
from lj_runtimekit_device_plugin.resources import (
    CORE_UNITS_PER_GPU,
    ResourceNames,
    advertise,
)
from lj_runtimekit_device_plugin.runtime import device_from_proto
from lj_runtimekit_device_plugin.settings import FIELDS, load
from lj_runtimekit_interface.runtime.v1 import device_pb2

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
U64 = (1 << 64) - 1

# --- the ConfigMap file and the environment ------------------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(1 << 70), max_value=1 << 70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


@FUZZ
@given(
    doc=st.dictionaries(
        st.one_of(st.sampled_from(sorted(FIELDS)), st.text(max_size=8), st.integers()),
        scalars,
        max_size=4,
    ),
    version=st.sampled_from(["v1", "v1", "v2", None]),
)
def test_any_yaml_config_is_settings_or_an_error_naming_key_and_value(
    tmp_path_factory: pytest.TempPathFactory, doc: dict[Any, Any], version: str | None
) -> None:
    path = tmp_path_factory.mktemp("cfg") / "config.yaml"
    path.write_text(yaml.safe_dump({"version": version, **doc}, allow_unicode=True))
    try:
        s = load(["--config", str(path)], {"NODE_NAME": "n1"})
    except ConfigError as e:
        text = str(e)
        # the error names what to fix: the file, a key, or the bad version
        assert str(path) in text or any(k in text for k in FIELDS) or "resource name" in text, text
        return
    for name in ("health_interval", "rpc_timeout", "allocate_timeout", "reconcile_interval"):
        assert 0 < getattr(s, name) < math.inf
    assert 0 <= s.metrics_address[1] <= 65535


@FUZZ
@given(raw=st.binary(max_size=200))
def test_any_bytes_as_config_file_is_settings_or_a_config_error(
    tmp_path_factory: pytest.TempPathFactory, raw: bytes
) -> None:
    path = tmp_path_factory.mktemp("cfg") / "config.yaml"
    path.write_bytes(b"version: v1\n" + raw)
    error = ""
    try:
        load(["--config", str(path)], {"NODE_NAME": "n1"})
    except ConfigError as e:
        error = str(e) or "empty message"
    assert error != "empty message"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"version: v1\nport: 80\xff\n", "not UTF-8"),
        (b"version: v1\nrpc_timeout: .inf\n", "rpc_timeout inf"),
        (b"version: v1\nhealth_interval: .nan\n", "health_interval nan"),
        (b"version: v1\n1: a\nb: 2\n", "unknown keys ['1', 'b']"),
        (b'version: v1\nsocket_dir: "a\\0b"\n', "socket_dir .* NUL"),
        (b"version: v1\nport: true\n", "port=True"),
        (b"version: v1\nport: 65536\n", "port 65536"),
    ],
    ids=["non-utf8", "inf", "nan", "int-key", "nul", "bool-port", "big-port"],
)
def test_bad_config_values_are_named(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load(["--config", str(path)], {"NODE_NAME": "n1"})


# --- the Runtime's device facts ---------------------------------------------------------------

ids = st.sampled_from(["gpu-0", "gpu-1", "gpu-0", "", "a::core-1", "gpu-0-mig-0", "\u00e9"])
u64 = st.one_of(
    st.sampled_from([0, 1, GIB, 80 * GIB, U64, MAX_DEVICE_MEMORY_BYTES + 1]), st.integers(0, U64)
)
u32 = st.integers(0, (1 << 32) - 1)
partitions = st.builds(
    device_pb2.Partition,
    id=ids,
    profile=st.text(max_size=5),
    memory_bytes=u64,
    compute_units=u32,
    time_percent=u32,
)
devices = st.builds(
    device_pb2.Device,
    id=ids,
    index=u32,
    kind=st.integers(0, 9),
    memory_bytes=u64,
    compute_units=u32,
    numa_node=st.integers(-(1 << 31), (1 << 31) - 1),
    partition_mode=st.integers(0, 7),
    partitions=st.lists(partitions, max_size=3),
    health=st.builds(device_pb2.Health, state=st.integers(0, 5), reason=st.text(max_size=5)),
)


@FUZZ
@given(protos=st.lists(devices, max_size=5), strategy=st.sampled_from(["single", "mixed", "none"]))
def test_runtime_devices_at_extremes_advertise_bounded_unique_units(
    protos: list[device_pb2.Device], strategy: str
) -> None:
    kept = screen([device_from_proto(d) for d in protos])
    units = advertise(kept, ResourceNames(mig_strategy=strategy))
    all_ids = [u.id for us in units.values() for u in us]
    assert len(all_ids) == len(set(all_ids)), "unit ids repeat: the kubelet would count twice"
    # bounded: never more units than 100 cores + one per GiB of 16 TiB + partitions, per device
    per_device = CORE_UNITS_PER_GPU + (MAX_DEVICE_MEMORY_BYTES // GIB) + 3 + 1
    assert len(all_ids) <= per_device * len(kept)
    for d in kept:
        assert d.memory_bytes <= MAX_DEVICE_MEMORY_BYTES


@FUZZ
@given(raw=st.binary(max_size=300))
def test_any_bytes_as_a_device_list_parse_or_fail_cleanly(raw: bytes) -> None:
    try:
        r = device_pb2.ListDevicesResponse.FromString(raw)
    except DecodeError:
        return  # what grpc-aio turns into None: RuntimeGarbage (test_hostile_runtime)
    screen([device_from_proto(d) for d in r.devices])


def test_a_partition_id_repeating_a_device_id_is_left_out() -> None:
    a = Device(id="gpu-0", memory_bytes=GIB)
    b = Device(
        id="gpu-1",
        memory_bytes=GIB,
        partition_mode="mig",
        partitions=(Partition("gpu-0", "1g"),),
    )
    assert screen([a, b]) == []
    assert screen([Device(id="gpu-2", memory_bytes=U64)]) == []


# --- the kubelet's /pods ------------------------------------------------------------------

json_values = st.recursive(
    st.one_of(
        st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=5)
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=12,
)
pod_like = st.fixed_dictionaries(
    {},
    optional={
        "metadata": st.one_of(
            json_values,
            st.fixed_dictionaries(
                {"name": json_values, "annotations": json_values},
                optional={"deletionTimestamp": json_values},
            ),
        ),
        "spec": st.one_of(
            json_values,
            st.fixed_dictionaries(
                {
                    "containers": st.one_of(
                        json_values,
                        st.lists(
                            st.fixed_dictionaries(
                                {"name": st.text(max_size=3), "resources": json_values}
                            ),
                            max_size=2,
                        ),
                    )
                }
            ),
        ),
        "status": json_values,
    },
)


@FUZZ
@given(obj=pod_like)
def test_any_pod_json_is_a_view_or_none(obj: dict[str, Any]) -> None:
    v = pod_view(obj)
    if v is not None:
        for reqs in v.requests.values():
            assert all(isinstance(n, int) and n >= 0 for n in reqs.values())


@pytest.fixture
async def pods_server() -> AsyncIterator[tuple[str, list[bytes]]]:
    answers: list[bytes] = [b"{}"]

    async def pods(_: web.Request) -> web.StreamResponse:
        return web.Response(body=answers[0])

    app = web.Application()
    app.router.add_get("/pods", pods)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/pods", answers
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"\xff\xfe",
        b"[]",
        b'{"items": 3}',
        b'{"items": [1, "x", null]}',
        b"[" * 100_000 + b"]" * 100_000,
        b'{"items": []' + b" " * (MAX_PODS_BYTES + 1) + b"}",
    ],
    ids=["garbage", "non-utf8", "list", "items-int", "items-junk", "deep", "huge"],
)
async def test_a_bad_pods_answer_is_pods_unavailable_or_no_pods(
    pods_server: tuple[str, list[bytes]], body: bytes
) -> None:
    url, answers = pods_server
    answers[0] = body
    try:
        pods = await kubelet_pods(url, 10.0)
    except PodsUnavailable as e:
        error = str(e)
    else:
        assert pods == []
        return
    assert url in error


# --- annotations a pod's owner can write: never an over-commit -----------------------------

NAMES = ResourceNames()
NODE = "n1"


def _pod(i: int, requests: dict[str, int], assignment: object) -> PodView:
    text = assignment if isinstance(assignment, str) else json.dumps(assignment)
    return PodView("ns", f"p{i}", f"u{i}", "1", {ASSIGNMENT: text}, {"c": requests})


forged = st.fixed_dictionaries(
    {
        "version": st.just("v1"),
        "node": st.sampled_from([NODE, "other"]),
        "assumedAt": st.just("t"),
        "containers": st.lists(
            st.fixed_dictionaries(
                {
                    "name": st.just("c"),
                    "devices": st.lists(
                        st.fixed_dictionaries(
                            {
                                "id": st.sampled_from(["gpu-0", "gpu-1", "gpu-9", "gpu-0"]),
                                "core": st.integers(-5, 500),
                                "memoryGiB": st.integers(-5, 1 << 40),
                            },
                            optional={"whole": st.booleans()},
                        ),
                        min_size=1,
                        max_size=3,
                    ),
                }
            ),
            max_size=2,
        ),
    }
)


@FUZZ
@given(
    assignment=forged,
    core=st.integers(0, 300),
    memory=st.integers(0, 200),
)
def test_a_forged_assignment_never_buys_more_than_the_pod_requested(
    assignment: dict[str, Any], core: int, memory: int
) -> None:
    requests = {k: v for k, v in ((NAMES.gpu_core, core), (NAMES.gpu_memory, memory)) if v}
    pod = _pod(0, requests, assignment)
    paid = {"gpu-core": NAMES.gpu_core, "gpu-memory": NAMES.gpu_memory}
    for resource, kind, units in (
        (NAMES.gpu_core, "gpu-core", core),
        (NAMES.gpu_memory, "gpu-memory", memory),
    ):
        for c in candidates([pod], NODE, resource, kind, units=units, paid=paid):
            assert sum(s.core for s in c.shares) == core
            assert sum(s.memory_gib for s in c.shares) == memory


live_allocs = st.lists(
    st.builds(
        Allocation,
        id=st.text(min_size=1, max_size=3),
        device_ids=st.lists(st.sampled_from(["gpu-0", "gpu-1"]), min_size=1, max_size=2).map(tuple),
        injection=st.just(Injection()),
        core_percent=st.integers(0, 100),
        memory_bytes=st.integers(0, 80 * GIB),
    ),
    max_size=4,
)


@FUZZ
@given(
    live=live_allocs,
    shares=st.lists(
        st.builds(
            Share,
            id=st.sampled_from(["gpu-0", "gpu-1", "gpu-9"]),
            core=st.integers(-5, 200),
            memory_gib=st.integers(-5, 200),
        ),
        min_size=1,
        max_size=3,
    ),
)
def test_shares_checked_one_after_another_never_exceed_a_device(
    live: list[Allocation], shares: list[Share]
) -> None:
    inventory = {
        "gpu-0": Device(id="gpu-0", memory_bytes=80 * GIB),
        "gpu-1": Device(id="gpu-1", memory_bytes=16 * GIB),
    }
    given_: list[Share] = []
    for s in shares:
        if share_error(s, inventory, live, also=given_) is None:
            given_.append(s)
    for dev, d in inventory.items():
        held = [a for a in live if dev in a.device_ids]
        if any(not a.shared for a in held):
            assert not [s for s in given_ if s.id == dev], "a share on a device held whole"
            continue
        core = sum(a.core_percent for a in held) + sum(s.core for s in given_ if s.id == dev)
        mem = sum(-(-a.memory_bytes // GIB) for a in held) + sum(
            s.memory_gib for s in given_ if s.id == dev
        )
        if any(s.id == dev for s in given_):
            assert core <= CORE_UNITS_PER_GPU
            assert mem <= d.memory_gib
    assert all(s.id in inventory for s in given_), "a device of another node was given"


async def test_events_cannot_collide_with_or_grow_the_inventory_past_its_bound() -> None:
    inv = Inventory()
    await inv.replace([Device(id="gpu-0", memory_bytes=GIB)])
    # an ADDED event reusing gpu-0 as a partition id would repeat a unit id
    clash = Device(
        id="gpu-1", memory_bytes=GIB, partition_mode="mig", partitions=(Partition("gpu-0", "1g"),)
    )
    await inv.update([clash])
    assert [d.id for d in inv.view().devices] == ["gpu-0"]
    # a health event for gpu-0 itself still applies
    await inv.update([Device(id="gpu-0", memory_bytes=GIB, healthy=False)])
    assert not inv.view().devices[0].healthy
    await inv.update(Device(id=f"x-{i}", index=i + 1) for i in range(MAX_DEVICES + 10))
    assert len(inv.view().devices) == MAX_DEVICES


async def test_a_pod_list_sent_in_many_chunks_is_read_whole() -> None:
    """A real kubelet's /pods of a few pods is longer than one network read: found on a real
    node, where ``content.read(n)`` returned the first chunk only and every shared Allocate was
    refused with a JSONDecodeError."""
    pods = [{"metadata": {"name": f"p{i}", "uid": f"u{i}", "note": "x" * 2000}} for i in range(50)]
    body = json.dumps({"kind": "PodList", "items": pods}).encode()

    async def answer(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        for at in range(0, len(body), 4096):
            await response.write(body[at : at + 4096])
            await asyncio.sleep(0.001)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/pods", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        got = await kubelet_pods(f"http://127.0.0.1:{runner.addresses[0][1]}/pods", 10.0)
    finally:
        await runner.cleanup()
    assert [p["metadata"]["name"] for p in got] == [f"p{i}" for i in range(50)]
