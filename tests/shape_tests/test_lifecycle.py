"""The shared lifecycle: a failed task ends the daemon with 1, a signal with 0, a second signal
at once with 130."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from tests.shape_tests.canonical import lifecycle


async def test_a_failed_task_stops_the_rest_and_says_which() -> None:
    tasks = lifecycle.Tasks()
    ended: list[str] = []

    async def forever(name: str) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            ended.append(name)

    async def broken() -> None:
        raise RuntimeError("socket gone")

    tasks.spawn("first", forever("first"))
    tasks.spawn("second", forever("second"))
    tasks.spawn("broken", broken())
    await asyncio.wait_for(tasks.wait(), 5)
    assert tasks.fatal == "task broken failed: RuntimeError('socket gone')"
    await tasks.cancel()
    assert ended == ["second", "first"]  # the last started is stopped first


async def test_a_task_that_ends_on_its_own_is_not_a_failure() -> None:
    tasks = lifecycle.Tasks()

    async def done() -> None:
        return None

    await tasks.spawn("once", done())
    assert not tasks.stop.is_set()
    assert tasks.fatal == ""


async def test_one_signal_stops_a_second_exits_130_at_once() -> None:
    stop = asyncio.Event()
    forced: list[int] = []
    exited = asyncio.Event()

    def forced_exit(code: int) -> None:
        forced.append(code)
        exited.set()

    lifecycle.on_signals(stop, forced=forced_exit)
    loop = asyncio.get_running_loop()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(stop.wait(), 5)
        assert forced == []
        os.kill(os.getpid(), signal.SIGINT)
        await asyncio.wait_for(exited.wait(), 5)
        assert forced == [lifecycle.EXIT_FORCED] == [130]
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


@pytest.mark.parametrize(("fails", "code"), [(False, 0), (True, 1)], ids=["signal", "failure"])
def test_run_exits_0_after_a_stop_and_1_after_a_failed_task(fails: bool, code: int) -> None:
    async def main(tasks: lifecycle.Tasks) -> None:
        async def work() -> None:
            if fails:
                raise OSError("kubelet directory missing")
            tasks.stop.set()  # what a signal does

        tasks.spawn("work", work())
        await tasks.wait()
        await tasks.cancel()

    assert lifecycle.run(main, name="test") == code
