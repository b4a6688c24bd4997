"""The suite's own setup, which every other test relies on."""

import os
from pathlib import Path

import jax
import jax.numpy as jnp
import jaxtyping
import numpy as np
import pytest

from eqx_ppo.ppo import gae


def test_annotations_are_checked_under_xdist():
    """`--jaxtyping-packages` (in `addopts`) checks eqx_ppo's annotations at
    call time in the pytest-xdist worker that runs this test (every worker
    gets the same options): a time axis of 3 against one of 4 is the
    checker's error, not a broadcasting error from inside."""
    three, four = jnp.zeros(3), jnp.zeros(4)
    flags = jnp.zeros(3, bool)
    with pytest.raises(jaxtyping.TypeCheckError, match="time"):
        gae(three, four, three, flags, flags, gamma=0.9, lambda_=0.9)


def _run_counting_cache_hits(fn, x):
    """`fn(x)`, and how many programs it loaded from the persistent cache."""
    hits = []

    def listener(event, **kwargs):
        if event == "/jax/compilation_cache/cache_hits":
            hits.append(event)

    jax.monitoring.register_event_listener(listener)
    try:
        y = jax.block_until_ready(fn(x))
    finally:
        jax.monitoring.unregister_event_listener(listener)
    return y, len(hits)


def test_each_process_reuses_programs_from_its_own_compilation_cache():
    """`conftest.py` gives this process (not the xdist controller, whose
    folder the workers would otherwise share) a folder of its own, and a
    program dropped from memory is loaded from it instead of compiled."""
    path = Path(os.environ["JAX_COMPILATION_CACHE_DIR"])
    assert path.name.startswith(f"eqx_ppo-tests-jax-cache-{os.getpid()}-")
    assert jax.config.jax_compilation_cache_dir == str(path)

    def program(x):
        return jnp.cumsum(x) * 1.25 - 0.5

    x = jnp.arange(11.0)
    before = set(path.iterdir())
    expected = np.asarray(jax.jit(program)(x))
    assert set(path.iterdir()) > before
    jax.clear_caches()
    y, hits = _run_counting_cache_hits(jax.jit(program), x)
    assert hits == 1
    np.testing.assert_array_equal(y, expected)


def test_an_entry_that_fails_to_load_is_compiled_again():
    """A damaged entry gives JAX's warning, which `filterwarnings` ignores:
    the program is compiled again and the test goes on."""
    path = Path(os.environ["JAX_COMPILATION_CACHE_DIR"])

    def program(x):
        return jnp.cumprod(x) / 3.0 + 2.0

    x = jnp.arange(1.0, 8.0)
    before = set(path.iterdir())
    expected = np.asarray(jax.jit(program)(x))
    for entry in set(path.iterdir()) - before:
        entry.write_bytes(b"not a compiled program")
    jax.clear_caches()
    y, hits = _run_counting_cache_hits(jax.jit(program), x)
    assert hits == 0
    np.testing.assert_array_equal(y, expected)
