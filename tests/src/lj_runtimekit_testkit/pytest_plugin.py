"""Fixtures of the harness, loaded for every test by the root ``conftest.py``.

The runtime simulator, the local control plane and the kubelet emulator add their fixtures here.
"""
