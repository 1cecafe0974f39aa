"""The containerd config edit on real-world samples: placement, idempotence, exact undo."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lj_runtimekit_job_agent import containerd_config as cc

SAMPLES = Path(__file__).parent / "samples"
GOOD = [
    "v2-nvidia",
    "v2-plain",
    "v3-nvidia",
    "v3-default",
    "v4-containerd2.4-default",
    "v1-legacy",
    "v2-imports",
]


def sample(name: str) -> str:
    return (SAMPLES / f"{name}.toml").read_text()


@pytest.mark.parametrize("name", GOOD, ids=GOOD)
def test_enable_adds_the_guides_handler(name: str) -> None:
    doc = cc.parse(cc.with_handler(sample(name)))
    assert cc.handler_in(doc) == {
        "runtime_type": "io.containerd.runc.v2",
        "container_annotations": ["xdm.amp.com*"],
        "options": {
            "BinaryName": "/usr/local/harp/kitC/xpu-container-runtime",
            "SystemdCgroup": True,
        },
    }


@pytest.mark.parametrize("name", GOOD, ids=GOOD)
def test_ten_enables_equal_one_and_disable_restores_the_bytes(name: str) -> None:
    original = sample(name)
    once = cc.with_handler(original)
    text = once
    for _ in range(10):
        text = cc.with_handler(text)
    assert text == once
    assert cc.without_handler(once) == original
    assert cc.without_handler(original) == original


@pytest.mark.parametrize(
    ("name", "version"),
    [("v1-legacy", 1), ("v2-nvidia", 2), ("v3-nvidia", 3), ("v4-containerd2.4-default", 4)],
    ids=["v1", "v2", "v3", "v4"],
)
def test_version_detected_from_the_file(name: str, version: int) -> None:
    assert cc.version_of(cc.parse(sample(name))) == version


@pytest.mark.parametrize("name", ["v2-nvidia", "v3-nvidia"], ids=["v2", "v3"])
def test_handler_sits_right_after_the_nvidia_section(name: str) -> None:
    lines = cc.with_handler(sample(name)).splitlines()
    headers = [line.strip() for line in lines if line.strip().startswith("[")]
    nvidia = next(i for i, h in enumerate(headers) if h.endswith("nvidia.options]"))
    assert headers[nvidia + 1].endswith("runtimes.lj-runtime]")
    assert "# runc comment" in "\n".join(lines) or name == "v3-nvidia"


def test_comments_and_other_runtimes_are_kept() -> None:
    original = sample("v2-plain")
    edited = cc.with_handler(original)
    for line in original.splitlines():
        assert line in edited.splitlines()
    assert "# keep cgroups with systemd" in edited


def test_a_changed_handler_is_replaced_not_duplicated() -> None:
    edited = cc.with_handler(sample("v2-nvidia"), cc.Handler(binary_name="/old/runtime"))
    fixed = cc.with_handler(edited)
    assert fixed.count("runtimes.lj-runtime]") == 1
    assert "/old/runtime" not in fixed
    assert cc.without_handler(fixed) == sample("v2-nvidia")


@pytest.mark.parametrize(
    "text",
    [sample("malformed"), "version = 9\n", "version = 'two'\n"],
    ids=["broken-toml", "unknown-version", "version-not-a-number"],
)
def test_malformed_config_is_refused(text: str) -> None:
    with pytest.raises(cc.MalformedConfig):
        cc.with_handler(text)


def test_imports_that_are_not_a_list_are_refused() -> None:
    with pytest.raises(cc.MalformedConfig, match="imports must be a list"):
        cc.dropin_dir('imports = "x"\n', "/etc/containerd")


def test_inline_runtimes_cannot_take_a_table_and_are_refused() -> None:
    text = 'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd]\nruntimes = {}\n'
    with pytest.raises(cc.MalformedConfig):
        cc.with_handler(text)


def test_dropin_directory_read_from_imports() -> None:
    assert cc.dropin_dir(sample("v2-imports"), "/etc/containerd") == "/etc/containerd/conf.d"
    assert cc.dropin_dir(sample("v2-nvidia"), "/etc/containerd") is None
    dropin = cc.parse(cc.dropin_text(2))
    assert dropin["version"] == 2
    assert cc.handler_in(dropin) is not None


_comment = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=20)
_name = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True).filter(lambda s: s != "version")


@settings(max_examples=60, deadline=None)
@given(
    comments=st.lists(_comment, max_size=4),
    keys=st.lists(st.tuples(_name, st.integers(-5, 5)), max_size=4, unique_by=lambda t: t[0]),
    version=st.sampled_from([2, 3]),
    nvidia=st.booleans(),
)
def test_round_trip_on_generated_configs(
    comments: list[str], keys: list[tuple[str, int]], version: int, nvidia: bool
) -> None:
    plugin = cc.CRI_PLUGIN[version]
    parts = [f"version = {version}\n"]
    parts += [f"# {c}\n" for c in comments]
    parts += [f"{k} = {v}\n" for k, v in keys]
    if nvidia:
        parts.append(f'[plugins."{plugin}".containerd.runtimes.nvidia]\n  runtime_type = "x"\n')
    parts.append(f'[plugins."{plugin}".containerd.runtimes.runc]  # runc\n  runtime_type = "y"\n')
    original = "".join(parts)
    once = cc.with_handler(original)
    assert cc.with_handler(once) == once
    assert cc.without_handler(once) == original
    assert (
        cc.parse(once)["plugins"][plugin]["containerd"]["runtimes"]["runc"]["runtime_type"] == "y"
    )


RUNC_SYSTEMD = (
    'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]\n'
    "  SystemdCgroup = true\n"
)
RUNC_CGROUPFS = RUNC_SYSTEMD.replace("true", "false")


@pytest.mark.parametrize(
    ("texts", "systemd"),
    [
        ([sample("v2-plain")], True),
        ([sample("v2-nvidia")], False),
        ([sample("v3-nvidia")], False),
        ([sample("v3-default")], False),
        ([sample("v3-default").replace("SystemdCgroup = false", "SystemdCgroup = true")], True),
        ([sample("v1-legacy")], False),
        ([], False),
        ([sample("v2-imports"), RUNC_SYSTEMD], True),
        ([RUNC_SYSTEMD, RUNC_CGROUPFS], False),
        ([RUNC_SYSTEMD, "version = 2\n"], True),
        (
            [
                'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd]\n'
                '  default_runtime_name = "nvidia"\n'
                '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]\n'
                "  SystemdCgroup = true\n"
                '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]\n'
                "  SystemdCgroup = false\n"
            ],
            True,
        ),
    ],
    ids=[
        "v2-runc-systemd",
        "v2-no-runc-options",
        "v3-nvidia-systemd-but-default-runc-says-nothing",
        "v3-containerd2-default-cgroupfs",
        "v3-containerd2-systemd",
        "v1-nothing",
        "no-config",
        "drop-in-says-systemd",
        "later-import-overrides",
        "later-import-silent",
        "default-runtime-nvidia-wins",
    ],
)
def test_systemd_cgroup_follows_the_nodes_own_runc(texts: list[str], systemd: bool) -> None:
    assert cc.node_systemd_cgroup(texts) is systemd


def test_the_handler_carries_the_given_cgroup_driver_and_a_changed_one_is_rewritten() -> None:
    systemd = cc.with_handler(sample("v3-default"), cc.Handler(systemd_cgroup=True))
    cgroupfs = cc.with_handler(systemd, cc.Handler(systemd_cgroup=False))
    handler = cc.handler_in(cc.parse(cgroupfs))
    assert handler is not None
    assert handler["options"]["SystemdCgroup"] is False
    assert cgroupfs.count("runtimes.lj-runtime]") == 1
    assert cc.without_handler(cgroupfs) == sample("v3-default")


OPERATOR_BLOCK = (
    '      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.lj-runtime]\n'
    '        runtime_type = "io.containerd.runc.v2"  # theirs\n'
    '        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.lj-runtime.options]\n'
    '          BinaryName = "/opt/vendor/xpu-container-runtime"\n'
)


def test_an_operators_block_is_told_from_ours() -> None:
    ours = cc.with_handler(sample("v2-nvidia"))
    assert cc.is_ours(ours)
    legacy = ours.replace(f"  {cc.MARK}\n", "").replace(f"{cc.MARK}\n", "")
    assert cc.MARK not in legacy
    assert cc.is_ours(legacy), "a block of an agent before the mark, by its values"
    theirs = cc.with_block(sample("v2-nvidia"), OPERATOR_BLOCK)
    assert not cc.is_ours(theirs)
    assert cc.handler_block(theirs) == OPERATOR_BLOCK
    assert not cc.is_ours(sample("v2-nvidia"))
