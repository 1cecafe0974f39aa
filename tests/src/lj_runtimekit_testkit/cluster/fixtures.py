"""pytest fixtures of the cluster part of the harness."""
