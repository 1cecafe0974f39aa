"""Generate the Python stubs (messages, gRPC services and their type stubs) from proto/.

Run by ``make generate``; the output under src/ is never edited by hand.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from grpc_tools import protoc

HERE = Path(__file__).resolve().parent
PACKAGE = "lj_runtimekit_interface"
OUT = HERE / "src"
GENERATED = ("runtime", "deviceplugin", "podresources", "dra", "pluginregistration", "nri")


def main() -> int:
    for sub in GENERATED:
        shutil.rmtree(OUT / PACKAGE / sub, ignore_errors=True)
    sources = sorted(str(p.relative_to(HERE)) for p in (HERE / PACKAGE).rglob("*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    bin_dir = Path(sys.executable).parent
    args = [
        "grpc_tools.protoc",
        f"-I{HERE}",
        f"-I{include}",
        f"--python_out={OUT}",
        f"--grpc_python_out={OUT}",
        f"--plugin=protoc-gen-mypy={bin_dir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={bin_dir / 'protoc-gen-mypy_grpc'}",
        f"--mypy_out={OUT}",
        f"--mypy_grpc_out={OUT}",
        *sources,
    ]
    if protoc.main(args) != 0:
        print("protoc failed", file=sys.stderr)
        return 1
    for sub in GENERATED:
        for directory in [
            OUT / PACKAGE / sub,
            *(p for p in (OUT / PACKAGE / sub).rglob("*") if p.is_dir()),
        ]:
            (directory / "__init__.py").touch()
    print(f"generated stubs for {len(sources)} proto files into {OUT / PACKAGE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
