"""The kubelet part of the harness."""
