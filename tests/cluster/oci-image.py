#!/usr/bin/env python3
"""Write a one-layer OCI image archive (an OCI image layout in a tar) without any image tool.

    oci-image.py --name localhost/x/pause:3.10 --out pause.tar --entrypoint /pause \
        --file /path/to/pause=/pause [--file SRC=DEST ...]

The archive carries ``io.containerd.image.name`` so that ``ctr images import`` tags it with the
full name (a name without a domain would be rewritten to docker.io by the CRI). Standard library
only: the node binaries script runs it with the machine's python3. Output is reproducible (fixed
mtimes, sorted entries), so the same inputs give the same image digest.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import sys
import tarfile
from pathlib import Path


def _tar_bytes(entries: list[tuple[str, bytes, int]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs: set[str] = set()
        for dest, data, mode in sorted(entries):
            parts = dest.strip("/").split("/")
            for i in range(1, len(parts)):
                d = "/".join(parts[:i])
                if d not in dirs:
                    dirs.add(d)
                    info = tarfile.TarInfo(d)
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(info)
            info = tarfile.TarInfo("/".join(parts))
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def build(name: str, entrypoint: list[str], files: dict[str, Path], env: list[str]) -> bytes:
    """The archive's bytes for an image of ``files`` (dest -> source) run as ``entrypoint``."""
    entries = [
        (dest, src.read_bytes(), 0o755 if os.access(src, os.X_OK) else 0o644)
        for dest, src in files.items()
    ]
    layer_tar = _tar_bytes(entries)
    layer_gz = gzip.compress(layer_tar, mtime=0)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": entrypoint, "Env": env, "WorkingDir": "/"},
        "rootfs": {
            "type": "layers",
            "diff_ids": ["sha256:" + hashlib.sha256(layer_tar).hexdigest()],
        },
        "history": [{"created_by": "tests/cluster/oci-image.py"}],
    }
    blobs: dict[str, bytes] = {}

    def blob(data: bytes, media_type: str) -> dict[str, object]:
        digest = hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}

    config_desc = blob(
        json.dumps(config, sort_keys=True).encode(), "application/vnd.oci.image.config.v1+json"
    )
    layer_desc = blob(layer_gz, "application/vnd.oci.image.layer.v1.tar+gzip")
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config_desc,
        "layers": [layer_desc],
    }
    manifest_desc = blob(json.dumps(manifest, sort_keys=True).encode(), manifest["mediaType"])
    tag = name.rpartition(":")[2] if ":" in name.rpartition("/")[2] else "latest"
    manifest_desc["annotations"] = {
        "io.containerd.image.name": name,
        "org.opencontainers.image.ref.name": tag,
    }
    manifest_desc["platform"] = {"architecture": "amd64", "os": "linux"}
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [manifest_desc],
    }
    files_out = [
        ("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode(), 0o644),
        ("index.json", json.dumps(index, sort_keys=True).encode(), 0o644),
    ]
    files_out += [(f"blobs/sha256/{d}", data, 0o644) for d, data in blobs.items()]
    return _tar_bytes(files_out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--name", required=True, help="full image name with a domain, e.g. localhost/x/y:1"
    )
    parser.add_argument("--out", required=True, type=Path, help="the archive to write")
    parser.add_argument(
        "--entrypoint", required=True, nargs="+", help="the image's entrypoint argv"
    )
    parser.add_argument(
        "--file",
        action="append",
        default=[],
        metavar="SRC=DEST",
        help="a host file and where it lives in the image (repeatable)",
    )
    parser.add_argument(
        "--env", action="append", default=[], metavar="K=V", help="image env (repeatable)"
    )
    args = parser.parse_args(argv)
    files: dict[str, Path] = {}
    for spec in args.file:
        src, sep, dest = spec.partition("=")
        if not sep or not dest.startswith("/"):
            parser.error(f"--file {spec!r}: expected SRC=/absolute/dest")
        files[dest] = Path(src)
    env = args.env or ["PATH=/usr/local/bin:/usr/bin:/bin"]
    data = build(args.name, args.entrypoint, files, env)
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
