"""The simulator part of the harness."""
