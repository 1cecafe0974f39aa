"""The leader-elected host the controller and the operator share: lead, work, give back."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, cast

from tests.shape_tests.canonical import lifecycle, manager
from tests.shape_tests.canonical.leader import Elector


@dataclass(frozen=True)
class Settings:
    identity: str = "replica-0"
    leader_elect: bool = True
    leader_elect_lease_duration: float = 15.0
    leader_elect_renew_deadline: float = 10.0
    leader_elect_retry_period: float = 2.0
    leader_elect_resource_namespace: str = "kube-system"
    leader_elect_resource_name: str = "lj-runtimekit-x"


class FakeElector:
    def __init__(self) -> None:
        self.leading, self.lost = asyncio.Event(), asyncio.Event()
        self.released = False

    async def run(self) -> None:
        self.leading.set()
        await asyncio.Event().wait()

    async def release(self) -> None:
        self.released = True


def test_the_elector_follows_the_shared_flags_and_is_none_without_leader_election() -> None:
    leases: list[tuple[str, str]] = []

    def lease(namespace: str, name: str) -> Any:
        leases.append((namespace, name))
        return object()

    assert manager.elector(Settings(leader_elect=False), lease) is None
    e = manager.elector(Settings(), lease)
    assert e is not None
    assert (e.identity, e.namespace, e.name) == ("replica-0", "kube-system", "lj-runtimekit-x")
    assert (e.lease_duration, e.renew_deadline, e.retry_period) == (15.0, 10.0, 2.0)
    assert leases == [("kube-system", "lj-runtimekit-x")]


async def test_without_an_elector_it_works_at_once_until_stop() -> None:
    m = manager.Manager("x")
    seen: list[object] = []

    def start() -> None:
        seen.append("start")
        m.stop.set()

    code = await m.lead(None, start, seen.append)
    assert (code, seen) == (lifecycle.EXIT_OK, [True, "start", False])


async def test_a_lost_lease_ends_the_work_exits_1_and_the_lease_is_released() -> None:
    m = manager.Manager("x")
    fake = FakeElector()
    work = asyncio.Event()

    async def worker() -> None:
        work.set()
        await asyncio.Event().wait()

    def start() -> None:
        m._spawn("worker", worker())
        asyncio.get_running_loop().call_soon(fake.lost.set)

    code = await m.lead(cast(Elector, fake), start, lambda on: None)
    assert code == lifecycle.EXIT_FAILED
    assert work.is_set()
    assert fake.released
    assert all(t.done() for t in m.running.values())


async def test_a_crashed_task_makes_the_exit_code_1() -> None:
    m = manager.Manager("x")

    async def crash() -> None:
        raise RuntimeError("a bug")

    code = await m.lead(None, lambda: m._spawn("crash", crash()), lambda on: None)
    assert code == lifecycle.EXIT_OK  # the guard set stop
    assert m.health() == "task crash ended"
    assert m.exit_code(code) == lifecycle.EXIT_FAILED
