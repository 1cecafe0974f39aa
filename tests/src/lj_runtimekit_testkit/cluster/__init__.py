"""The cluster part of the harness."""
