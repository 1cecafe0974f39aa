"""``pods_source: auto`` (issue 39): the kubelet's /pods while it answers, the apiserver's list
while it does not, and the kubelet again once it answers; each change one log line."""

from __future__ import annotations

import socket
from collections.abc import MutableMapping
from typing import Any

import pytest
from structlog.testing import capture_logs

from lj_runtimekit_device_plugin import node
from lj_runtimekit_device_plugin.kube import ApiserverUnavailable
from lj_runtimekit_device_plugin.kubelet import PodsUnavailable, kubelet_pods
from lj_runtimekit_device_plugin.pods_source import FallbackPods
from lj_runtimekit_device_plugin.podview import PodView
from lj_runtimekit_device_plugin.settings import Settings


def _pod(name: str) -> PodView:
    return PodView("work", name, f"uid-{name}", "1", {}, {})


class Source:
    """A pod lister that answers ``pods`` or raises ``error``, counting its calls."""

    def __init__(self, pods: list[PodView], error: Exception | None = None) -> None:
        self.pods, self.error, self.calls = pods, error, 0

    async def __call__(self) -> list[PodView]:
        self.calls += 1
        if self.error is not None:
            raise self.error
        return self.pods


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port  # closed again: a connect is refused, as with readOnlyPort 0


def _events(logs: list[MutableMapping[str, Any]], name: str) -> list[MutableMapping[str, Any]]:
    return [e for e in logs if e["event"] == name]


async def test_the_kubelet_is_used_while_it_answers_and_the_apiserver_is_not_asked() -> None:
    kubelet, apiserver = Source([_pod("a")]), Source([_pod("b")])
    pods = FallbackPods(kubelet, apiserver, node="n1")
    with capture_logs() as logs:
        assert await pods() == [_pod("a")]
        assert await pods() == [_pod("a")]
    assert (kubelet.calls, apiserver.calls) == (2, 0)
    assert pods.source == "kubelet"
    [chosen] = _events(logs, "pods_source")
    assert (chosen["source"], chosen["node"], chosen["was"]) == ("kubelet", "n1", None)


async def test_a_closed_read_only_port_falls_back_to_the_apiserver_and_says_why() -> None:
    url = f"http://127.0.0.1:{_closed_port()}/pods"

    async def kubelet() -> list[PodView]:
        await kubelet_pods(url, 2.0)
        raise AssertionError("a closed port answered")

    apiserver = Source([_pod("b")])
    pods = FallbackPods(kubelet, apiserver, node="n1")
    with capture_logs() as logs:
        assert await pods() == [_pod("b")]
    assert pods.source == "apiserver"
    [chosen] = _events(logs, "pods_source")
    assert chosen["source"] == "apiserver"
    assert url in chosen["why"], chosen


async def test_the_kubelet_is_asked_again_after_the_retry_and_used_once_it_answers() -> None:
    clock = Clock()
    kubelet = Source([_pod("a")], PodsUnavailable("kubelet http://localhost:10255/pods: refused"))
    apiserver = Source([_pod("b")])
    pods = FallbackPods(kubelet, apiserver, node="n1", retry_s=60.0, clock=clock)
    with capture_logs() as logs:
        assert await pods() == [_pod("b")]
        clock.now += 59.0
        assert await pods() == [_pod("b")]
        assert kubelet.calls == 1, "the kubelet is not asked again inside the retry"
        clock.now += 1.0
        kubelet.error = None
        assert await pods() == [_pod("a")]
    assert (kubelet.calls, apiserver.calls) == (2, 2)
    assert [(e["source"], e["was"]) for e in _events(logs, "pods_source")] == [
        ("apiserver", None),
        ("kubelet", "apiserver"),
    ]


async def test_neither_answering_is_pods_unavailable_naming_both_logged_once() -> None:
    clock = Clock()
    kubelet = Source([], PodsUnavailable("kubelet: refused"))
    apiserver = Source([], ApiserverUnavailable("listing pods of node n1: 503 Unavailable"))
    pods = FallbackPods(kubelet, apiserver, node="n1", retry_s=60.0, clock=clock)
    with capture_logs() as logs:
        for _ in range(3):
            with pytest.raises(PodsUnavailable) as e:
                await pods()
            clock.now += 30.0
    assert "kubelet: refused" in str(e.value) or "not asked" in str(e.value)
    assert "503 Unavailable" in str(e.value)
    assert len(_events(logs, "pods_source_unavailable")) == 1
    assert pods.source == "none"
    apiserver.error = None
    apiserver.pods = [_pod("b")]
    with capture_logs() as logs:
        assert await pods() == [_pod("b")]
    assert [e["source"] for e in _events(logs, "pods_source")] == ["apiserver"]


def test_auto_is_the_default_and_needs_the_apiserver_to_fall_back() -> None:
    s = Settings(node_name="n1")
    assert s.pods_source == "auto"
    assert isinstance(node._pod_lister(s, object()), FallbackPods)
    without_api = node._pod_lister(s, None)
    assert without_api is not None
    assert not isinstance(without_api, FallbackPods)
    assert not isinstance(
        node._pod_lister(Settings(node_name="n1", pods_source="kubelet"), object()), FallbackPods
    )
    assert node._pod_lister(Settings(node_name="n1", pods_source="apiserver"), None) is None
