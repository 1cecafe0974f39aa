"""pytest fixtures of the kubelet part of the harness."""
