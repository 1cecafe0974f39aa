"""Every refusal at bind time is a Warning FailedScheduling Event on the pod, worded as
kube-scheduler words a failed binding cycle (``running Bind plugin "DefaultBinder": ...``), with
the apiserver's own message; a bind refused at every retry is one Event whose count grows
(issue 34, item 2)."""

from __future__ import annotations

import asyncio
import json

import pytest

from lj_runtimekit_scheduler import kube, objects
from lj_runtimekit_scheduler.errors import PermanentError, TemporaryError
from lj_runtimekit_scheduler.events import EventRecorder
from lj_runtimekit_scheduler.framework import OK, CycleState, Profile, Status, fail
from lj_runtimekit_scheduler.metrics import Metrics
from lj_runtimekit_scheduler.model import Device, Pod
from lj_runtimekit_scheduler.plugins import default_binder
from lj_runtimekit_scheduler.profile import build_profile
from lj_runtimekit_scheduler.queue import SchedulingQueue
from lj_runtimekit_scheduler.scheduler import Scheduler
from lj_runtimekit_scheduler.settings import Settings
from lj_runtimekit_scheduler.state import ClusterState

CONFLICT = json.dumps(
    {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": 'Operation cannot be fulfilled on pods/binding "p": pod p is already '
        'assigned to node "n2"',
        "reason": "Conflict",
        "code": 409,
    }
).encode()


