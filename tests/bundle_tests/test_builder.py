"""The bundle builder (``deploy/bundle/build-bundle.py``) on small made-up images, no cluster and
no ``make images``: it packages every chart folder it finds (a second chart is picked up), names
the bundle after the images' shared tag or ``--version``, and refuses an index whose digest no
longer matches the archive, or images of several tags without ``--version``."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from lj_runtimekit_testkit.manifests import DEPLOY, tool_dir

from .conftest import BUILDER

REGISTRY = "registry.invalid/lj"


def blob(files: dict[str, bytes], data: bytes) -> dict[str, Any]:
    digest = hashlib.sha256(data).hexdigest()
    files[f"blobs/sha256/{digest}"] = data
    return {"digest": f"sha256:{digest}", "size": len(data)}


def oci_archive(path: Path, ref: str) -> str:
    """A minimal valid OCI image archive (one empty layer) named ``ref``; its manifest digest."""
    files: dict[str, bytes] = {"oci-layout": b'{"imageLayoutVersion":"1.0.0"}'}
    layer_tar = io.BytesIO()
    with tarfile.open(fileobj=layer_tar, mode="w"):
        pass
    layer = blob(files, layer_tar.getvalue())
    config = blob(
        files,
        json.dumps({
            "architecture": "amd64", "os": "linux", "config": {"Labels": {"ref": ref}},
            "rootfs": {"type": "layers", "diff_ids": [layer["digest"]]},
        }).encode(),
    )  # fmt: skip
    manifest = blob(
        files,
        json.dumps({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", **layer}],
        }).encode(),
    )  # fmt: skip
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                **manifest,
                "annotations": {"io.containerd.image.name": ref},
            }
        ],
    }
    files["index.json"] = json.dumps(index).encode()
    with tarfile.open(path, "w") as tar:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return str(manifest["digest"])


def images_index(folder: Path, tags: dict[str, str]) -> Path:
    """``folder/index.json`` as ``make images`` writes it, for made-up components."""
    entries = []
    for component, tag in tags.items():
        ref = f"{REGISTRY}/lj-runtimekit-{component}:{tag}"
        archive = folder / f"{component}.tar"
        digest = oci_archive(archive, ref)
        entries.append(
            {"component": component, "image": ref, "digest": digest, "archive": str(archive)}
        )
    path = folder / "index.json"
    path.write_text(json.dumps(entries))
    return path


def build(index: Path, charts: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            "python3", str(BUILDER), "--images", str(index), "--charts", str(charts),
            "--out", str(out), "--helm", str(tool_dir() / "helm"), *extra,
        ],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


@pytest.fixture
def charts(tmp_path: Path) -> Path:
    """deploy/helm plus one more chart folder: a new chart is packaged without a change here."""
    folder = tmp_path / "helm"
    shutil.copytree(DEPLOY / "helm", folder)
    extra = folder / "lj-runtimekit-example"
    (extra / "templates").mkdir(parents=True)
    (extra / "Chart.yaml").write_text(
        "apiVersion: v2\nname: lj-runtimekit-example\nversion: 0.3.1\n"
    )
    return folder


def test_every_chart_folder_is_packaged_and_the_bundle_named_after_the_shared_tag(
    tmp_path: Path, charts: Path
) -> None:
    index = images_index(tmp_path, {"exporter": "v9.1.0", "scheduler": "v9.1.0"})
    done = build(index, charts, tmp_path / "out")
    assert done.returncode == 0, done.stderr
    tarball = Path(done.stdout.strip())
    assert tarball.name == "lj-runtimekit-k8s-package.v9.1.0.tar.gz"
    with tarfile.open(tarball) as tar:
        names = {Path(n).name for n in tar.getnames()}
        member = tar.extractfile("lj-runtimekit-k8s-package.v9.1.0/MANIFEST.json")
        assert member is not None
        manifest = json.load(member)
    packaged = {c["name"]: c["version"] for c in manifest["charts"]}
    folders = {c.name for c in (DEPLOY / "helm").iterdir() if (c / "Chart.yaml").exists()}
    assert set(packaged) == {*folders, "lj-runtimekit-example"}
    assert packaged["lj-runtimekit-example"] == "0.3.1"
    assert (
        f"version: {packaged['lj-runtimekit']}\n"
        in (charts / "lj-runtimekit/Chart.yaml").read_text()
    )
    assert "lj-runtimekit-example-0.3.1.tgz" in names
    assert "lj-runtimekit-k8s-images.v9.1.0.run" in names
    expected = {e["image"]: e["digest"] for e in json.loads(index.read_text())}
    assert {i["image"]: i["digest"] for i in manifest["images"]} == expected


def test_version_names_the_bundle_when_tags_differ_and_is_required_then(
    tmp_path: Path, charts: Path
) -> None:
    index = images_index(tmp_path, {"exporter": "v9.1.0", "scheduler": "v9.2.0"})
    refused = build(index, charts, tmp_path / "out")
    assert refused.returncode == 1
    assert "several tags ['v9.1.0', 'v9.2.0']: give --version" in refused.stderr
    done = build(index, charts, tmp_path / "out", "--version", "v9.2.0-site1")
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).name == "lj-runtimekit-k8s-package.v9.2.0-site1.tar.gz"


def test_a_stale_images_index_is_refused(tmp_path: Path, charts: Path) -> None:
    index = images_index(tmp_path, {"exporter": "v9.1.0"})
    # The archive rebuilt since index.json was written: another image inside.
    oci_archive(tmp_path / "exporter.tar", f"{REGISTRY}/lj-runtimekit-exporter:v9.1.0-other")
    done = build(index, charts, tmp_path / "out")
    assert done.returncode == 1
    assert "run `make images` again" in done.stderr
    assert not list((tmp_path / "out").glob("*.tar.gz"))
