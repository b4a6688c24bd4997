"""Helpers shared by the tests (import them with `from tests._helpers import ...`)."""

import os

import jax
import numpy as np

SEED_OFFSET = int(os.environ.get("EQX_PPO_TEST_SEED_OFFSET", "0"))
"""Added to every learning test's seed: `EQX_PPO_TEST_SEED_OFFSET=1000` checks
that no test depends on the seeds it happens to use."""

N_ULP = 64 if jax.default_backend() == "tpu" else 16
"""Default tolerance of `assert_ulp_close`, in ulps of a leaf's largest magnitude.

Two computations of the same values by different XLA programs (other op shapes,
vmap vs a loop, jit vs eager, extra outputs) may sum and fuse differently, and
whether multiply-adds become FMAs depends on the CPU. Measured on an AVX-512
machine and with XLA's code generation capped at AVX2 and at SSE4.2
(`XLA_FLAGS=--xla_cpu_max_isa=...`), the comparisons in this suite differ by at
most 3.5 ulps (one PPO update vmapped over learning rates vs run alone; a
forward pass eagerly vs in a compiled scan: 3). 16 leaves a 4x margin and is
still about 2e-6 relative; a real bug (another key, a wrong carry) moves
values by many orders of magnitude more.

On a TPU (float32 matmuls at "highest" precision, `conftest.py`) a replay
differed from each env's loop of calls by up to 30 ulps (`test_replay.py`,
TPU v5e, JAX 0.10.2); at the default precision, by 6e4. 64 keeps a 2x margin.
"""


TPU_RTOL = 5e-4
"""The relative tolerance on a TPU of a float32 value computed through `exp`,
`log`, `tanh`, `softplus` and the like against its exact value.

XLA:TPU approximates these functions; against float64 NumPy over [-20, 20]
(`python -m benchmarks.accuracy`, TPU v5e, JAX 0.10.2) their largest relative
errors are 3.5e-4 (`log`), 2.6e-4 (`softplus`, `log1p`), 1.2e-4 (`expm1`),
8.1e-5 (`tanh`) and 5.5e-6 (`exp`, `sigmoid`); XLA:CPU's are at most 5.2 ulps
(3.7e-7). Two programs on one backend still agree to `N_ULP`.
"""


def rtol(cpu: float) -> float:
    """`cpu`, a test's relative tolerance against exact values, widened to
    `TPU_RTOL` on a TPU."""
    return max(cpu, TPU_RTOL) if jax.default_backend() == "tpu" else cpu


def cpu_child_env(**extra: str) -> dict[str, str]:
    """The environment of a process a test starts: this one's on the CPU
    (only one process can hold a TPU, and the suite's does), plus `extra`."""
    return {**os.environ, "JAX_PLATFORMS": "cpu", **extra}


def _host(x):
    if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    return np.asarray(x)


def assert_ulp_close(actual, expected, n_ulp: float = N_ULP) -> None:
    """Assert two pytrees of arrays are equal up to float rounding.

    Structures, shapes and dtypes must match. In a floating-point leaf every
    element must satisfy `|actual - expected| <= n_ulp * spacing(max|expected|)`,
    one ulp taken in the leaf's dtype at the leaf's largest magnitude: rounding
    errors scale with the operands, not with the result, so an element that
    cancels to near zero gets the same absolute tolerance as its neighbours
    (an all-zero leaf must match exactly). Non-finite values never match.
    Integer, boolean and key leaves (compared as key data) must be identical.
    """
    paths, structure = jax.tree_util.tree_flatten_with_path(actual)
    leaves, expected_structure = jax.tree.flatten(expected)
    assert structure == expected_structure, f"{structure} != {expected_structure}"
    for (path, a), e in zip(paths, leaves, strict=True):
        where = jax.tree_util.keystr(path) or "the leaf"
        a, e = _host(a), _host(e)
        assert (a.dtype, a.shape) == (e.dtype, e.shape), (
            f"{where}: {a.dtype}{list(a.shape)} != {e.dtype}{list(e.shape)}"
        )
        if not np.issubdtype(e.dtype, np.inexact):
            np.testing.assert_array_equal(a, e, err_msg=where)
            continue
        assert np.isfinite(a).all() and np.isfinite(e).all(), f"{where}: not finite"
        scale = np.max(np.abs(e), initial=0.0)
        ulp = float(np.spacing(scale))
        error = float(np.max(np.abs(a.astype(np.float64) - e), initial=0.0))
        assert error <= n_ulp * ulp, (
            f"{where}: max |actual - expected| = {error:.3g}, {error / ulp:.3g} ulps "
            f"of the largest magnitude {scale:.3g} (allowed: {n_ulp})"
        )
