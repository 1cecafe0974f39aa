from lj_runtimekit_scheduler import gang
from lj_runtimekit_scheduler.model import Pod
from lj_runtimekit_scheduler.queue import SchedulingQueue


def p(uid: str, priority: int = 0) -> Pod:
    return Pod(uid, "ns", uid, priority=priority)


def test_higher_priority_first_then_oldest() -> None:
    q = SchedulingQueue()
    q.add(p("a"), 0)
    q.add(p("b", 10), 1)
    q.add(p("c"), 2)
    assert [q.pop(3).uid for _ in range(3)] == ["b", "a", "c"]  # type: ignore[union-attr]
    assert q.pop(3) is None


def test_failed_pod_backs_off_exponentially_and_caps() -> None:
    q = SchedulingQueue(backoff_initial_s=1, backoff_max_s=4)
    q.add(p("a"), 0)
    delays = []
    now = 0.0
    for _ in range(4):
        assert q.pop(now) is not None
        ready = q.failed("a", now, unschedulable=False)
        delays.append(ready - now)
        assert q.pop(ready - 0.01) is None
        now = ready
    assert delays == [1, 2, 4, 4]


def test_unschedulable_pod_waits_for_an_event_or_the_retry() -> None:
    q = SchedulingQueue(backoff_initial_s=1, unschedulable_retry_s=60)
    q.add(p("a"), 0)
    q.pop(0)
    q.failed("a", 0, unschedulable=True)
    assert q.pop(5) is None
    assert q.cluster_changed(5) == 1
    assert q.pop(5) is not None
    q.failed("a", 5, unschedulable=True)
    assert q.pop(64) is None
    assert q.pop(65) is not None


def test_a_pod_an_event_unparked_is_tried_before_its_backoff_ends_when_nothing_is_active() -> None:
    # kube-scheduler's SchedulerPopFromBackoffQ (KEP-5142): a preemptor parked after evicting
    # its victims is tried as soon as their deletion arrives, not a backoff later
    q = SchedulingQueue(backoff_initial_s=1, unschedulable_retry_s=60)
    q.add(p("a"), 0)
    q.add(p("b", 10), 0)
    for uid in ("b", "a"):
        assert q.pop(0).uid == uid  # type: ignore[union-attr]
        q.failed(uid, 0, unschedulable=True)
    assert q.pop(0.1) is None  # parked: no event yet
    q.add(p("c"), 0.1)
    assert q.cluster_changed(0.1) == 2
    assert q.pop(0.1).uid == "c"  # type: ignore[union-attr]  # an active pod goes first
    assert q.pop(0.1).uid == "b"  # type: ignore[union-attr]  # then the moved, by priority
    assert q.pop(0.1).uid == "a"  # type: ignore[union-attr]
    assert q.pop(0.1) is None
    q.failed("a", 0.2, unschedulable=False)  # an error: it waits its backoff out
    assert q.pop(0.3) is None
    assert q.pop(2.2).uid == "a"  # type: ignore[union-attr]


def test_depth_and_done() -> None:
    q = SchedulingQueue()
    q.add(p("a"), 0)
    q.add(p("b"), 0)
    assert q.depth()["active"] == 2
    pod = q.pop(0)
    assert pod is not None
    q.done(pod.uid)
    assert len(q) == 1


def test_a_gang_s_pending_members_are_found_in_any_sub_queue() -> None:
    def member(uid: str, group: str) -> Pod:
        return Pod(
            uid,
            "ns",
            uid,
            annotations=(
                ("lj-runtimekit-scheduler/pod-group", group),
                ("lj-runtimekit-scheduler/pod-group-size", "3"),
            ),
        )

    q = SchedulingQueue()
    for uid in ("a", "b", "c"):
        q.add(member(uid, "g"), 0)
    q.add(p("lone"), 0)
    gid = gang.gang_of(member("a", "g"))
    assert gid is not None
    first = q.pop(0)
    assert first is not None
    assert first.uid == "a"  # in flight
    q.failed("b", 0, unschedulable=True)  # parked
    assert [m.uid for m in q.gang_members(gid)] == ["a", "b", "c"]
    q.add(member("c", "other"), 1)  # its group changed
    q.delete("b")
    assert [m.uid for m in q.gang_members(gid)] == ["a"]
    q.done("a")
    assert q.gang_members(gid) == []


def test_a_pod_placed_unparks_only_the_pods_whose_required_affinity_waits_for_pods() -> None:
    # kube-scheduler's queueing hint of InterPodAffinity: an assigned pod added may make a pod
    # with required pod affinity schedulable; the others stay parked until their own events
    from lj_runtimekit_scheduler import objects

    term = {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "zone"}
    spec = {
        "containers": [],
        "affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}},
    }
    waiting = objects.pod({"metadata": {"uid": "w", "name": "w"}, "spec": spec})
    q = SchedulingQueue(backoff_initial_s=1, unschedulable_retry_s=60)
    q.add(waiting, 0)
    q.add(p("plain"), 0)
    for _ in range(2):
        got = q.pop(0)
        assert got is not None
        q.failed(got.uid, 0, unschedulable=True)
    assert q.pod_placed(5) == 1
    assert [q.pop(5) for _ in range(2)] == [waiting, None]
    assert q.pod_placed(5) == 0, "told once"
