"""The apiserver pod source against an apiserver that answers garbage (a small aiohttp fake at
that boundary: the real one never does): the watch retries, and never serves a dead cache."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from lj_runtimekit_exporter.kube import ApiserverPods
from lj_runtimekit_exporter.kubelet import PodsUnavailable

GOOD = {
    "kind": "PodList",
    "apiVersion": "v1",
    "metadata": {"resourceVersion": "1"},
    "items": [{"metadata": {"namespace": "ns", "name": "p", "uid": "u1"}, "status": {}}],
}


@pytest.fixture
async def apiserver(tmp_path: Path) -> AsyncIterator[tuple[str, list[Any]]]:
    """A kubeconfig for a fake apiserver; the list answers each body of ``answers`` in turn
    (the last one repeats); a watch sends the good pod as ADDED and ends."""
    answers: list[Any] = []

    async def pods(request: web.Request) -> web.StreamResponse:
        if "watch" in request.query:
            await asyncio.sleep(0.05)
            pod = {"kind": "Pod", "apiVersion": "v1", **GOOD["items"][0]}  # type: ignore[index]
            pod["metadata"] = {**pod["metadata"], "resourceVersion": "2"}
            line = json.dumps({"type": "ADDED", "object": pod}) + "\n"
            return web.Response(body=line.encode(), content_type="application/json")
        body = answers.pop(0) if len(answers) > 1 else answers[0]
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        return web.Response(body=raw, content_type="application/json")

    app = web.Application()
    app.router.add_get("/api/v1/pods", pods)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
                "users": [{"name": "u", "user": {}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    try:
        yield str(kubeconfig), answers
    finally:
        await runner.cleanup()


async def _names_within(source: ApiserverPods, want: list[str], within_s: float = 20.0) -> None:
    """Poll until the source serves pods named ``want`` (a garbage list may read as no pods
    first: the client turns odd items into empty V1Pods, which are left out)."""
    deadline = asyncio.get_running_loop().time() + within_s
    while True:
        try:
            if [p.name for p in await source.pods()] == want:
                return
        except PodsUnavailable:
            pass
        assert asyncio.get_running_loop().time() < deadline, "no such pod list in time"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize(
    "garbage",
    [
        b"not json",
        {"kind": "PodList", "items": "nope"},
        {"kind": "PodList", "metadata": {}, "items": [{"metadata": {"name": None}}, 7]},
    ],
    ids=["not-json", "items-not-a-list", "odd-items"],
)
async def test_a_garbage_pod_list_is_retried_then_served(
    apiserver: tuple[str, list[Any]], garbage: Any
) -> None:
    kubeconfig, answers = apiserver
    answers[:] = [garbage, GOOD]
    source = ApiserverPods("n1", kubeconfig)
    await source.start()
    try:
        await _names_within(source, ["p"])
        # the watch keeps running (a task that died would leave a stale cache served forever)
        await asyncio.sleep(0.2)
        assert [p.name for p in await source.pods()] == ["p"]
    finally:
        await source.stop()
