#!/usr/bin/env python3
"""Builds the offline bundle ``lj-runtimekit-k8s-package.<VERSION>.tar.gz`` (``make bundle``).

    build-bundle.py --images build/images/index.json --charts deploy/helm --out build/bundle \\
        [--version vX.Y.Z] [--helm PATH]

The bundle holds, under one top folder ``lj-runtimekit-k8s-package.<VERSION>/``:

* ``lj-runtimekit-k8s-images.<VERSION>.run``: ``installer.sh`` (next to this file) with a plain tar
  of every built image's OCI archive appended; its ``push``, ``load``, ``list`` and ``verify``
  check that payload's SHA-256 before anything else;
* one ``<chart>-<chart version>.tgz`` per chart folder under ``--charts`` (``helm package``);
* ``MANIFEST.json``: the version, each image (name, tag, manifest digest, archive), each chart
  (name, version), the build time and the git commit;
* ``SHA256SUMS`` over the other files, in ``sha256sum -c`` format.

The images are the ones ``make images`` wrote (``index.json``: component, image, digest, archive);
each archive's own OCI index must name that digest, so a stale index is refused, not shipped.
``--version`` defaults to the tag every image shares. Standard library only: it runs with the
machine's python3. Prints the bundle's path.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import hashlib
import io
import json
import re
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
TEMPLATE = HERE / "installer.sh"
PACKAGE = "lj-runtimekit-k8s-package"
INSTALLER = "lj-runtimekit-k8s-images"
_CHUNK = 1 << 20


class BundleError(Exception):
    """Something the bundle cannot be built from; the message says what to do."""


@dataclass(frozen=True)
class Image:
    component: str
    name: str
    """The image's repository path without the registry (``lj-runtimekit-exporter``)."""
    tag: str
    image: str
    """The full reference it was built as."""
    digest: str
    """Its manifest digest (what a registry serves it as, when pushed unchanged)."""
    archive: str
    """The OCI archive's file name inside the installer's payload."""
    sha256: str
    bytes: int


@dataclass(frozen=True)
class Chart:
    name: str
    version: str
    app_version: str
    file: str
    sha256: str


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def archive_digest(archive: Path) -> str:
    """The manifest digest named by an OCI archive's own index.json (exactly one manifest)."""
    try:
        with tarfile.open(archive) as tar:
            member = tar.extractfile("index.json")
            if member is None:
                raise KeyError("index.json")
            index = json.load(member)
    except (tarfile.TarError, KeyError, ValueError) as e:
        raise BundleError(f"{archive} is not an OCI archive with an index.json: {e}") from e
    manifests = index.get("manifests", [])
    if len(manifests) != 1:
        raise BundleError(f"{archive} holds {len(manifests)} manifests, one expected")
    return str(manifests[0]["digest"])


def split_ref(ref: str) -> tuple[str, str]:
    """``registry/path/name:tag`` → (``name``, ``tag``)."""
    last = ref.rsplit("/", 1)[-1]
    if ":" not in last:
        raise BundleError(f"image {ref} has no tag: the bundle keeps tags, so each needs one")
    name, tag = last.split(":", 1)
    return name, tag


def read_images(index: Path) -> tuple[list[Image], dict[str, Path]]:
    """The images of ``make images``' index.json, checked against their archives."""
    if not index.is_file():
        raise BundleError(f"{index} not found: run `make images` first")
    entries: list[dict[str, Any]] = json.loads(index.read_text())
    if not entries:
        raise BundleError(f"{index} lists no image: run `make images`")
    images, paths = [], {}
    for e in entries:
        path = _archive_path(Path(e["archive"]), index)
        if not path.is_file():
            raise BundleError(f"image archive {path} is missing: run `make images` again")
        inside = archive_digest(path)
        if inside != e["digest"]:
            raise BundleError(
                f"{index} says {e['image']} is {e['digest']} but {path} holds {inside}: "
                "run `make images` again"
            )
        name, tag = split_ref(e["image"])
        member = f"{e['component']}.tar"
        images.append(
            Image(
                component=e["component"],
                name=name,
                tag=tag,
                image=e["image"],
                digest=e["digest"],
                archive=member,
                sha256=sha256_file(path),
                bytes=path.stat().st_size,
            )
        )
        paths[member] = path
    return images, paths


def _archive_path(archive: Path, index: Path) -> Path:
    """index.json names archives relative to the repository (where make runs); the archives
    also sit next to it."""
    for candidate in (archive, REPO / archive, index.parent / archive.name):
        if candidate.is_file():
            return candidate.resolve()
    return archive


def default_version(images: list[Image]) -> str:
    tags = {i.tag for i in images}
    if len(tags) != 1:
        raise BundleError(f"the images carry several tags {sorted(tags)}: give --version")
    return tags.pop()


def _reset(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """Reproducible members: no owner, no time."""
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    return info


def write_payload(out: BinaryIO, images: list[Image], paths: dict[str, Path]) -> None:
    """The installer's payload: an uncompressed tar (the layers inside are compressed already)
    with ``images.list`` — one ``ARCHIVE REF DIGEST SHA256 BYTES`` line per image, for the
    shell to read — and each archive."""
    listing = "".join(f"{i.archive} {i.image} {i.digest} {i.sha256} {i.bytes}\n" for i in images)
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        data = listing.encode()
        info = _reset(tarfile.TarInfo("images.list"))
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))
        for image in images:
            info = _reset(tar.gettarinfo(str(paths[image.archive]), arcname=image.archive))
            info.mode = 0o644
            with paths[image.archive].open("rb") as f:
                tar.addfile(info, f)


