"""The oracle's fixtures: our scheduler as a process against the worker's shared cluster, and a
:class:`Harness` for the test file (module scope: the pool of namespaces, the sentinel node and
the streams are made once). Everything the harness makes carries its run label and is deleted
at the end of the file, so the file leaves the cluster as it found it (the file-leak guard of
``lj_runtimekit_testkit.cluster.fixtures`` checks the cluster-scoped kinds; the NodeDevices CRD
goes with the file).

``LJ_ORACLE_SEED`` and ``LJ_ORACLE_CASES`` change the seed and the number of cases (the defaults
are fixed, so every run of the suite runs the same cases); both are printed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from lj_runtimekit_testkit.cluster.crds import installed_crd
from lj_runtimekit_testkit.cluster.handle import Cluster
from lj_runtimekit_testkit.oracle.ours import OursProcess
from lj_runtimekit_testkit.oracle.runner import Harness

CRD = Path(__file__).parents[2] / "deploy" / "crds" / "nodedevices.lj-runtimekit.aliyun.com.yaml"
SEED = int(os.environ.get("LJ_ORACLE_SEED", "35"))
CASES = int(os.environ.get("LJ_ORACLE_CASES", "400"))
WIDTH = 16


@pytest.fixture(scope="module")
def devices_crd(cluster: Cluster) -> Iterator[None]:
    with installed_crd(cluster, CRD):
        yield


@pytest.fixture(scope="module")
def start_ours(
    cluster: Cluster, devices_crd: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., OursProcess]]:
    """``start_ours(name=..., command=...)``: our scheduler as a process, stopped at the end of
    the file."""
    started: list[OursProcess] = []
    logs = tmp_path_factory.mktemp("ours")

    def start(
        name: str = "lj-runtimekit-scheduler", command: tuple[str, ...] | None = None
    ) -> OursProcess:
        kw = {"command": command} if command else {}
        proc = OursProcess(cluster.kubeconfig, logs / f"{name}.log", name, **kw)
        proc.start()
        started.append(proc)
        return proc

    yield start
    for proc in reversed(started):
        proc.stop()


def open_harness(cluster: Cluster, ours: OursProcess, width: int = WIDTH) -> Harness:
    harness = Harness(cluster, ours=ours.scheduler_name, width=width).open()
    try:
        harness.barrier()  # our scheduler is up, its caches synced
    except TimeoutError as e:
        harness.close()
        raise AssertionError(f"{e}; our scheduler's log:\n{ours.tail()}") from e
    return harness


@pytest.fixture(scope="module")
def ours(start_ours: Callable[..., OursProcess]) -> OursProcess:
    return start_ours()


@pytest.fixture(scope="module")
def oracle(cluster: Cluster, ours: OursProcess) -> Iterator[Harness]:
    harness = open_harness(cluster, ours)
    try:
        yield harness
    finally:
        harness.close()
