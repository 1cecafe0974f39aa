"""A real OCI registry for the tests: the CNCF distribution registry (``registry serve``), built
from Go modules by ``tests/cluster/build-registry.sh`` with ``crane`` beside it, on
``127.0.0.1:<free port>`` over plain HTTP with a temporary storage folder.

    def test_push(registry: LocalRegistry) -> None:
        subprocess.run([registry.crane, "push", "--insecure", layout, f"{registry.address}/x:v1"])
        assert registry.manifest_digest("x", "v1") == "sha256:..."

The fixture stops the registry and removes its files at the end of the module that used it. A
real node in its own network namespace cannot reach loopback: for a node, start one on the node
bridge's address (``LocalRegistry(work, host=bridge.ip)``) and give the node's containerd a
``hosts.toml`` (:func:`containerd_hosts_toml`).
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import structlog
import yaml

from lj_runtimekit_testkit.cluster.launcher import free_port
from lj_runtimekit_testkit.cluster.processes import BinaryProcess, ProcessExited, wait_until
from lj_runtimekit_testkit.manifests import REPO
from lj_runtimekit_testkit.node import RealNode

log = structlog.get_logger(__name__)

BUILD_SCRIPT = REPO / "tests" / "cluster" / "build-registry.sh"
#: What a manifest HEAD accepts, so the registry answers with the digest it stores (not a
#: converted schema).
MANIFEST_TYPES = (
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)


class RegistryUnavailable(RuntimeError):
    """The registry binary could not be built or did not start; the message says why."""


@functools.cache
def registry_binaries() -> Path:
    """The folder holding ``registry`` and ``crane`` (built on first use, then cached)."""
    done = subprocess.run(
        [str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=1800, check=False
    )
    if done.returncode != 0:
        raise RegistryUnavailable(f"{BUILD_SCRIPT} failed:\n{done.stderr[-3000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def registry_config(storage: Path, address: str) -> str:
    """The registry's configuration: filesystem storage, deletes allowed, plain HTTP, quiet."""
    config = {
        "version": 0.1,
        "log": {"level": "warn", "accesslog": {"disabled": True}},
        "storage": {
            "filesystem": {"rootdirectory": str(storage)},
            "delete": {"enabled": True},
            "maintenance": {"uploadpurging": {"enabled": False}},
        },
        # One registry, no load balancer: any fixed secret will do (and silences its warning).
        "http": {"addr": address, "secret": "lj-runtimekit-test-registry"},
    }
    return yaml.safe_dump(config, sort_keys=False)


def containerd_hosts_toml(address: str) -> str:
    """``/etc/containerd/certs.d/<address>/hosts.toml`` for containerd 2.x: pull from this
    registry over plain HTTP (containerd reads it when the CRI's ``registry.config_path`` names
    ``/etc/containerd/certs.d``)."""
    return (
        f'server = "http://{address}"\n\n'
        f'[host."http://{address}"]\n'
        '  capabilities = ["pull", "resolve"]\n'
        "  skip_verify = true\n"
    )


CERTS_D = "/etc/containerd/certs.d"


def pull_through(node: RealNode, address: str) -> None:
    """Tell a real node's containerd to pull ``address``'s images over plain HTTP (the CRI's
    ``registry.config_path`` and the registry's ``hosts.toml``), then restart it."""
    node.add_containerd_config(
        f"\n[plugins.'io.containerd.cri.v1.images'.registry]\n  config_path = \"{CERTS_D}\"\n"
    )
    hosts = node.host_path(f"{CERTS_D}/{address}/hosts.toml")
    hosts.parent.mkdir(parents=True, exist_ok=True)
    hosts.write_text(containerd_hosts_toml(address))
    node.restart("containerd")


@dataclass
class LocalRegistry:
    """One running registry; :meth:`stop` ends it and removes its storage."""

    work: Path
    host: str = "127.0.0.1"
    port: int = 0
    process: BinaryProcess | None = field(default=None, repr=False)

    @property
    def address(self) -> str:
        """``host:port``, the registry part of an image reference pushed here."""
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    @property
    def crane(self) -> str:
        return str(registry_binaries() / "crane")

    @property
    def storage(self) -> Path:
        return self.work / "storage"

    def start(self, deadline_s: float = 30.0) -> None:
        binaries = registry_binaries()
        self.work.mkdir(parents=True, exist_ok=True)
        self.storage.mkdir(exist_ok=True)
        self.port = self.port or free_port()
        config = self.work / "config.yml"
        config.write_text(registry_config(self.storage, self.address))
        self.process = BinaryProcess(
            "registry", [str(binaries / "registry"), "serve", str(config)], self.work / "log"
        )
        self.process.start()
        try:
            wait_until(
                f"registry answering on {self.url}/v2/",
                self._answers,
                deadline_s,
                watched=[self.process],
            )
        except (ProcessExited, TimeoutError) as e:
            self.stop()
            raise RegistryUnavailable(f"registry on {self.address} did not start: {e}") from e
        log.info("registry_started", address=self.address, storage=str(self.storage))

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/v2/", timeout=2) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def manifest_digest(self, repository: str, reference: str) -> str | None:
        """The digest the registry serves ``repository:reference`` as (its
        ``Docker-Content-Digest``), or None when it does not have it."""
        request = urllib.request.Request(
            f"{self.url}/v2/{repository}/manifests/{reference}",
            method="HEAD",
            headers={"Accept": ", ".join(MANIFEST_TYPES)},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as resp:
                return str(resp.headers["Docker-Content-Digest"])
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise

    def repositories(self) -> list[str]:
        with urllib.request.urlopen(f"{self.url}/v2/_catalog", timeout=10) as resp:
            found: list[str] = json.load(resp).get("repositories", [])
        return found

    def tags(self, repository: str) -> list[str]:
        with urllib.request.urlopen(f"{self.url}/v2/{repository}/tags/list", timeout=10) as resp:
            found: list[str] = json.load(resp).get("tags") or []
        return found

    def log_tail(self) -> str:
        return self.process.tail() if self.process else ""

    def stop(self) -> None:
        """Stop the registry and remove everything it wrote; safe to call twice."""
        if self.process is not None:
            self.process.stop()
            self.process = None
        shutil.rmtree(self.work, ignore_errors=True)
        log.info("registry_stopped", address=self.address)


@pytest.fixture(scope="module")
def registry() -> Iterator[LocalRegistry]:
    """A fresh registry on ``127.0.0.1:<free port>`` (plain HTTP) for the module; stopped and its
    storage removed afterwards. Needs no cluster."""
    work = Path(tempfile.mkdtemp(prefix="lj-registry-"))
    reg = LocalRegistry(work)
    try:
        reg.start()
    except RegistryUnavailable as e:
        shutil.rmtree(work, ignore_errors=True)
        pytest.fail(str(e), pytrace=False)
    try:
        yield reg
    finally:
        reg.stop()
