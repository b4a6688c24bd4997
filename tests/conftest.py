import atexit
import importlib.util
import os
import shutil
import tempfile

import jax
import jaxtyping
import pytest


def _use_own_compilation_cache():
    """Keep this process's compiled programs on disk for the whole session.

    `_free_compiled_programs` drops JAX's in-memory caches after every test
    module, and each docs page runs in a fresh interpreter, so without this
    the same training programs are compiled again and again (on a 2-core
    Zen 1 the default suite takes 12 % less time). Each process gets a
    folder of its own, removed at exit: JAX writes entries without a lock, so
    two pytest-xdist workers sharing one could read a half-written entry,
    and the key does not name the CPU's instruction set, so a folder must
    never travel between machines. Docs interpreters inherit their worker's
    folder through the environment and run while the worker waits.
    """
    path = tempfile.mkdtemp(prefix=f"eqx_ppo-tests-jax-cache-{os.getpid()}-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    os.environ.update(
        JAX_COMPILATION_CACHE_DIR=path,
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1",
    )
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


# Before anything compiles: JAX decides once, at its first compilation,
# whether a persistent cache is in use.
_use_own_compilation_cache()
jax.config.update("jax_numpy_dtype_promotion", "strict")

QUICK_COMPILE = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
"""XLA:CPU flags that compile for speed: unoptimised code generation through
the element-wise emitters."""


def pytest_configure(config):
    """Compile the default suite's programs for compile speed.

    The default suite (`-m 'not slow'`) compiles many small programs and
    runs most of them for a few steps, so XLA:CPU's compilation is nearly all
    of its time: `QUICK_COMPILE` takes it from 980 s to 480 s on two Zen 3
    cores. The slow tests train for long and keep the optimised code users
    run, as do the docs pages (`test_docs.py`), and so does a TPU host, where
    the flags would reach the TPU's compiler. Set before JAX starts its
    backend, and inherited by the processes tests start (CLI runs).
    """
    tpu_host = importlib.util.find_spec("libtpu") is not None
    if config.option.markexpr == "not slow" and not tpu_host:
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {QUICK_COMPILE}"
    # A TPU multiplies float32 matrices in reduced-precision passes by
    # default; two programs computing the same values (a rollout and its
    # replay) then agree to about 3 digits. The suite asserts float32
    # agreement (`tests/_helpers.py`).
    if jax.default_backend() == "tpu":
        jax.config.update("jax_default_matmul_precision", "highest")


@pytest.fixture
def optimised_xla_flags():
    """`XLA_FLAGS` without `QUICK_COMPILE`, for a process that compiles as
    users compile."""
    return os.environ.get("XLA_FLAGS", "").replace(QUICK_COMPILE, "").strip()


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


@pytest.fixture
def unchecked():
    """Turn off the suite's runtime type checker, which would answer a wrongly
    typed argument first with its own error: tests using this check what
    users see."""
    previous = jaxtyping.config.jaxtyping_disable
    jaxtyping.config.update("jaxtyping_disable", True)
    yield
    jaxtyping.config.update("jaxtyping_disable", previous)
