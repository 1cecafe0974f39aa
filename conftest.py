"""The suite-wide pytest setup: the harness fixtures (cluster, simulator, kubelet emulator)."""

pytest_plugins = ["lj_runtimekit_testkit.pytest_plugin"]
