"""Scheduler plugins: one module each, with NAME, a factory ``new`` and a pure core function."""
