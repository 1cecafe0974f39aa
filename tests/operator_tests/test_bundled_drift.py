"""The operator renders the suite from copies of deploy/ shipped inside its package
(components/operator/src/lj_runtimekit_operator/manifests/): every copy must be byte-identical to
deploy/, and every manifest of the components it deploys must be copied, so that the operator and
`deploy-all.sh` install the same suite. After a change to deploy/<folder>/, copy it:
``cp deploy/<folder>/*.yaml components/operator/src/lj_runtimekit_operator/manifests/<folder>/``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUNDLED = ROOT / "components" / "operator" / "src" / "lj_runtimekit_operator" / "manifests"
FOLDERS = ["common", "controller", "deviceplugin", "exporter", "scheduler"]


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("*.yaml"))


def test_the_bundle_holds_exactly_the_deployed_folders() -> None:
    assert sorted(p.name for p in BUNDLED.iterdir() if p.is_dir()) == FOLDERS


@pytest.mark.parametrize("folder", FOLDERS)
def test_every_bundled_manifest_is_the_one_in_deploy(folder: str) -> None:
    deployed, bundled = ROOT / "deploy" / folder, BUNDLED / folder
    assert _names(bundled) == _names(deployed), (
        f"manifests of deploy/{folder}/ and the operator's copy differ in files: copy them"
    )
    stale = [n for n in _names(deployed) if (bundled / n).read_text() != (deployed / n).read_text()]
    assert not stale, (
        f"the operator's copies of deploy/{folder}/{', '.join(stale)} are stale: "
        f"cp deploy/{folder}/*.yaml {BUNDLED.relative_to(ROOT)}/{folder}/"
    )
