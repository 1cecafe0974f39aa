"""The installer's ``push`` with the real skopeo and podman of the machine's packages (#23 item 3),
each alone among the push tools on PATH so that the installer picks it itself, into a registry of
its own (the harness' CNCF distribution registry on loopback, plain HTTP, so ``--insecure``), with
no blob already there to reuse. Read back from the registry's API: every image under its tag, as
the same image that was built (its config digest, every layer's blob present); skopeo keeps the
manifest digest MANIFEST.json names. podman's image store is left as it was. Without
``--insecure`` an HTTP registry is refused per image, with the tool's reason. (crane is run by
test_bundle.py, docker only as a stand-in: the machine has no Docker engine.)"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tarfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from lj_runtimekit_testkit.registry import MANIFEST_TYPES, LocalRegistry

from .conftest import E_IMAGE, PROJECT, Bundle, pushed_ref

pytestmark = pytest.mark.images


@pytest.fixture
def own_registry(tmp_path: Path) -> Iterator[LocalRegistry]:
    """A registry for this test alone: nothing pushed before, so every blob is uploaded."""
    reg = LocalRegistry(tmp_path / "registry")
    reg.start()
    try:
        yield reg
    finally:
        reg.stop()


def alone(folder: Path, tool: Path) -> Path:
    """``folder`` holding only ``tool`` (a link), to put before the system's commands."""
    folder.mkdir()
    (folder / tool.name).symlink_to(tool)
    return folder


def podman_env(home: Path) -> dict[str, str]:
    """podman's image store, run state and event log under ``home``, not the machine's
    (/var/lib/containers is where ``make images``' buildah keeps its images)."""
    home.mkdir()
    storage, conf = home / "storage.conf", home / "containers.conf"
    storage.write_text(f'[storage]\ngraphroot = "{home / "root"}"\nrunroot = "{home / "run"}"\n')
    conf.write_text(
        "[engine]\n"
        'events_logger = "file"\n'
        f'events_logfile_path = "{home / "events.log"}"\n'
        f'tmp_dir = "{home / "tmp"}"\n'
    )
    return {"CONTAINERS_STORAGE_CONF": str(storage), "CONTAINERS_CONF": str(conf)}


def payload_manifests(run: Path) -> dict[str, dict[str, Any]]:
    """The image manifest of each OCI archive in the installer's payload, by archive name: what
    push sent, read in one pass (build/images may be rebuilt meanwhile)."""
    line = re.search(rb"^PAYLOAD_LINE='(\d+)'$", run.read_bytes()[:16384], re.MULTILINE)
    assert line, run
    manifests = {}
    with run.open("rb") as f:
        for _ in range(int(line.group(1)) - 1):
            f.readline()
        with tarfile.open(fileobj=f, mode="r|") as payload:
            for member in payload:
                image = payload.extractfile(member)
                if member.name.endswith(".tar") and image is not None:
                    manifests[member.name] = _manifest_of(image)
    return manifests


def _manifest_of(archive: IO[bytes]) -> dict[str, Any]:
    """The manifest named by an OCI archive's index.json, the archive read as a stream (its
    small blobs kept, as index.json may come last)."""
    small: dict[str, bytes] = {}
    index: dict[str, Any] = {}
    with tarfile.open(fileobj=archive, mode="r|") as tar:
        for member in tar:
            data = tar.extractfile(member) if member.size < 1 << 20 else None
            if data is None:
                continue
            if member.name == "index.json":
                index = json.load(data)
            else:
                small[member.name] = data.read()
    (entry,) = index["manifests"]
    manifest: dict[str, Any] = json.loads(small[f"blobs/{entry['digest'].replace(':', '/')}"])
    return manifest


def registry_manifest(reg: LocalRegistry, repository: str, tag: str) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{reg.url}/v2/{repository}/manifests/{tag}", headers={"Accept": ", ".join(MANIFEST_TYPES)}
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        manifest: dict[str, Any] = json.load(resp)
    return manifest


def blob_present(reg: LocalRegistry, repository: str, digest: str) -> bool:
    request = urllib.request.Request(f"{reg.url}/v2/{repository}/blobs/{digest}", method="HEAD")
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return bool(resp.status == 200)
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return False
        raise


@pytest.mark.parametrize("tool", ["skopeo", "podman"])
def test_push_with_the_only_tool_on_path_puts_every_image_in_the_registry(
    bundle: Bundle,
    packaged_tools: dict[str, Path],
    own_registry: LocalRegistry,
    tmp_path: Path,
    tool: str,
) -> None:
    env = podman_env(tmp_path / "podman") if tool == "podman" else {}
    dest = f"{own_registry.address}/{PROJECT}"
    done = bundle.installer(
        "push", dest, "--insecure",
        path=[alone(tmp_path / "bin", packaged_tools[tool])], only_path=True, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"pushing to {dest} with {tool}" in done.stdout
    assert f"push: every image is in {dest}" in done.stdout

    built_manifests = payload_manifests(bundle.run)
    for image in bundle.manifest["images"]:
        assert f"pushed  {image['image']} -> {pushed_ref(own_registry.address, image)}" in (
            done.stdout
        )
        repository = f"{PROJECT}/{image['name']}"
        assert own_registry.tags(repository) == [image["tag"]]
        pushed = registry_manifest(own_registry, repository, image["tag"])
        built = built_manifests[image["archive"]]
        # The same image: its config (which lists every layer's content digest) is unchanged.
        assert pushed["config"]["digest"] == built["config"]["digest"], image["image"]
        assert len(pushed["layers"]) == len(built["layers"])
        for blob in [pushed["config"], *pushed["layers"]]:
            assert blob_present(own_registry, repository, blob["digest"]), (image, blob)
        if tool == "skopeo":  # copied as is: --preserve-digests
            assert own_registry.manifest_digest(repository, image["tag"]) == image["digest"]
    assert sorted(own_registry.repositories()) == sorted(
        f"{PROJECT}/{i['name']}" for i in bundle.manifest["images"]
    )
    if tool == "podman":  # what the installer pulled into podman's store, it took out again
        left = subprocess.run(
            ["podman", "images", "--all", "--quiet"],
            env={**os.environ, **env}, capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        assert left.stdout.strip() == ""


def test_an_http_registry_without_insecure_is_refused_with_the_tools_reason(
    bundle: Bundle, packaged_tools: dict[str, Path], own_registry: LocalRegistry, tmp_path: Path
) -> None:
    done = bundle.installer(
        "push", f"{own_registry.address}/{PROJECT}",
        path=[alone(tmp_path / "bin", packaged_tools["skopeo"])], only_path=True,
    )  # fmt: skip
    assert done.returncode == E_IMAGE, done.stdout + done.stderr
    for image in bundle.manifest["images"]:
        assert f"FAILED {image['image']}: skopeo could not push it" in done.stderr
    assert "HTTP response to HTTPS client" in done.stderr
    assert own_registry.repositories() == []
