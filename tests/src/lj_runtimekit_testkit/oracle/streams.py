"""List-and-watch streams of raw JSON objects (no client models), for the runner to wait on.

A :class:`Stream` keeps the latest version of every object one list/watch returns, by uid, and
wakes whoever waits on it at each change (a condition variable: waiting costs no polling). A
broken or expired watch lists again; ``close`` ends it.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from typing import Any

Json = dict[str, Any]
Lister = Callable[..., Any]
"""A ``kubernetes`` client list method (e.g. ``CoreV1Api.list_pod_for_all_namespaces``)."""


class Stream:
    def __init__(
        self,
        lister: Lister,
        what: str,
        changed: threading.Condition | None = None,
        **selectors: str,
    ) -> None:
        self.lister, self.what, self.selectors = lister, what, selectors
        self.objects: dict[str, Json] = {}
        self.changed = changed or threading.Condition()
        """Notified at every change; streams given the same one wake the same waiters."""
        self.error: str | None = None
        self._stop = threading.Event()
        self._synced = threading.Event()
        self._resp: Any = None
        self.thread = threading.Thread(target=self._run, name=f"oracle-{what}", daemon=True)
        self.thread.start()
        if not self._synced.wait(60):
            raise TimeoutError(f"the {what} stream did not list within 60 s: {self.error}")

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                rv = self._list()
                self._synced.set()
                while not self._stop.is_set() and rv:
                    rv = self._watch(rv)
                failures = 0
            except Exception as e:  # noqa: BLE001 - a broken stream lists again
                if self._stop.is_set():
                    return
                failures += 1
                self.error = repr(e)[:300]
                time.sleep(min(2.0, 0.1 * 2**failures))

    def _list(self) -> str:
        resp = self.lister(_preload_content=False, **self.selectors)
        body = json.loads(resp.data)
        with self.changed:
            self.objects = {o["metadata"]["uid"]: o for o in body.get("items") or ()}
            self.changed.notify_all()
        return str(body["metadata"].get("resourceVersion") or "")

    def _watch(self, rv: str) -> str:
        """Watch from ``rv``; returns the last version seen ("" to list again)."""
        resp = self.lister(
            watch=True,
            resource_version=rv,
            allow_watch_bookmarks=True,
            timeout_seconds=120,
            _preload_content=False,
            **self.selectors,
        )
        self._resp = resp
        buf = b""
        try:
            for chunk in resp.stream(65536):
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    kind, obj = event.get("type"), event.get("object") or {}
                    if kind == "ERROR":
                        return ""
                    rv = str(obj.get("metadata", {}).get("resourceVersion") or rv)
                    if kind == "BOOKMARK":
                        continue
                    with self.changed:
                        uid = obj["metadata"]["uid"]
                        if kind == "DELETED":
                            self.objects.pop(uid, None)
                        else:
                            self.objects[uid] = obj
                        self.changed.notify_all()
                if self._stop.is_set():
                    return ""
        finally:
            # never back to the pool: a watch left mid-stream has unread bytes
            resp.close()
        return rv

    def wait_for(
        self, what: str, check: Callable[[dict[str, Json]], Any], deadline_s: float
    ) -> Any:
        """Until ``check(objects)`` is truthy (called under the lock at each change); returns
        it. Raises TimeoutError naming ``what``."""
        deadline = time.monotonic() + deadline_s
        with self.changed:
            while not (result := check(self.objects)):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{what} not within {deadline_s:.0f} s")
                self.changed.wait(min(left, 1.0))
            return result

    def snapshot(self) -> list[Json]:
        with self.changed:
            return list(self.objects.values())

    def close(self) -> None:
        self._stop.set()
        resp = self._resp
        if resp is not None:
            with contextlib.suppress(Exception):  # a stream that may be gone already
                resp.shutdown()
        self.thread.join(5)
