import jax
import pytest

jax.config.update("jax_numpy_dtype_promotion", "strict")


@pytest.fixture
def getkey():
    """Each call gives a fresh, deterministic key."""
    counter = iter(range(10**6))

    def _getkey():
        return jax.random.key(next(counter))

    return _getkey
