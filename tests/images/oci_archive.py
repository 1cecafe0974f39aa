#!/usr/bin/env python3
"""OCI image archives for the nodes' containerd, and the index of what `make images` built.

    oci_archive.py pack LAYOUT_DIR IMAGE_REF ARCHIVE      # one image layout → one archive
    oci_archive.py index OUT_DIR COMPONENT...             # OUT_DIR/index.json from the sidecars

``pack`` names the layout's one manifest twice, as containerd's own export does:
``io.containerd.image.name`` (the full reference, which ``ctr images import`` uses as is; a
name without a domain would be rewritten to docker.io by the CRI) and
``org.opencontainers.image.ref.name`` (the tag, as the OCI image layout spec wants it). The tar
is reproducible (sorted entries, fixed mtimes and owners). It prints the manifest digest.

Standard library only: it runs with the machine's python3.
"""

from __future__ import annotations

import json
import sys
import tarfile
from pathlib import Path


def pack(layout: Path, ref: str, archive: Path) -> str:
    index = json.loads((layout / "index.json").read_text())
    (manifest,) = index["manifests"]
    tag = ref.rsplit(":", 1)[1] if ":" in ref.rsplit("/", 1)[-1] else "latest"
    manifest["annotations"] = {
        **manifest.get("annotations", {}),
        "io.containerd.image.name": ref,
        "org.opencontainers.image.ref.name": tag,
    }
    (layout / "index.json").write_text(json.dumps(index, separators=(",", ":")))
    partial = archive.with_name(archive.name + ".partial")
    with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(p for p in layout.rglob("*")):
            info = tar.gettarinfo(str(path), arcname=str(path.relative_to(layout)))
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mode = 0o755 if info.isdir() else 0o644
            if info.isfile():
                with path.open("rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    partial.replace(archive)
    return str(manifest["digest"])


def write_index(out: Path, components: list[str]) -> Path:
    """index.json: {component, image, archive, digest} for each component whose image is built,
    in the order given."""
    entries = []
    for c in components:
        sidecar, archive = out / f"{c}.json", (out / f"{c}.tar").resolve()
        if sidecar.exists() and archive.exists():
            entry = json.loads(sidecar.read_text())
            # Relative to the repository (the working directory) when the archive is in it.
            if archive.is_relative_to(Path.cwd()):
                archive = archive.relative_to(Path.cwd())
            entries.append(
                {**{k: entry[k] for k in ("component", "image", "digest")}, "archive": str(archive)}
            )
    path = out / "index.json"
    path.write_text(json.dumps(entries, indent=2) + "\n")
    return path


def main(argv: list[str]) -> int:
    match argv:
        case ["pack", layout, ref, archive]:
            print(pack(Path(layout), ref, Path(archive)))
        case ["index", out, *components]:
            print(write_index(Path(out), components))
        case _:
            print(__doc__, file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
