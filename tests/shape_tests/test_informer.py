"""The shared informer: the list replayed as events, the watch resumed from its resourceVersion,
410 lists again, other failures back off (1 s, ×2, 30 s) and show in ``failing``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from tests.shape_tests.canonical.informer import Informer, backoff_s, resource_version

Obj = dict[str, Any]


class Gone(Exception):
    pass


class Temporary(Exception):
    pass


class Stop(Exception):
    """Ends the test's run (not in ``retry``: it propagates, as a bug would)."""


def obj(name: str, rv: str) -> Obj:
    return {"metadata": {"name": name, "resourceVersion": rv}}


class Source:
    """Scripted apiserver: each list or watch call takes the next step of its script; a step is
    an exception to raise, or what to return (a list) or yield (a watch)."""

    def __init__(self, lists: list[Any], watches: list[Any]) -> None:
        self.lists, self.watches = lists, watches
        self.watched_from: list[str] = []
        self.log: list[str] = []

    async def list_(self) -> tuple[Sequence[Obj], str]:
        if not self.lists:
            raise Stop
        step = self.lists.pop(0)
        self.log.append("list")
        if isinstance(step, BaseException):
            raise step
        items, rv = step
        return items, rv

    async def watch(self, rv: str) -> AsyncIterator[tuple[str, Obj]]:
        self.watched_from.append(rv)
        if not self.watches:
            raise Stop
        step = self.watches.pop(0)
        for event in step if isinstance(step, list) else [step]:
            if isinstance(event, BaseException):
                raise event
            yield event


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self.relisted: list[list[str]] = []
        self.slept: list[float] = []
        self.errors: list[BaseException] = []

    def on_event(self, kind: str, o: Obj) -> None:
        self.events.append((kind, o["metadata"]["name"]))

    def on_relist(self, items: Sequence[Obj]) -> None:
        self.relisted.append([i["metadata"]["name"] for i in items])

    async def sleep(self, delay: float) -> None:
        self.slept.append(delay)


def informer(source: Source, rec: Recorder, **kw: Any) -> Informer[Obj]:
    return Informer(
        "nodes",
        source.list_,
        source.watch,
        rec.on_event,
        on_relist=rec.on_relist,
        gone=(Gone,),
        retry=(Temporary,),
        sleep=rec.sleep,
        **kw,
    )


async def test_the_list_is_replayed_as_added_events_after_on_relist() -> None:
    source = Source([([obj("a", "3"), obj("b", "5")], "7")], [])
    rec = Recorder()
    inf = informer(source, rec)
    with pytest.raises(Stop):
        await inf.run()
    assert rec.relisted == [["a", "b"]]
    assert rec.events == [("ADDED", "a"), ("ADDED", "b")]
    assert inf.synced.is_set()
    assert source.watched_from == ["7"]


async def test_the_watch_resumes_from_the_last_resource_version_and_skips_bookmarks() -> None:
    source = Source(
        [([], "10")],
        [
            [("ADDED", obj("a", "11")), ("MODIFIED", obj("a", "12"))],
            [("BOOKMARK", obj("", "15"))],
            [("DELETED", obj("a", "16"))],
        ],
    )
    rec = Recorder()
    with pytest.raises(Stop):
        await informer(source, rec).run()
    assert source.watched_from == ["10", "12", "15", "16"]
    assert rec.events == [("ADDED", "a"), ("MODIFIED", "a"), ("DELETED", "a")]
    assert source.log == ["list"]  # a stream that ends by itself is watched again, not relisted
    assert rec.slept == []


async def test_410_lists_again_at_once_and_watches_from_the_new_list() -> None:
    source = Source(
        [([obj("a", "1")], "10"), ([obj("b", "20")], "30")],
        [[("MODIFIED", obj("a", "11")), Gone("too old")]],
    )
    rec = Recorder()
    inf = informer(source, rec)
    with pytest.raises(Stop):
        await inf.run()
    assert source.watched_from == ["10", "30"]
    assert rec.relisted == [["a"], ["b"]]
    assert rec.events == [("ADDED", "a"), ("MODIFIED", "a"), ("ADDED", "b")]
    assert rec.slept == []
    assert inf.lists == 2


async def test_failures_back_off_show_in_failing_and_a_clean_stream_resets_the_backoff() -> None:
    failures = [Temporary(f"apiserver unreachable {i}") for i in range(7)]
    source = Source([*failures, ([], "1"), ([], "2")], [[], Temporary("stream broke")])
    rec = Recorder()
    inf = informer(source, rec, on_error=rec.errors.append)
    seen: list[str | None] = []
    real = rec.sleep

    async def sleep(delay: float) -> None:
        seen.append(inf.failing)
        await real(delay)

    inf._sleep = sleep
    with pytest.raises(Stop):
        await inf.run()
    assert rec.slept == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 1.0]
    assert seen[0] == "apiserver unreachable 0"
    assert seen[-1] == "stream broke"
    assert rec.errors == [*failures, rec.errors[-1]]
    assert source.log.count("list") == 9  # every failure lists again
    assert inf.failing is None  # the last list worked


async def test_resume_after_error_watches_on_from_the_last_version_without_a_list() -> None:
    source = Source(
        [([], "10")],
        [[("ADDED", obj("a", "11")), Temporary("stream broke")], [("MODIFIED", obj("a", "12"))]],
    )
    rec = Recorder()
    inf = informer(source, rec, resume_after_error=True)
    with pytest.raises(Stop):
        await inf.run()
    assert source.log == ["list"]
    assert source.watched_from == ["10", "11", "12"]
    assert rec.slept == [1.0]
    assert inf.failing is None  # an event cleared it


async def test_an_unexpected_error_propagates_to_the_task_guard() -> None:
    source = Source([ValueError("a bug")], [])
    with pytest.raises(ValueError, match="a bug"):
        await informer(source, Recorder()).run()


def test_the_backoff_and_the_resource_version_of_json_and_of_client_models() -> None:
    assert [backoff_s(n) for n in (1, 2, 3, 5, 6, 100)] == [1.0, 2.0, 4.0, 16.0, 30.0, 30.0]

    class Meta:
        resource_version = "42"

    class Model:
        metadata = Meta()

    assert resource_version(obj("a", "7")) == "7"
    assert resource_version(Model()) == "42"
    assert resource_version({"metadata": None}) is None
    assert resource_version(object()) is None
