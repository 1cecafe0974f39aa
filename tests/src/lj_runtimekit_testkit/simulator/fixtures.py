"""pytest fixtures of the simulator part of the harness."""
