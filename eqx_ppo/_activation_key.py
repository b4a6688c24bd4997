"""The reserved metrics key under which recorded activations travel.

It lives in its own module so that both [`eqx_ppo.recording`][] and the
population graph (which records its populations itself) can import it without
importing each other.
"""

ACTIVATION_KEY = "__activation__"
"""Metrics key holding a recorded layer's forward output; see `extract_activations`."""
