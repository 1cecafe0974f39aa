"""The manifests the operator renders from: copies of deploy/<component>/*.yaml, shipped inside
the package (tests/operator_tests/test_bundled_drift.py fails when a copy differs from deploy/).
Read once; the release's registry and version are taken from them."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources

import yaml

from .objects import Obj
from .policy import COMMON, COMPONENTS


@dataclass(frozen=True)
class Bundle:
    """component name (and ``common``) → its objects, in file order; the default registry and
    version (the release the operator ships)."""

    objects: dict[str, tuple[Obj, ...]]
    registry: str
    version: str


def _folder(name: str) -> tuple[Obj, ...]:
    root = resources.files(__package__).joinpath("manifests", name)
    files = sorted((f for f in root.iterdir() if f.name.endswith(".yaml")), key=lambda f: f.name)
    return tuple(d for f in files for d in yaml.safe_load_all(f.read_text()) if d)


@functools.cache
def load() -> Bundle:
    objects = {c.name: _folder(c.folder) for c in COMPONENTS}
    objects[COMMON] = _folder(COMMON)
    # The controller's Deployment names the release's registry and version: <registry>/<image>:<v>
    deployment = next(o for o in objects["controller"] if o["kind"] == "Deployment")
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    repo, _, version = image.rpartition(":")
    return Bundle(objects, repo.rpartition("/")[0], version)
