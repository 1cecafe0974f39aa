"""The offline bundle as an operator receives it (#23 item 3), no cluster: what the tarball holds,
the installer's ``verify``/``list``, its refusal to run when damaged, ``push`` with crane into a
real registry (every image there under the digest MANIFEST.json names), the push tool it picks,
and an image that fails to push named with a non-zero exit."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from lj_runtimekit_testkit.manifests import DEPLOY
from lj_runtimekit_testkit.registry import LocalRegistry
from lj_runtimekit_testkit.suite import INDEX

from .conftest import (
    E_IMAGE,
    E_INTEGRITY,
    E_TOOL,
    E_USAGE,
    PROJECT,
    Bundle,
    copy_run,
    pushed_ref,
    stub_tool,
)

pytestmark = pytest.mark.images


def chart_meta(chart: Path) -> tuple[str, str]:
    text = (chart / "Chart.yaml").read_text()
    name = re.search(r"^name:\s*(\S+)", text, re.MULTILINE)
    version = re.search(r"^version:\s*(\S+)", text, re.MULTILINE)
    assert name, chart
    assert version, chart
    return name.group(1), version.group(1)


def test_the_tarball_holds_the_installer_every_chart_checksums_and_a_manifest(
    bundle: Bundle,
) -> None:
    v = bundle.version
    assert bundle.tarball.name == f"lj-runtimekit-k8s-package.{v}.tar.gz"
    names = {p.name for p in bundle.folder.iterdir()}
    charts = {chart_meta(c.parent) for c in DEPLOY.glob("helm/*/Chart.yaml")}
    assert names == {
        f"lj-runtimekit-k8s-images.{v}.run",
        "MANIFEST.json",
        "SHA256SUMS",
        *(f"{n}-{cv}.tgz" for n, cv in charts),
    }
    # The operator's own check, with the file the bundle ships.
    done = subprocess.run(
        ["sha256sum", "-c", "SHA256SUMS"],
        cwd=bundle.folder,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(done.stdout.splitlines()) == len(names) - 1

    m = bundle.manifest
    built = {e["image"]: e["digest"] for e in json.loads(INDEX.read_text())}
    assert {i["image"]: i["digest"] for i in m["images"]} == built
    for image in m["images"]:
        assert image["image"].endswith(f"/{image['name']}:{image['tag']}")
    assert {(c["name"], c["version"]) for c in m["charts"]} == charts
    assert m["version"] == v
    assert re.fullmatch(r"[0-9a-f]{40}", m["git_commit"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", m["build_time"])


def test_verify_checks_every_archive_and_list_shows_every_image(bundle: Bundle) -> None:
    refs = [i["image"] for i in bundle.manifest["images"]]
    verify = bundle.installer("verify")
    assert verify.returncode == 0, verify.stderr
    assert "payload verified" in verify.stdout
    for image in bundle.manifest["images"]:
        assert f"ok      {image['image']} ({image['archive']}, sha256:{image['sha256']})" in (
            verify.stdout
        )
    listing = bundle.installer("list")
    assert listing.returncode == 0, listing.stderr
    rows = [ln.split() for ln in listing.stdout.splitlines() if ln.split()[0] in refs]
    expected = [(i["image"], i["digest"]) for i in bundle.manifest["images"]]
    assert [(r[0], r[1]) for r in rows] == expected


def test_help_and_usage_errors(bundle: Bundle) -> None:
    done = bundle.installer("--help")
    assert done.returncode == 0
    for word in ("push REGISTRY/PROJECT", "load", "list", "verify", "--tool=NAME", "Exit status"):
        assert word in done.stdout
    assert bundle.installer().returncode == E_USAGE
    no_project = bundle.installer("push", "registry.example.com")
    assert no_project.returncode == E_USAGE
    assert "REGISTRY/PROJECT" in no_project.stderr
    wrong_tool = bundle.installer("load", "--tool=skopeo")
    assert wrong_tool.returncode == E_USAGE
    assert "one of: ctr nerdctl docker" in wrong_tool.stderr


@pytest.mark.parametrize("damage", ["truncated", "one-byte-changed"])
def test_a_damaged_installer_refuses_before_doing_anything(
    bundle: Bundle, registry: LocalRegistry, crane_dir: Path, tmp_path: Path, damage: str
) -> None:
    run = copy_run(bundle, tmp_path / bundle.run.name)
    size = run.stat().st_size
    with run.open("r+b") as f:
        if damage == "truncated":  # a download cut short
            f.truncate(size - 4096)
        else:  # one bit flipped in the middle of the images
            f.seek(size // 2)
            byte = f.read(1)
            f.seek(size // 2)
            f.write(bytes([byte[0] ^ 0x01]))
    project = f"tampered-{damage}"
    try:
        done = bundle.installer(
            "push", f"{registry.address}/{project}", "--tool=crane", "--insecure",
            run=run, path=[crane_dir],
        )  # fmt: skip
        assert done.returncode == E_INTEGRITY, done.stdout + done.stderr
        assert "is damaged" in done.stderr
        assert "download it again" in done.stderr
        assert "pushed" not in done.stdout
        assert not [r for r in registry.repositories() if r.startswith(project)]
        assert bundle.installer("verify", run=run).returncode == E_INTEGRITY
    finally:
        run.unlink()  # 300 MB that pytest would otherwise keep for three runs


def test_push_with_crane_puts_every_image_in_the_registry_under_its_digest(
    bundle: Bundle, registry: LocalRegistry, pushed: subprocess.CompletedProcess[str]
) -> None:
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    for image in bundle.manifest["images"]:
        target = pushed_ref(registry.address, image)
        assert f"pushed  {image['image']} -> {target}" in pushed.stdout
        repository = f"{PROJECT}/{image['name']}"
        assert registry.tags(repository) == [image["tag"]]
        assert registry.manifest_digest(repository, image["tag"]) == image["digest"]
    assert f"every image is in {registry.address}/{PROJECT}" in pushed.stdout


def test_an_image_that_fails_to_push_is_named_and_the_others_still_go(
    bundle: Bundle, registry: LocalRegistry, crane_dir: Path, tmp_path: Path
) -> None:
    # crane as the site has it, except that the registry refuses the scheduler image.
    stub_tool(
        tmp_path / "bin",
        "crane",
        'case "$*" in *lj-runtimekit-scheduler:*) echo "denied: quota exceeded" >&2; exit 1;; '
        "esac\n"
        f'exec "{crane_dir}/crane" "$@"',
    )
    project = "partial"
    done = bundle.installer(
        "push", f"{registry.address}/{project}", "--tool=crane", "--insecure",
        path=[tmp_path / "bin"],
    )  # fmt: skip
    assert done.returncode == E_IMAGE, done.stdout + done.stderr
    (scheduler,) = [i for i in bundle.manifest["images"] if i["name"] == "lj-runtimekit-scheduler"]
    assert f"FAILED {scheduler['image']}: crane could not push it" in done.stderr
    assert "denied: quota exceeded" in done.stderr
    assert f"push failed for: {scheduler['image']}" in done.stderr
    for image in bundle.manifest["images"]:
        repository = f"{project}/{image['name']}"
        expected = None if image is scheduler else image["digest"]
        assert registry.manifest_digest(repository, image["tag"]) == expected


@pytest.mark.parametrize(
    ("daemon_up", "chosen"),
    [(False, "skopeo"), (True, "docker")],
    ids=["docker-without-daemon-skipped", "docker-first"],
)
def test_push_uses_the_first_tool_the_site_has(
    bundle: Bundle, tmp_path: Path, daemon_up: bool, chosen: str
) -> None:
    bin_dir = tmp_path / "bin"
    stub_tool(
        bin_dir,
        "docker",
        f'case "$1" in version) exit {0 if daemon_up else 1};; '
        'load) echo "Loaded image ID: sha256:0123";; esac; exit 0',
    )
    stub_tool(bin_dir, "skopeo", "exit 0")
    stub_tool(bin_dir, "crane", "exit 0")
    done = bundle.installer("push", "registry.example.com:5000/ai", path=[bin_dir], only_path=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"pushing to registry.example.com:5000/ai with {chosen}" in done.stdout
    calls = (bin_dir / "calls.log").read_text().splitlines()
    used = {c.split()[0] for c in calls if not c.startswith("docker version")}
    assert used == {chosen}
    for image in bundle.manifest["images"]:
        target = f"registry.example.com:5000/ai/{image['name']}:{image['tag']}"
        if chosen == "skopeo":
            # The archive copied as is: same manifest, same digest at the site.
            assert any(
                c.startswith("skopeo copy")
                and "--preserve-digests" in c
                and f"/{image['archive']} docker://{target}" in c
                for c in calls
            ), calls
        else:
            assert f"docker tag sha256:0123 {target}" in calls
            assert f"docker push -q {target}" in calls


def test_load_uses_the_first_runtime_tool_and_says_when_there_is_none(
    bundle: Bundle, tmp_path: Path
) -> None:
    bin_dir = tmp_path / "bin"
    stub_tool(bin_dir, "nerdctl", "exit 0")
    stub_tool(bin_dir, "docker", "exit 0")
    done = bundle.installer("load", path=[bin_dir], only_path=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "loading into this node with nerdctl (namespace k8s.io)" in done.stdout
    calls = (bin_dir / "calls.log").read_text().splitlines()
    # Per image: the load, then a look for the image under its reference.
    assert len(calls) == 2 * len(bundle.manifest["images"])
    for image, load, inspect in zip(
        bundle.manifest["images"], calls[::2], calls[1::2], strict=True
    ):
        assert load.startswith("nerdctl --namespace k8s.io load -i ")
        assert load.endswith(f"/{image['archive']}")
        assert inspect == f"nerdctl --namespace k8s.io image inspect {image['image']}"
        assert f"loaded  {image['image']} ({image['digest']}) with nerdctl" in done.stdout

    # A load that exits 0 but leaves no image under the reference fails that image.
    unnamed = tmp_path / "unnamed"
    stub_tool(unnamed, "nerdctl", '[ "$3" = image ] && exit 1; exit 0')
    lost = bundle.installer("load", path=[unnamed], only_path=True)
    assert lost.returncode == E_IMAGE
    (first, *_) = bundle.manifest["images"]
    assert f"FAILED {first['image']}: nerdctl could not load" in lost.stderr
    assert f"{first['image']} is not in namespace k8s.io" in lost.stderr

    none = bundle.installer("load", path=[tmp_path / "empty"], only_path=True)
    assert none.returncode == E_TOOL
    assert "none of ctr nerdctl docker found on PATH" in none.stderr
    asked = bundle.installer("load", "--tool=ctr", path=[bin_dir], only_path=True)
    assert asked.returncode == E_TOOL
    assert "--tool=ctr: ctr is not on PATH" in asked.stderr
