"""The controller in the shared shape (issue 21): v1.13's spellings still start it, with a note
naming the new one; the Lease stays where v1.13 kept it; the elector times a Lease by its own
observation, so a replica whose clock runs ahead does not take a live Lease over."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from lj_runtimekit_controller import settings
from lj_runtimekit_controller.errors import ConfigError, TemporaryError
from lj_runtimekit_controller.kube import Conflict, Kube, LeaseObject
from lj_runtimekit_controller.leader import Elector, LeaseConflict, LeaseError

IMAGE = "--job-image=agent:test"


def test_v113_flags_start_it_with_a_note_naming_the_new_flag() -> None:
    s, notes = settings.load_noting(
        [
            IMAGE,
            "--api-qps=5",
            "--api-burst=7",
            "--lease-name=mine",
            "--lease-duration=30",
            "--renew-deadline=20",
            "--retry-period=3",
            "--listen-address=127.0.0.1",
            "--port=9090",
            "--log-format=console",
        ],
        {},
    )
    assert (s.kube_api_qps, s.kube_api_burst) == (5.0, 7)
    assert s.leader_elect_resource_name == "mine"
    assert (
        s.leader_elect_lease_duration,
        s.leader_elect_renew_deadline,
        s.leader_elect_retry_period,
    ) == (30.0, 20.0, 3.0)
    assert s.metrics_bind_address == "127.0.0.1:9090"
    assert (s.listen_address, s.port) == ("127.0.0.1", 9090)
    assert s.log_format == "text"
    assert (
        "flag --api-qps is deprecated: use --kube-api-qps (the old spelling goes in v1.15.0)"
        in notes
    )
    assert "log_format=console is deprecated: use log_format=text" in notes
    assert len(notes) == 9  # eight old flags and one old value


def test_v113_configmap_and_environment_keys_still_work(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    # deploy/controller/01-configmap.yaml of v1.13 says api_qps
    cfg.write_text("version: v1\napi_qps: 20\nlease_duration: 40\nlog_format: json\n")
    env = {"LJ_RUNTIMEKIT_CONTROLLER_API_BURST": "9", "LJ_RUNTIMEKIT_CONTROLLER_PORT": "8081"}
    s, notes = settings.load_noting([IMAGE, f"--config={cfg}"], env)
    assert (s.kube_api_qps, s.kube_api_burst, s.leader_elect_lease_duration) == (20.0, 9, 40.0)
    assert s.metrics_bind_address == "0.0.0.0:8081"
    assert any(n.startswith(f"config file {cfg}: key api_qps is deprecated") for n in notes)
    assert any(
        n.startswith("environment LJ_RUNTIMEKIT_CONTROLLER_API_BURST is deprecated") for n in notes
    )


def test_the_new_spelling_beats_an_old_one_of_a_lower_source(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("version: v1\napi_qps: 1\n")
    s = settings.load([IMAGE, f"--config={cfg}", "--kube-api-qps=3"], {})
    assert s.kube_api_qps == 3.0


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], True),
        (["--leader-elect"], True),
        (["--leader-elect=false"], False),
        (["--leader-elect", "false"], False),
        (["--leader-elect=1"], True),
    ],
)
def test_leader_elect_bare_or_with_a_value(argv: list[str], expected: bool) -> None:
    assert settings.load([IMAGE, *argv], {}).leader_elect is expected


def test_the_lease_stays_in_the_v113_namespace_unless_told() -> None:
    # v1.13 kept the Lease in --namespace: an upgraded replica must contend for the same one.
    assert settings.load([IMAGE], {}).leader_elect_resource_namespace == "kube-system"
    s = settings.load([IMAGE, "--namespace=lj"], {})
    assert (s.namespace, s.leader_elect_resource_namespace) == ("lj", "lj")
    s = settings.load([IMAGE, "--namespace=lj", "--leader-elect-resource-namespace=other"], {})
    assert (s.namespace, s.leader_elect_resource_namespace) == ("lj", "other")


def test_lease_timing_beyond_the_deadline_is_fine_without_leader_election() -> None:
    # v1.13 started a single replica with any retry period; only the elector needs it shorter.
    s = settings.load([IMAGE, "--leader-elect=false", "--leader-elect-retry-period=10"], {})
    assert s.leader_elect_retry_period == 10.0


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--leader-elect-renew-deadline=15"], "renew_deadline must be shorter than"),
        (["--leader-elect-retry-period=10"], "retry_period must be shorter than"),
        (["--metrics-bind-address=8080"], "expected host:port"),
        (["--health-probe-bind-address=:70000"], "expected 0..65535"),
        (["--kube-api-burst=0"], "kube_api_burst 0: expected a positive finite number"),
        (["--leader-elect=yes"], "leader_elect='yes' is not a valid bool"),
    ],
)
def test_a_bad_setting_is_refused_naming_it(argv: list[str], error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        settings.load([IMAGE, *argv], {})


class FakeKube:
    """The Lease calls of :class:`Kube` over one stored Lease."""

    def __init__(self, lease: dict[str, Any] | None, fail: Exception | None = None) -> None:
        self.lease, self.fail = lease, fail
        self.writes: list[dict[str, Any]] = []

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        if self.fail is not None:
            raise self.fail
        return self.lease

    async def create_lease(self, namespace: str, lease: dict[str, Any]) -> dict[str, Any]:
        if self.fail is not None:
            raise self.fail
        self.writes.append(lease)
        return lease

    async def replace_lease(self, namespace: str, lease: dict[str, Any]) -> dict[str, Any]:
        return await self.create_lease(namespace, lease)


def held_by_other(renew_time: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "l", "namespace": "ns", "resourceVersion": "7"},
        "spec": {
            "holderIdentity": "other",
            "leaseDurationSeconds": 15,
            "renewTime": renew_time,
            "acquireTime": renew_time,
            "leaseTransitions": 2,
        },
    }


def elector(kube: FakeKube, now: list[float]) -> Elector:
    return Elector(
        LeaseObject(cast(Kube, kube), "ns", "l"),
        "me",
        namespace="ns",
        name="l",
        clock=lambda: now[0],
    )


async def test_a_live_lease_with_an_old_renew_time_is_not_taken_over() -> None:
    # The holder's clock is an hour behind ours (or ours ahead): by our wall clock its renewTime
    # expired long ago. v1.13's elector compared the two clocks and took the Lease: two leaders.
    now = [100.0]
    kube = FakeKube(held_by_other("2020-01-01T00:00:00.000000Z"))
    e = elector(kube, now)
    assert not await e.try_acquire_or_renew()
    now[0] += 10.0
    kube.lease = held_by_other("2020-01-01T00:00:02.000000Z")  # the holder renewed
    assert not await e.try_acquire_or_renew()
    now[0] += 14.0  # 14 s since we saw it change: still live
    assert not await e.try_acquire_or_renew()
    assert kube.writes == []
    now[0] += 1.5  # unchanged for a whole lease duration by our own clock: taken over
    assert await e.try_acquire_or_renew()
    (written,) = kube.writes
    assert written["spec"]["holderIdentity"] == "me"
    assert written["spec"]["leaseTransitions"] == 3


@pytest.mark.parametrize(
    ("error", "expected"),
    [(Conflict("409"), LeaseConflict), (TemporaryError("503"), LeaseError)],
)
async def test_the_lease_adapter_speaks_the_electors_errors(
    error: Exception, expected: type[Exception]
) -> None:
    lease = LeaseObject(cast(Kube, FakeKube(None, fail=error)), "ns", "l")
    with pytest.raises(expected):
        await lease.create({"metadata": {"name": "l"}})
    with pytest.raises(LeaseError):
        await lease.get()
