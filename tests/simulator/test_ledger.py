"""The allocation rules, pure: whatever the order of requests, no device is overcommitted."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from lj_runtimekit_testkit.simulator import load_inventory
from lj_runtimekit_testkit.simulator.ledger import Ledger, PodRef, Request, RuntimeRefusal
from lj_runtimekit_testkit.simulator.node import NodeState

INVENTORY = load_inventory("mig-tdm")
DEVICES = {d.id: d for d in INVENTORY.devices}
UNITS = ["gpu-3", "gpu-0-mig-3g.40gb-0", "gpu-2-tdm-1", "gpu-0", "gpu-9"]
GIB = 1024**3

_requests = st.lists(
    st.tuples(
        st.sampled_from(["aliyun.com/gpu", "aliyun.com/gpu-core", "aliyun.com/gpu-memory"]),
        st.lists(st.sampled_from(UNITS), min_size=1, max_size=2, unique=True),
        st.integers(0, 120),
        st.integers(0, 90).map(lambda g: g * GIB),
        st.booleans(),  # release the oldest allocation after this request
    ),
    max_size=25,
)


def _memory(unit: str) -> int:
    for d in DEVICES.values():
        if d.id == unit:
            return d.memory_bytes
        for p in d.partitions:
            if p.id == unit:
                return p.memory_bytes
    raise AssertionError(unit)


@settings(max_examples=100, deadline=None)
@given(_requests)
def test_no_unit_is_ever_overcommitted(
    requests: list[tuple[str, list[str], int, int, bool]],
) -> None:
    ledger = Ledger(INVENTORY, "n")
    for i, (resource, ids, core, mem, release) in enumerate(requests):
        req = Request(PodRef("ns", f"p{i}", f"u{i}"), "c", resource, tuple(ids), core, mem)
        refusal = ""
        try:
            ledger.allocate(req, DEVICES)
        except RuntimeRefusal as e:
            refusal = e.message
        assert refusal or ledger.allocations  # refused with a reason, or allocated
        if release and ledger.allocations:
            ledger.release(next(iter(ledger.allocations)), "")
        for unit in UNITS[:4]:
            holders = [a for a in ledger.allocations.values() if unit in a.device_ids]
            whole = [a for a in holders if not a.shared]
            assert len(whole) <= 1
            assert not whole or len(holders) == 1
            assert sum(a.core_percent for a in holders) <= 100
            assert sum(a.memory_bytes for a in holders) <= _memory(unit)
        assert all("gpu-0" not in a.device_ids for a in ledger.allocations.values())


def test_allocations_and_ids_outlive_the_runtime_process(tmp_path: Path) -> None:
    """A Runtime restart (an upgrade window, guide §7.2) frees nothing and reuses no id: seen on a
    real node, where a restarted simulator had lost every running pod's allocation."""
    state = tmp_path / "state" / "state.json"
    before = NodeState(load_inventory("gpu-8x-nvlink"), "n", state)
    whole = before.allocate(Request(PodRef("ns", "a", "ua"), "c", "aliyun.com/gpu", ("gpu-0",)))
    share = before.allocate(
        Request(PodRef("ns", "b", "ub"), "c", "aliyun.com/gpu-core", ("gpu-1",), 30, 8 << 30)
    )
    before.release(whole.id, "")
    after = NodeState(load_inventory("gpu-8x-nvlink"), "n", state)
    assert after.ledger.allocations == {share.id: share}
    again = after.allocate(Request(PodRef("ns", "c", "uc"), "c", "aliyun.com/gpu", ("gpu-0",)))
    assert again.id not in (whole.id, share.id)
