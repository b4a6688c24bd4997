"""Fixed points of a recurrent layer under a constant input, and their stability."""

from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from jaxtyping import Array, Bool, Complex, Float, Int, PRNGKeyArray, PyTree

from .._typecheck import checked
from ..nn._module import AbstractStatefulModule


class FixedPoints(NamedTuple):
    """What [`eqx_ppo.analysis.fixed_points`][] returns: `k` distinct points,
    the most often reached first.

    **Fields:**

    - `states`: the carries `h` with `step(h, x) = h`, stacked: the layer's
        carry structure with a leading `[k]` axis (an LSTM's `(h, c)` as two
        `[k, hidden]` arrays).
    - `residuals`: `[k]`, the largest `|step(h, x) - h|` over the carry,
        divided by `1 + |h|` (the largest magnitude in the carry).
    - `eigenvalues`: `[k, dim]` complex, of the Jacobian of `h -> step(h, x)`
        at each point (the carry flattened, `dim` numbers), by decreasing
        modulus.
    - `stable`: `[k]`, whether every eigenvalue lies inside the unit circle,
        so that nearby states return to the point (a discrete-time map).
    - `counts`: `[k]`, how many starts converged to each point.
    """

    states: PyTree[Float[Array, "points ..."]]
    residuals: Float[Array, " points"]
    eigenvalues: Complex[Array, "points dim"]
    stable: Bool[Array, " points"]
    counts: Int[Array, " points"]


@checked
def fixed_points(
    cell: AbstractStatefulModule,
    x: PyTree[Float[Array, "..."]],
    *,
    n_starts: int,
    key: PRNGKeyArray,
    tol: float = 1e-5,
    spread: float = 1.0,
    min_distance: float = 1e-2,
    max_steps: int = 256,
) -> FixedPoints:
    """The fixed points of a recurrent layer held at the input `x`, with stability.

    `cell` is any layer with a carry: `LSTM`, `GRU`, `LRU`, `MinGRU`, or
    your own, run for one env as `cell(h, x).next_state`, so a stochastic
    layer must be in inference mode. Its carry, flattened (an LSTM's `(h, c)`,
    an LRU's real and imaginary parts), is the state `h` of the map
    `F(h) = step(h, x)`.

    From `n_starts` starts, the carry at an episode start plus Gaussian noise
    of standard deviation `spread` on every number, Optimistix's
    Levenberg-Marquardt solver minimises `|F(h) - h|^2` (all starts in one
    `vmap`). A start counts as converged when its largest residual
    `|F(h) - h|` is at most `tol * (1 + |h|)`, with `|h|` the largest
    magnitude in the carry (float32 reaches about 1e-7 at carries of order
    1); starts stuck at a slow point are dropped. Converged points whose
    largest coordinate difference is at most `min_distance * (1 + |h|)` are
    one point: float32 places a point of a nearly marginal direction (an
    LSTM cell state whose forget gate is close to 1) only to a fraction of
    its size. At each point the Jacobian of `F` (`jax.jacfwd`) gives the
    eigenvalues of the linearised dynamics, computed with NumPy on the host
    (so on any backend); the point is stable when they all have modulus
    below 1.

    Needs the `analysis` extra: `pip install "eqx_ppo[analysis]"`.
    """
    _optimistix()
    state0 = cell.initial_state()
    if not all(
        jnp.issubdtype(jnp.result_type(s), jnp.floating)
        for s in jax.tree.leaves(state0)
    ):
        raise ValueError(
            f"fixed_points(cell={type(cell).__name__}): the carry "
            f"{jax.tree.map(jnp.result_type, state0)} is not all float arrays; "
            "a fixed point is a point of a continuous state."
        )
    if n_starts < 1:
        raise ValueError(f"fixed_points(n_starts={n_starts}): give at least 1 start.")
    flat0, unravel = ravel_pytree(state0)
    starts = flat0 + spread * jax.random.normal(
        key, (n_starts, flat0.size), flat0.dtype
    )
    solutions, residuals = _solve(cell, x, starts, tol, max_steps)
    points, point_residuals, counts = _distinct(
        np.asarray(solutions), np.asarray(residuals), tol, min_distance
    )
    if len(points):
        jacobians = np.asarray(_jacobians(cell, x, jnp.asarray(points)), np.float64)
        eigenvalues = np.linalg.eigvals(jacobians)
    else:
        eigenvalues = np.zeros((0, flat0.size), np.complex128)
    order = np.argsort(-np.abs(eigenvalues), axis=1, kind="stable")
    eigenvalues = np.take_along_axis(eigenvalues, order, axis=1)
    return FixedPoints(
        states=jax.vmap(unravel)(
            jnp.asarray(points, flat0.dtype).reshape(-1, flat0.size)
        ),
        residuals=jnp.asarray(point_residuals, jnp.float32),
        eigenvalues=jnp.asarray(eigenvalues, jnp.complex64),
        stable=jnp.asarray(np.all(np.abs(eigenvalues) < 1.0, axis=1)),
        counts=jnp.asarray(counts, jnp.int32),
    )


