import pytest

from lj_runtimekit_scheduler import gang
from lj_runtimekit_scheduler.model import Pod


def member(i: int, **labels: str) -> Pod:
    return Pod(f"u{i}", "ns", f"m{i}", labels=tuple(sorted(labels.items())))


@pytest.mark.parametrize(
    ("labels", "annotations", "key", "size"),
    [
        ({gang.JOBSET_NAME: "js", gang.JOBSET_REPLICAS: "4"}, {}, "ns/jobset/js/0", 4),
        (
            {gang.JOBSET_NAME: "js", gang.JOBSET_REPLICAS: "4"},
            {"lj-runtimekit-scheduler/pod-group-size": "16"},
            "ns/jobset/js/0",
            16,
        ),
        (
            {},
            {
                "lj-runtimekit-scheduler/pod-group": "g",
                "lj-runtimekit-scheduler/pod-group-size": "3",
            },
            "ns/group/g",
            3,
        ),
        (
            {},
            {
                "lj-runtimekit-scheduler/pod-group": "g",
                "lj-runtimekit-scheduler/pod-group-size": "lots",
            },
            None,
            0,
        ),
        ({}, {}, None, 0),
    ],
    ids=["jobset", "jobset-sized", "pod-group", "bad-size", "lone"],
)
def test_gang_identity(
    labels: dict[str, str], annotations: dict[str, str], key: str | None, size: int
) -> None:
    pod = Pod("u", "ns", "p", labels=tuple(labels.items()), annotations=tuple(annotations.items()))
    g = gang.gang_of(pod)
    assert (g.key if g else None) == key
    if g:
        assert g.size == size


def test_domains_smallest_level_first_then_cluster() -> None:
    labels = {
        "a": {"block": "b1", "rack": "r1"},
        "b": {"block": "b1", "rack": "r2"},
        "c": {"block": "b2", "rack": "r3"},
    }
    d = gang.domains(labels, ["block", "rack"], None)
    assert d[0] == ["a"]
    assert ["a", "b"] in d
    assert d[-1] == ["a", "b", "c"]
    assert gang.domains(labels, ["block", "rack"], "block") == [["c"], ["a", "b"]]


def test_members_already_placed_keep_the_rest_in_their_domains() -> None:
    labels = {
        "a": {"block": "b1", "rack": "r1"},
        "b": {"block": "b1", "rack": "r2"},
        "c": {"block": "b2", "rack": "r3"},
    }
    levels = ["block", "rack"]
    assert gang.domains(labels, levels, None, ["b"]) == [["b"], ["a", "b"], ["a", "b", "c"]]
    assert gang.domains(labels, levels, None, ["a", "b"]) == [["a", "b"], ["a", "b", "c"]]
    # exclusive topology: a member split from its block has no domain left, never another block
    assert gang.domains(labels, levels, "block", ["a", "c"]) == []
    assert gang.domains(labels, levels, "block", ["c"]) == [["c"]]


def test_a_rack_is_a_domain_only_inside_one_block() -> None:
    # rack labels that cut across blocks (or repeat in each block) are not one domain
    labels = {
        "s1": {"block": "small", "rack": "r1"},
        "s2": {"block": "small", "rack": "r1"},
        "b1": {"block": "big", "rack": "r1"},
        "b2": {"block": "big", "rack": "r2"},
        "lone": {"rack": "r2"},
    }
    d = gang.domains(labels, ["block", "rack"], None)
    racks = d[:4]
    assert sorted(map(sorted, racks)) == [["b1"], ["b2"], ["lone"], ["s1", "s2"]]
    assert d[4:] == [["b1", "b2"], ["s1", "s2"], sorted(labels)]


def test_gang_is_placed_whole_in_one_domain_or_not_at_all() -> None:
    capacity = {"a": 1, "b": 1, "c": 2}
    held: dict[str, str] = {}

    def place(p: Pod, nodes: list[str]) -> str | None:
        for n in nodes:
            if capacity[n] > 0:
                capacity[n] -= 1
                held[p.uid] = n
                return n
        return None

    def undo(p: Pod) -> None:
        capacity[held.pop(p.uid)] += 1

    members = [member(i) for i in range(2)]
    got = gang.place_gang(members, [["a"], ["c"], ["a", "b", "c"]], place, undo)
    assert got == {"u0": "c", "u1": "c"}
    capacity.update(a=1, b=1, c=0)
    held.clear()
    three = [member(i) for i in range(3)]
    assert gang.place_gang(three, [["a", "b"]], place, undo) is None
    assert capacity == {"a": 1, "b": 1, "c": 0}


def test_may_hold_is_the_summed_free_capacity() -> None:
    free = [{"aliyun.com/gpu": 8, "cpu": 4000}, {"aliyun.com/gpu": 3, "cpu": 1000}]
    assert gang.may_hold({"aliyun.com/gpu": 11, "cpu": 5000}, free)
    assert not gang.may_hold({"aliyun.com/gpu": 12}, free)
    assert not gang.may_hold({"alibabacloud.com/ppu": 1}, free)  # a resource no node has
    assert gang.may_hold({"alibabacloud.com/ppu": 0}, free)
