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
            body = await r.content.read(MAX_PODS_BYTES + 1)
            if len(body) > MAX_PODS_BYTES:
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