class Refusing:
    """The apiserver side: every Binding refused with ``error``; Events kept by reason."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.binds = 0
        self.events: list[tuple[str, str, str]] = []

    async def bind(self, pod: Pod, node: str, annotations: dict[str, str]) -> None:
        self.binds += 1
        raise self.error

    def event(self, pod: Pod, kind: str, reason: str, message: str) -> None:
        self.events.append((pod.name, reason, message))


class PreBindFails:
    NAME = "ClaimWriter"

    def __init__(self, outcome: Status | Exception) -> None:
        self.outcome = outcome

    async def pre_bind(self, cs: CycleState, pod: Pod, node: str, binder: object) -> Status:
        if isinstance(self.outcome, Exception):
            raise self.outcome
        return self.outcome


def gpu_node() -> dict[str, object]:
    return {
        "metadata": {"name": "n1", "labels": {"lj_runtimekit_enable": "true"}},
        "status": {
            "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110", "aliyun.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def one_pod() -> Pod:
    limits = {"aliyun.com/gpu": "1"}
    return objects.pod(
        {
            "metadata": {"uid": "u1", "name": "p", "namespace": "ns"},
            "spec": {
                "schedulerName": "lj-runtimekit-scheduler",
                "containers": [{"name": "main", "resources": {"limits": limits}}],
            },
        }
    )


def setup(edge: Refusing, profile: Profile | None = None) -> Scheduler:
    state = ClusterState()
    state.set_node(objects.node(gpu_node()))
    state.set_devices("n1", tuple(Device(f"gpu-{i}", "GPU", 80, True, 0, 0, i) for i in range(8)))
    cfg = Settings(leader_elect=False)
    metrics = Metrics()
    return Scheduler(
        cfg,
        state=state,
        queue=SchedulingQueue(),
        profile=profile or build_profile(cfg, state, metrics),
        binder=edge,
        recorder=edge,
        metrics=metrics,
    )


async def attempt(sched: Scheduler, at: float) -> None:
    """One try of the pod at time ``at`` (the scheduler's clock), after any backoff ended."""
    sched.clock = lambda: at
    sched.queue.flush(at)
    pod = sched.queue.pop(at)
    assert pod is not None, "the pod is back in the queue after its failed binding"
    sched.schedule(pod)
    await sched.drain()


def test_the_apiserver_s_refusal_is_its_status_message() -> None:
    error = kube._error(409, CONFLICT, "bind pod ns/p to n1")
    assert isinstance(error, PermanentError)
    assert str(error) == (
        "bind pod ns/p to n1: apiserver answered 409: Conflict: Operation cannot be fulfilled "
        'on pods/binding "p": pod p is already assigned to node "n2"'
    )
    # not a Status (a proxy's page): the body's start, as before
    assert "answered 502: <html>" in str(kube._error(502, b"<html>bad gateway", "bind"))


async def test_a_binding_the_apiserver_refuses_is_told_naming_the_bind_plugin() -> None:
    edge = Refusing(kube._error(409, CONFLICT, "bind pod ns/p to n1"))
    sched = setup(edge)
    sched.queue.add(one_pod(), 0)
    await attempt(sched, 0)
    ((pod, reason, message),) = edge.events
    assert (pod, reason) == ("p", "FailedScheduling")
    assert message.startswith('binding to n1: running Bind plugin "DefaultBinder": bind pod ns/p')
    assert 'pod p is already assigned to node "n2"' in message
    assert "{" not in message, "the apiserver's message, not its JSON"
    assert sched.state.assumed == {}, "the assumption is undone"
    assert "gpu-0" not in sched.state.nodes["n1"].device_use


@pytest.mark.parametrize(
    ("outcome", "said"),
    [
        (fail("quota for ResourceClaims exceeded"), "quota for ResourceClaims exceeded"),
        (TemporaryError("create a ResourceClaim in ns: apiserver unreachable"), "unreachable"),
        (KeyError("metadata"), "unexpected error, see the scheduler's log: KeyError('metadata')"),
    ],
    ids=["refuses", "raises-apiserver-error", "crashes"],
)
async def test_a_failing_pre_bind_is_told_naming_the_plugin_and_the_pod_is_tried_again(
    outcome: Status | Exception, said: str
) -> None:
    # a crash used to end the bind task silently: the pod stayed assumed for ever, unbound
    edge = Refusing(TemporaryError("never reached"))
    sched = setup(edge)
    sched.profile = Profile([(PreBindFails(outcome), 0), (default_binder.new(), 0)])
    sched.queue.add(one_pod(), 0)
    await attempt(sched, 0)
    ((_, reason, message),) = edge.events
    assert reason == "FailedScheduling"
    assert message.startswith('binding to n1: running PreBind plugin "ClaimWriter": ')
    assert said in message
    assert edge.binds == 0, "no Binding after a failed PreBind"
    assert sched.state.assumed == {}
    assert sched.queue.pop(100.0) is not None, "tried again after its backoff"


class Sink:
    """The apiserver's Event objects: name → [reason, note, count]."""

    def __init__(self) -> None:
        self.objects: dict[str, list[object]] = {}
        self.writes = 0

    async def event(self, pod: Pod, kind: str, reason: str, message: str, count: int = 1) -> str:
        self.writes += 1
        name = f"{pod.name}.{len(self.objects)}"
        self.objects[name] = [reason, message, count]
        return name

    async def event_series(self, pod: Pod, name: str, count: int) -> None:
        self.writes += 1
        self.objects[name][2] = count


async def test_a_bind_refused_at_every_retry_is_one_event_whose_count_grows() -> None:
    edge = Refusing(kube._error(422, b'{"message": "denied by policy"}', "bind pod ns/p to n1"))
    sched = setup(edge)
    sink = Sink()
    sched.recorder = recorder = EventRecorder(sink, interval_s=0.01)
    sched.queue.add(one_pod(), 0)
    for i in range(30):  # a retry storm: each attempt refused again
        await attempt(sched, 100.0 * i)
        await asyncio.sleep(0.002)
    await recorder.drain()
    assert edge.binds == 30
    ((reason, note, count),) = sink.objects.values()
    assert reason == "FailedScheduling"
    assert "denied by policy" in str(note)
    assert count == 30
    assert sink.writes < 30, "repeats raise the count of one Event, not one write each"
    await recorder.close()


async def test_a_bind_plugin_status_that_refuses_is_named_too() -> None:
    class Refuses:
        NAME = "Picky"

        async def bind(self, cs: CycleState, pod: Pod, node: str, binder: object) -> Status:
            return fail("node n1 is draining")

    class Never:
        NAME = "Never"

        async def pre_bind(self, cs: CycleState, pod: Pod, node: str, binder: object) -> Status:
            return OK

    edge = Refusing(TemporaryError("never reached"))
    sched = setup(edge, Profile([(Never(), 0), (Refuses(), 0)]))
    sched.queue.add(one_pod(), 0)
    await attempt(sched, 0)
    ((_, _, message),) = edge.events
    assert message == 'binding to n1: running Bind plugin "Picky": node n1 is draining'
