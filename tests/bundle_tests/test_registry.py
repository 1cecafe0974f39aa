"""The harness' registry (``lj_runtimekit_testkit.registry``), no cluster: the CNCF distribution
registry on loopback takes a push from crane and serves the manifest under the pushed digest, and
stopping it ends the process, frees the port and removes its storage."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

from lj_runtimekit_testkit.cluster.processes import process_alive
from lj_runtimekit_testkit.registry import LocalRegistry

from .test_builder import oci_archive


def test_a_push_is_served_back_and_stop_leaves_nothing(tmp_path: Path) -> None:
    reg = LocalRegistry(tmp_path / "registry")
    reg.start()
    try:
        assert reg.host == "127.0.0.1"
        ref = f"{reg.address}/demo/tiny:v1"
        digest = oci_archive(tmp_path / "tiny.tar", ref)
        layout = tmp_path / "layout"
        layout.mkdir()
        subprocess.run(["tar", "-xf", str(tmp_path / "tiny.tar"), "-C", str(layout)], check=True)
        done = subprocess.run(
            [reg.crane, "push", "--insecure", str(layout), ref],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert reg.manifest_digest("demo/tiny", "v1") == digest
        assert reg.manifest_digest("demo/tiny", "v2") is None
        assert reg.repositories() == ["demo/tiny"]
        assert any(reg.storage.rglob("data")), "nothing written to the storage folder"
        assert reg.process is not None
        pid = reg.process.pid
    finally:
        reg.stop()
    assert not process_alive(pid)
    assert not reg.work.exists()
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", reg.port)) != 0
