"""Fixtures of the harness, loaded for every test by the root ``conftest.py``.

Each part of the harness keeps its fixtures in its own ``fixtures`` module; this plugin only
gathers them, so every test in the repository sees the same names.
"""

pytest_plugins = [
    "lj_runtimekit_testkit.simulator.fixtures",
    "lj_runtimekit_testkit.cluster.fixtures",
    "lj_runtimekit_testkit.kubelet.fixtures",
    "lj_runtimekit_testkit.registry",
    "lj_runtimekit_testkit.workers",
]