def _optimistix() -> Any:
    try:
        import optimistix
    except ImportError as error:
        raise ImportError(
            "eqx_ppo.analysis.fixed_points needs Optimistix. Fix: "
            'pip install "eqx_ppo[analysis]" (or pip install optimistix).'
        ) from error
    return optimistix


def _flat_step(cell: AbstractStatefulModule, x: Any) -> Any:
    """`F(h) = step(h, x)` on the flattened carry."""
    _, unravel = ravel_pytree(cell.initial_state())

    def step(flat):
        return ravel_pytree(cell(unravel(flat), x).next_state)[0]

    return step


@eqx.filter_jit
def _solve(
    cell: AbstractStatefulModule,
    x: Any,
    starts: Float[Array, "starts dim"],
    tol: float,
    max_steps: int,
) -> tuple[Float[Array, "starts dim"], Float[Array, " starts"]]:
    """Every start's solution of `min |F(h) - h|^2` and its largest residual,
    relative to `1 + |h|`."""
    optx = _optimistix()
    step = _flat_step(cell, x)
    solver = optx.LevenbergMarquardt(rtol=1e-2 * tol, atol=1e-2 * tol)

    def solve(start):
        solution = optx.least_squares(
            lambda h, _: step(h) - h, solver, start, max_steps=max_steps, throw=False
        )
        h = solution.value
        return h, jnp.max(jnp.abs(step(h) - h)) / (1 + jnp.max(jnp.abs(h)))

    return jax.vmap(solve)(starts)


@eqx.filter_jit
def _jacobians(
    cell: AbstractStatefulModule, x: Any, points: Float[Array, "points dim"]
) -> Float[Array, "points dim dim"]:
    return jax.vmap(jax.jacfwd(_flat_step(cell, x)))(points)


def _distinct(
    solutions: np.ndarray, residuals: np.ndarray, tol: float, min_distance: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The converged solutions merged into distinct points (each the one with
    the smallest residual among those within `min_distance`, relative to
    their size), their relative residuals and how many solutions each took
    in, the largest count first."""
    converged = np.flatnonzero(residuals <= tol)
    converged = converged[np.argsort(residuals[converged], kind="stable")]
    points: list[int] = []
    counts: list[int] = []
    for i in converged:
        for j, p in enumerate(points):
            size = 1 + max(np.max(np.abs(solutions[i])), np.max(np.abs(solutions[p])))
            if np.max(np.abs(solutions[i] - solutions[p])) <= min_distance * size:
                counts[j] += 1
                break
        else:
            points.append(i)
            counts.append(1)
    order = np.argsort(-np.asarray(counts, np.int64), kind="stable")
    chosen = np.asarray(points, np.int64)[order]
    return solutions[chosen], residuals[chosen], np.asarray(counts, np.int64)[order]
