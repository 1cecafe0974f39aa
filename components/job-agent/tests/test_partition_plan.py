"""The partition action's decisions without sockets (partition_plan.py): which GPUs change, in
which calls, what blocks them and what the hardware refuses; and the result's size bound."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lj_runtimekit_job_agent import partition_plan as pp
from lj_runtimekit_job_agent import result
from lj_runtimekit_job_agent.gpus import Gpu, Holding
from lj_runtimekit_job_agent.partition_layout import WHOLE, Target, from_yaml

GIB = 1 << 30
MIG = Target("mig", profiles=("3g.40gb", "3g.40gb"))
TDM = Target("tdm", slices=(50, 50))
VFIO = Target("vfio")


def gpu(index: int, **kw: object) -> Gpu:
    fields: dict[str, object] = {
        "id": f"gpu-{index}",
        "index": index,
        "memory_bytes": 80 * GIB,
        "supported_modes": frozenset({"mig", "tdm"}),
    }
    fields.update(kw)
    return Gpu(**fields)  # type: ignore[arg-type]


def as_target(g: Gpu, t: Target) -> Gpu:
    """``g`` as the Runtime would report it once at ``t``."""
    if t.mode == "vfio":
        return dataclasses.replace(g, binding="vfio", mode="none", profiles=(), slices=())
    return dataclasses.replace(
        g,
        binding="driver",
        mode="none" if t.mode == "whole" else t.mode,
        profiles=t.profiles,
        slices=t.slices,
    )


def test_only_gpus_that_differ_change_in_index_order() -> None:
    gpus = [as_target(gpu(2), MIG), gpu(0), as_target(gpu(1), TDM), as_target(gpu(3), VFIO)]
    plan = pp.changes(gpus, {0: MIG, 1: TDM, 2: MIG, 3: WHOLE})
    assert [c.describe() for c in plan] == [
        "gpu-0: whole → MIG 3g.40gb+3g.40gb",
        "gpu-3: vfio-pci → whole",
    ]
    assert pp.changes(gpus, {0: WHOLE, 1: TDM, 2: MIG, 3: VFIO}) == []


def test_tdm_slices_and_mig_profiles_compare_in_order() -> None:
    g = as_target(gpu(0), Target("tdm", slices=(50, 25, 25)))
    assert pp.changes([g], {0: Target("tdm", slices=(25, 25, 50))})
    assert not pp.changes([g], {0: Target("tdm", slices=(50, 25, 25))})


@pytest.mark.parametrize(
    ("start", "target", "calls"),
    [
        (WHOLE, MIG, ["partition mig"]),
        (MIG, VFIO, ["partition whole", "bind vfio"]),
        (WHOLE, VFIO, ["bind vfio"]),
        (VFIO, MIG, ["bind driver", "partition mig"]),
        (VFIO, WHOLE, ["bind driver"]),
        (TDM, MIG, ["partition mig"]),
    ],
    ids=["whole-mig", "mig-vfio", "whole-vfio", "vfio-mig", "vfio-whole", "tdm-mig"],
)
def test_steps_order_the_calls_as_the_runtime_accepts(
    start: Target, target: Target, calls: list[str]
) -> None:
    (change,) = pp.changes([as_target(gpu(0), start)], {0: target})
    assert [f"{s.call} {s.binding or s.target.mode}" for s in pp.steps(change)] == calls


def test_an_unknown_mode_from_a_newer_runtime_is_asked_for_its_target() -> None:
    g = gpu(0, mode="unknown")
    (change,) = pp.changes([g], {0: WHOLE})
    assert change.describe() == "gpu-0: an unknown state → whole"
    assert [s.call for s in pp.steps(change)] == ["partition"]


targets = st.one_of(
    st.just(WHOLE),
    st.just(VFIO),
    st.lists(st.sampled_from(["1g.10gb", "2g.20gb", "3g.40gb"]), min_size=1, max_size=2).map(
        lambda p: Target("mig", profiles=tuple(p))
    ),
    st.lists(st.integers(1, 50), min_size=1, max_size=2).map(
        lambda s: Target("tdm", slices=tuple(s))
    ),
)


@settings(max_examples=200, deadline=None)
@given(start=targets, target=targets)
def test_steps_carry_any_gpu_to_any_target_without_a_call_the_runtime_refuses(
    start: Target, target: Target
) -> None:
    g = as_target(gpu(0), start)
    plan = pp.changes([g], {0: target})
    assert bool(plan) == (start != target)
    for change in plan:
        for step in pp.steps(change):
            if step.call == "partition":
                assert g.binding == "driver", "the Runtime refuses to partition a vfio GPU"
                g = as_target(g, step.target)
            else:
                assert step.binding == "driver" or g.mode == "none", "vfio takes whole GPUs only"
                g = dataclasses.replace(g, binding=step.binding)
    assert pp.current(g) == target


@pytest.mark.parametrize(
    ("g", "target", "binding", "why"),
    [
        (gpu(0, supported_modes=frozenset({"mig"})), TDM, None, "TDM is not supported"),
        (gpu(0, supported_modes=frozenset()), TDM, None, ""),  # an older Runtime answers itself
        (gpu(0), Target("mig", profiles=("3g.40gb", "4g.50gb")), None, "need 90 GiB"),
        (gpu(0, memory_bytes=40 * GIB), MIG, None, "the GPU has 40 GiB"),
        (gpu(0), MIG, None, ""),
        (gpu(0), VFIO, False, "ConfigService.SetDeviceBinding"),
        (gpu(0), VFIO, True, ""),
        (as_target(gpu(0), VFIO), MIG, False, "SetDeviceBinding"),
    ],
    ids=[
        "mode-unsupported",
        "modes-unreported",
        "mig-memory-over",
        "mig-over-smaller-gpu",
        "fits",
        "vfio-without-method",
        "vfio-with-method",
        "unbind-without-method",
    ],
)
def test_what_the_hardware_cannot_take_is_refused(
    g: Gpu, target: Target, binding: bool | None, why: str
) -> None:
    reasons = [w for _, w in pp.refusals(pp.changes([g], {0: target}), binding)]
    if why:
        assert len(reasons) == 1
        assert why in reasons[0]
    else:
        assert reasons == []


def test_the_refusal_names_layout_gpu_and_reason() -> None:
    layout = from_yaml("dense", "- {devices: [1], tdm: [50]}")
    plan = pp.changes([gpu(1, supported_modes=frozenset({"mig"}))], layout.targets([1]))
    message = pp.refusal_message(layout, pp.refusals(plan, None))
    assert message.startswith("layout 'dense' does not fit this node: GPU 1 (gpu-1) → TDM 50%")
    assert message.endswith("nothing was changed")


def test_allocations_of_a_gpu_or_its_partitions_block_only_gpus_to_change() -> None:
    g0 = as_target(gpu(0), Target("tdm", slices=(50, 50)))
    g0 = dataclasses.replace(g0, partition_ids=("gpu-0-tdm-0", "gpu-0-tdm-1"))
    plan = pp.changes([g0, gpu(1), gpu(2)], {0: WHOLE, 1: MIG, 2: WHOLE})
    holdings = [
        Holding("a-2", "ns", "p2", "c", ("gpu-1",)),
        Holding("a-1", "ns", "p1", "c", ("gpu-0-tdm-1",)),
        Holding("a-3", "ns", "p3", "c", ("gpu-2",)),  # gpu-2 stays whole: no block
    ]
    assert [b.describe() for b in pp.blocked(plan, holdings)] == [
        "gpu-0 by ns/p1/c (a-1)",
        "gpu-1 by ns/p2/c (a-2)",
    ]


def test_vm_pods_block_only_vfio_gpus_to_change_in_plan_order() -> None:
    g3, g6, g7 = gpu(3), as_target(gpu(6), VFIO), as_target(gpu(7), VFIO)
    plan = pp.changes([g3, g6, g7, as_target(gpu(5), VFIO)], {3: MIG, 5: VFIO})
    assert [c.gpu.id for c in pp.on_vfio(plan)] == ["gpu-6", "gpu-7"]
    vfio = "aliyun.com/gpu-vfio"
    vms = [
        Holding("", "vms", "vm-b", "compute", ("gpu-7",), vfio),
        Holding("", "vms", "vm-a", "compute", ("gpu-6",), vfio),
        Holding("", "vms", "vm-c", "compute", ("gpu-5",), vfio),  # gpu-5 stays vfio: no block
        # a unit id from before gpu-3 went back to the driver: the Runtime's allocations decide
        Holding("", "vms", "vm-old", "compute", ("gpu-3",), vfio),
    ]
    assert [b.describe() for b in pp.blocked(plan, [], vms)] == [
        "gpu-6 by vms/vm-a/compute (aliyun.com/gpu-vfio)",
        "gpu-7 by vms/vm-b/compute (aliyun.com/gpu-vfio)",
    ]
    runtime = [Holding("a-1", "ns", "p1", "c", ("gpu-3",))]
    assert [b.describe() for b in pp.blocked(plan, runtime, vms[:1])] == [
        "gpu-3 by ns/p1/c (a-1)",
        "gpu-7 by vms/vm-b/compute (aliyun.com/gpu-vfio)",
    ]


def test_the_result_stays_under_the_kubelets_limit_with_many_blocked_gpus() -> None:
    blocked = tuple(f"gpu-{i} by namespace/pod-{i}/container (alloc-{i:06d})" for i in range(1024))
    r = result.Result(
        action="partition",
        node="n",
        succeeded=False,
        reason="AllocationsLive",
        message="x" * 20000,
        agent_version="1",
        blocked_by=blocked,
        devices_changed=tuple(f"gpu-{i}" for i in range(1024)),
    )
    text = r.to_json()
    assert len(text.encode()) <= result.MAX_MESSAGE
    data = json.loads(text)
    assert data["blocked_by"][0] == blocked[0]
    assert data["blocked_by"][-1].startswith("… ")
    assert data["message"].startswith("xxx")
