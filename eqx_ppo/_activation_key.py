"""The reserved metrics key of recorded activations, in a module of its own so
that `recording` and the population graph import it without importing each other."""

ACTIVATION_KEY = "__activation__"
"""Metrics key holding a recorded layer's forward output; see `extract_activations`."""
