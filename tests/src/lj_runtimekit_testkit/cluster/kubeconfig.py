"""The admin kubeconfig of the local control plane (client certificate in ``system:masters``)."""

from __future__ import annotations

import base64
from pathlib import Path

import yaml

from lj_runtimekit_testkit.cluster.pki import Pki


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write_kubeconfig(path: Path, server: str, pki: Pki, name: str = "lj-runtimekit") -> Path:
    """Write a self-contained kubeconfig (certificates embedded) for ``server``."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": name,
                "cluster": {
                    "server": server,
                    "certificate-authority-data": _b64(pki.ca_cert),
                },
            }
        ],
        "users": [
            {
                "name": "admin",
                "user": {
                    "client-certificate-data": _b64(pki.admin_cert),
                    "client-key-data": _b64(pki.admin_key),
                },
            }
        ],
        "contexts": [{"name": name, "context": {"cluster": name, "user": "admin"}}],
        "current-context": name,
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path
