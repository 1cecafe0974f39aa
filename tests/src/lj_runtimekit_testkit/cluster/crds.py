"""A CRD for the length of a test file: ``installed_crd(cluster, path)`` creates it from its
manifest, waits until the apiserver serves it, and deletes it afterwards (waiting until it is
gone), so that the next file on the worker's shared cluster starts without it. A CRD that was
there already is left as it was: whoever made it answers for it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from lj_runtimekit_testkit.cluster.handle import Cluster


def _established(ext: client.ApiextensionsV1Api, name: str) -> bool:
    crd: Any = ext.read_custom_resource_definition(name)
    conditions = (crd.status.conditions if crd.status else None) or []
    return any(c.type == "Established" and c.status == "True" for c in conditions)


def _gone(ext: client.ApiextensionsV1Api, name: str) -> bool:
    try:
        ext.read_custom_resource_definition(name)
    except ApiException as e:
        if e.status == 404:
            return True
        raise
    return False


def _until(check: Any, what: str, deadline_s: float) -> None:
    deadline = time.monotonic() + deadline_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not within {deadline_s:.0f} s")
        time.sleep(0.1)


@contextmanager
def installed_crd(cluster: Cluster, manifest: Path) -> Iterator[str]:
    """The CRD of ``manifest``, Established, for the ``with`` block; yields its name."""
    body = yaml.safe_load(manifest.read_text())
    name = body["metadata"]["name"]
    with cluster.api_client() as api:
        ext = client.ApiextensionsV1Api(api)
        try:
            ext.create_custom_resource_definition(body)
            made = True
        except ApiException as e:
            if e.status != 409:
                raise
            made = False
        _until(lambda: _established(ext, name), f"the CRD {name} Established", 30)
        try:
            yield name
        finally:
            if made:
                try:
                    ext.delete_custom_resource_definition(name)
                except ApiException as e:
                    if e.status != 404:
                        raise
                _until(lambda: _gone(ext, name), f"the CRD {name} deleted", 60)
