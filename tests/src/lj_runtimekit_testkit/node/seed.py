"""A node's containerd store that starts with its images already imported.

Importing an image archive costs a node's containerd about 2 CPU-s per image (digest, then unpack
into overlayfs snapshots); the guide's nodes each take eight (pause, probe and the six suite
images), and a `make test` starts dozens of nodes on two cores. So the images are imported once,
with the node's own ``containerd`` and ``ctr`` and the same command a node runs, into a *seed*
store cached outside the repo and keyed by the binaries and the archives; each node's
``/var/lib/containerd`` then starts as hard links to the seed's files.

Sharing is safe because containerd never writes those files in place: content blobs are
immutable, and committed snapshots are only overlay lower layers (a container's writes land in
its own new upper dir). The two bolt databases, which containerd does write in place, are real
copies, one per node. Deleting an image on one node removes only that node's links.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import structlog

from lj_runtimekit_testkit.node.hostcmd import RealNodeError, run

log = structlog.get_logger(__name__)

WRITTEN_IN_PLACE = (
    "io.containerd.metadata.v1.bolt/meta.db",
    "io.containerd.snapshotter.v1.overlayfs/metadata.db",
)
"""The files of a containerd root that containerd changes in place (bolt databases)."""
KEEP = 6
"""Seeds kept in the cache; older ones (other binaries, older images) are removed."""


def seed_key(bins: Path, archives: Sequence[Path]) -> str:
    """The seed's cache key: the node binaries (their directory names the versions), the
    containerd binary and each archive, by name, size and mtime (archives come from
    content-addressed caches, so a rebuilt image is a new file)."""
    h = hashlib.sha256(f"{bins.name}\n".encode())
    for path in (bins / "bin" / "containerd", *archives):
        st = path.stat()
        h.update(f"{path.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:24]


def seeds_dir(bins: Path) -> Path:
    """Next to the node binaries' cache directory ``bins``: ``<cache>/node/seeds``."""
    return bins.parent / "seeds"


def seed_store(bins: Path, archives: Sequence[Path]) -> Path:
    """The seed containerd root holding ``archives`` imported (built if missing, once across
    concurrent test workers)."""
    base = seeds_dir(bins)
    base.mkdir(parents=True, exist_ok=True)
    key = seed_key(bins, archives)
    store = base / key
    with _locked(base / ".lock"):
        if (store / "complete").is_file():
            os.utime(store)
            return store / "containerd"
        shutil.rmtree(store, ignore_errors=True)
        started = time.monotonic()
        staging = Path(tempfile.mkdtemp(prefix=f"{key}.", dir=base))
        try:
            _import_all(bins / "bin", staging / "containerd", archives)
            (staging / "complete").write_text("\n".join(str(a) for a in archives) + "\n")
            staging.rename(store)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        _prune(base, keep=store)
        log.info(
            "node_seed_built",
            store=str(store),
            images=len(archives),
            seconds=round(time.monotonic() - started, 1),
        )
    return store / "containerd"


def install(seed: Path, root: Path) -> None:
    """Make ``root`` (a node's containerd root, not yet existing) a copy of ``seed``: hard links,
    except the databases containerd writes in place."""
    if root.exists():
        raise RealNodeError(f"{root} exists: a node's containerd root is seeded before it starts")
    root.parent.mkdir(parents=True, exist_ok=True)
    run(["cp", "-al", str(seed), str(root)], f"link the image seed into {root}", timeout=120)
    for rel in WRITTEN_IN_PLACE:
        target = root / rel
        if target.exists():
            copy = target.with_name(target.name + ".copy")
            shutil.copyfile(seed / rel, copy)
            os.replace(copy, target)


def _import_all(bin_dir: Path, root: Path, archives: Sequence[Path]) -> None:
    """Import ``archives`` into a containerd rooted at ``root``, as a node does
    (``ctr -n k8s.io images import --platform linux/amd64``), with only what that needs."""
    with tempfile.TemporaryDirectory(prefix="ljseed-") as state:
        sock = f"{state}/containerd.sock"
        config = Path(state) / "config.toml"
        config.write_text(
            f'version = 3\nroot = "{root}"\nstate = "{state}/state"\n'
            "disabled_plugins = ['io.containerd.grpc.v1.cri', 'io.containerd.cri.v1.runtime',"
            " 'io.containerd.cri.v1.images', 'io.containerd.nri.v1.nri']\n"
            f"[plugins.'io.containerd.server.v1.grpc']\n  address = \"{sock}\"\n"
            f"[plugins.'io.containerd.server.v1.ttrpc']\n  address = \"{sock}.ttrpc\"\n"
            f"[plugins.'io.containerd.internal.v1.opt']\n  path = \"{state}/opt\"\n"
        )
        log_file = Path(state) / "containerd.log"
        with log_file.open("wb") as out:
            # A private mount namespace: whatever the unpack mounts stays out of the host's.
            proc = subprocess.Popen(
                [
                    "unshare",
                    "--mount",
                    "--propagation",
                    "private",
                    str(bin_dir / "containerd"),
                    "--config",
                    str(config),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            ctr = [str(bin_dir / "ctr"), "--address", sock, "-n", "k8s.io"]
            deadline = time.monotonic() + 30
            while not _answers(ctr):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RealNodeError(
                        f"the seed containerd did not answer on {sock}:\n"
                        f"{log_file.read_text(errors='replace')[-2000:]}"
                    )
                time.sleep(0.2)
            for archive in archives:
                run(
                    [*ctr, "images", "import", "--platform", "linux/amd64", str(archive)],
                    f"import {archive.name} into the node seed",
                    timeout=300,
                )
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _answers(ctr: list[str]) -> bool:
    return subprocess.run([*ctr, "version"], capture_output=True, check=False).returncode == 0


def _prune(base: Path, keep: Path) -> None:
    """Keep the newest ``KEEP`` seeds; remove the staging dirs of builds that died (the caller
    holds the lock, so no build is under way)."""
    for stale in base.iterdir():
        if stale.is_dir() and not (stale / "complete").is_file():
            shutil.rmtree(stale, ignore_errors=True)
    stores = sorted(
        (p for p in base.iterdir() if p.is_dir() and (p / "complete").is_file() and p != keep),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    for old in stores[KEEP - 1 :]:
        shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
