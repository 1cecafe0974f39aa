"""pytest fixtures of the kubelet part of the harness."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator

import pytest_asyncio

from lj_runtimekit_testkit.kubelet.emulator import KubeletEmulator


@pytest_asyncio.fixture
async def kubelet_emulator() -> AsyncIterator[KubeletEmulator]:
    """A started emulator without a cluster, on a short temp plugin dir (unix path limits)."""
    plugin_dir = tempfile.mkdtemp(prefix="kubelet-")
    emulator = KubeletEmulator("emulated-node", plugin_dir)
    await emulator.start()
    try:
        yield emulator
    finally:
        await emulator.stop()
        shutil.rmtree(plugin_dir, ignore_errors=True)
