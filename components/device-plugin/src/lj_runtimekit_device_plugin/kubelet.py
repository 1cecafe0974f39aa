"""The only module that talks to the kubelet's HTTP side: the read-only ``/pods``."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from .errors import TemporaryError


class PodsUnavailable(TemporaryError):
    """The kubelet's /pods did not answer or answered something else than a PodList."""


#: A node's pod list is a few MiB at most (110 pods of a few KiB): more is not a PodList, and
#: reading it whole would let one bad answer take the plugin's memory.
MAX_PODS_BYTES = 64 << 20


async def kubelet_pods(url: str, timeout_s: float = 2.0) -> list[dict[str, Any]]:
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as http,
            http.get(url) as r,
        ):
            if r.status != 200:
                raise PodsUnavailable(f"kubelet {url} answered {r.status}")
            body = await _read_capped(r, MAX_PODS_BYTES)
            if body is None:
                raise PodsUnavailable(f"kubelet {url} answered more than {MAX_PODS_BYTES} bytes")
            doc = json.loads(body)
    except (aiohttp.ClientError, TimeoutError, ValueError, RecursionError) as e:
        raise PodsUnavailable(
            f"kubelet {url}: {e!r}; is the read-only port open? Otherwise set "
            "--pods-source=apiserver"
        ) from e
    items = doc.get("items") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        raise PodsUnavailable(f"kubelet {url} answered no PodList")
    return [i for i in items if isinstance(i, dict)]


async def _read_capped(response: aiohttp.ClientResponse, cap: int) -> bytes | None:
    """The whole body, or None once it passes ``cap`` bytes. (``content.read(n)`` is not this: it
    returns what has arrived so far, so a pod list longer than one network chunk was cut short.)"""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > cap:
            return None
        chunks.append(chunk)
    return b"".join(chunks)
