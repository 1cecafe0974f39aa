"""pytest fixtures of the cluster part of the harness: ``cluster`` (session) and ``namespace``.

A failed test that used ``cluster`` gets the tail of every binary's log in its report.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Generator, Iterator

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from lj_runtimekit_testkit.cluster.binaries import BinariesMissing
from lj_runtimekit_testkit.cluster.handle import Cluster
from lj_runtimekit_testkit.cluster.launcher import ControlPlane


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A local control plane (etcd, apiserver with RBAC, KCM, scheduler, kwok) for the session."""
    control_plane = ControlPlane(work_dir=tmp_path_factory.mktemp("cluster"))
    try:
        control_plane.start()
    except BinariesMissing as e:
        pytest.fail(str(e), pytrace=False)
    try:
        yield Cluster.from_control_plane(control_plane)
    finally:
        control_plane.stop()


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    """A fresh namespace whose ``default`` service account exists (pods can be created)."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    with cluster.api_client() as api:
        core = client.CoreV1Api(api)
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
        _wait_default_service_account(core, name)
        try:
            yield name
        finally:
            try:
                core.delete_namespace(name)
            except ApiException as e:
                if e.status != 404:
                    raise


def _wait_default_service_account(
    core: client.CoreV1Api, name: str, deadline_s: float = 30.0
) -> None:
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            core.read_namespaced_service_account("default", name)
            return
        except ApiException as e:
            if e.status != 404:
                raise
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"service account default/{name} not created within {deadline_s:.0f} s: "
                "check the kube-controller-manager log"
            )
        time.sleep(0.05)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if not report.failed:
        return
    funcargs = getattr(item, "funcargs", {})
    handle = funcargs.get("cluster")
    if isinstance(handle, Cluster):
        report.sections.append(("control plane logs", handle.log_tails()))