def render_installer(version: str, payload_sha256: str, payload_bytes: int) -> bytes:
    """The installer script for this payload; the payload starts on the line after its last."""
    text = TEMPLATE.read_text()
    text = text.replace("@VERSION@", version)
    text = text.replace("@PAYLOAD_SHA256@", payload_sha256)
    text = text.replace("@PAYLOAD_BYTES@", str(payload_bytes))
    if not text.endswith("\n"):
        text += "\n"
    # Known before substituting: the placeholder is on one line, so the count does not change.
    text = text.replace("@PAYLOAD_LINE@", str(text.count("\n") + 1))
    left = sorted(set(re.findall(r"@[A-Z_]+@", text)))
    if left:
        raise BundleError(f"{TEMPLATE}: placeholders not filled: {left}")
    return text.encode()


def build_installer(dest: Path, version: str, images: list[Image], paths: dict[str, Path]) -> str:
    """Writes the .run; returns its payload's SHA-256."""
    with tempfile.TemporaryFile(dir=dest.parent) as payload:
        write_payload(payload, images, paths)
        size = payload.tell()
        payload.seek(0)
        h = hashlib.sha256()
        while chunk := payload.read(_CHUNK):
            h.update(chunk)
        payload.seek(0)
        partial = dest.with_name(dest.name + ".partial")
        with partial.open("wb") as f:
            f.write(render_installer(version, h.hexdigest(), size))
            while chunk := payload.read(_CHUNK):
                f.write(chunk)
    partial.chmod(0o755)
    partial.replace(dest)
    return h.hexdigest()


def chart_dirs(charts: Path) -> list[Path]:
    """Every chart under ``charts`` (each folder with a Chart.yaml), by name."""
    found = sorted(p.parent for p in charts.glob("*/Chart.yaml"))
    if not found:
        raise BundleError(f"no chart (a folder with Chart.yaml) under {charts}")
    return found


def chart_field(chart_yaml: str, key: str) -> str:
    match = re.search(rf"^{key}:\s*['\"]?([^'\"\s#]+)", chart_yaml, re.MULTILINE)
    return match.group(1) if match else ""


def package_charts(charts: Path, dest: Path, helm: str) -> list[Chart]:
    packaged = []
    for chart in chart_dirs(charts):
        meta = (chart / "Chart.yaml").read_text()
        name, version = chart_field(meta, "name"), chart_field(meta, "version")
        done = subprocess.run(
            [helm, "package", str(chart), "--destination", str(dest)],
            capture_output=True, text=True, check=False, timeout=120,
        )  # fmt: skip
        tgz = dest / f"{name}-{version}.tgz"
        if done.returncode != 0 or not tgz.is_file():
            raise BundleError(f"helm package {chart} failed:\n{done.stdout}{done.stderr}")
        packaged.append(
            Chart(name, version, chart_field(meta, "appVersion"), tgz.name, sha256_file(tgz))
        )
    return packaged


def git_commit(repo: Path) -> dict[str, Any]:
    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, text=True, check=False
        )
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("rev-parse", "HEAD")
    return {"git_commit": commit or "unknown", "git_dirty": bool(commit and git("status", "-s"))}


def tar_gz(folder: Path, dest: Path) -> None:
    """``folder`` as ``dest`` (a .tar.gz whose top entry is the folder). Level 1: the images'
    layers are compressed already, more effort gains nothing."""
    partial = dest.with_name(dest.name + ".partial")
    with (
        partial.open("wb") as raw,
        gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1, mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        tar.add(str(folder), arcname=folder.name, filter=_reset)
    partial.replace(dest)


def _files(folder: Path) -> Iterator[Path]:
    yield from sorted(p for p in folder.iterdir() if p.is_file())


def build(
    index: Path, *, charts: Path, out: Path, helm: str, version: str | None, repo: Path
) -> Path:
    images, paths = read_images(index)
    version = version or default_version(images)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]*", version):
        raise BundleError(f"version {version!r}: letters, digits, '.', '_', '+', '-' only")
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out, prefix=".staging-") as staging:
        folder = Path(staging) / f"{PACKAGE}.{version}"
        folder.mkdir()
        run = folder / f"{INSTALLER}.{version}.run"
        payload_sha256 = build_installer(run, version, images, paths)
        packaged = package_charts(charts, folder, helm)
        manifest = {
            "name": PACKAGE,
            "version": version,
            "build_time": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            **git_commit(repo),
            "installer": {
                "file": run.name,
                "sha256": sha256_file(run),
                "payload_sha256": payload_sha256,
            },
            "images": [asdict(i) for i in images],
            "charts": [asdict(c) for c in packaged],
        }
        (folder / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n")
        sums = "".join(f"{sha256_file(p)}  {p.name}\n" for p in _files(folder))
        (folder / "SHA256SUMS").write_text(sums)
        dest = out / f"{PACKAGE}.{version}.tar.gz"
        tar_gz(folder, dest)
    return dest


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=Path, default=Path("build/images/index.json"))
    p.add_argument("--charts", type=Path, default=Path("deploy/helm"))
    p.add_argument("--out", type=Path, default=Path("build/bundle"))
    p.add_argument("--helm", default="helm", help="the helm binary (default: helm on PATH)")
    p.add_argument("--version", default=None, help="default: the tag every image shares")
    args = p.parse_args(argv)
    try:
        dest = build(
            args.images,
            charts=args.charts,
            out=args.out,
            helm=args.helm,
            version=args.version,
            repo=REPO,
        )
    except BundleError as e:
        print(f"build-bundle: {e}", file=sys.stderr)
        return 1
    print(dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
