"""The test harness of the suite: the runtime simulator, the local control plane and the kubelet
emulator. Used by pytest fixtures, the demo and the benchmarks; never by a component."""
