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


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_programs():
    """Drop every compiled program after each test module.

    XLA:CPU maps each loaded executable into memory (about 900 mappings for a
    training run's programs) and keeps it while JAX's caches hold it; over
    the whole suite that passes Linux's default `vm.max_map_count` (65530)
    and the next compilation segfaults.
    """
    yield
    jax.clear_caches()
