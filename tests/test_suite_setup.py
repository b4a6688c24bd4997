"""The suite's own setup, which every other test relies on."""

import jax.numpy as jnp
import jaxtyping
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
