"""Fixed points of a recurrent layer under a constant input, and their stability."""

from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from jaxtyping import Array, Bool, Complex, Float, Int, PRNGKeyArray, PyTree

from .._optional import import_optional
from .._typecheck import check_range, checked
from ..nn._module import AbstractStatefulModule


class FixedPoints(NamedTuple):
    """What [`eqx_ppo.analysis.fixed_points`][] returns: `k` distinct points,
    the most often reached first.

    **Fields:**

    - `states`: the carries `h = step(h, x)`, each leaf with a leading `[k]` axis.
    - `residuals`: the largest `|step(h, x) - h|`, divided by `1 + |h|`.
    - `eigenvalues`: of the Jacobian at each point, by decreasing modulus.
    - `stable`: whether every eigenvalue lies inside the unit circle.
    - `counts`: how many starts converged to each point.
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

    From `n_starts` starts (the initial carry plus Gaussian noise of standard
    deviation `spread`), Levenberg-Marquardt minimises `|F(h) - h|^2` for
    `F(h) = cell(h, x).next_state`; the points converged to within `tol`, and
    apart by more than `min_distance` (both relative to `1 + |h|`), are kept.
    `cell`'s carry must be float arrays (a stochastic layer in inference mode).
    Needs `pip install "eqx_ppo[analysis]"`.
    """
    import_optional("optimistix", "eqx_ppo.analysis.fixed_points", "analysis")
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
    check_range("fixed_points(n_starts=", n_starts, 1)
    flat0, unravel = ravel_pytree(state0)
    starts = flat0 + spread * jax.random.normal(
        key, (n_starts, flat0.size), flat0.dtype
    )
    solutions, residuals = _solve(cell, x, starts, tol, max_steps)
    points, point_residuals, counts = _distinct(
        np.asarray(solutions), np.asarray(residuals), tol, min_distance
    )
    jacobians = np.asarray(_jacobians(cell, x, jnp.asarray(points)), np.float64)
    eigenvalues = np.linalg.eigvals(jacobians)  # [0, dim] when there are no points
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


def _flat_step(cell: AbstractStatefulModule, x: Any) -> Any:
    """`F(h) = step(h, x)` on the flattened carry."""
    _, unravel = ravel_pytree(cell.initial_state())
    return lambda flat: ravel_pytree(cell(unravel(flat), x).next_state)[0]


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
    optx = import_optional("optimistix", "eqx_ppo.analysis.fixed_points", "analysis")
    step = _flat_step(cell, x)
    solver = optx.LevenbergMarquardt(rtol=1e-2 * tol, atol=1e-2 * tol)

    def solve(start):
        h = optx.least_squares(
            lambda h, _: step(h) - h, solver, start, max_steps=max_steps, throw=False
        ).value
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
    """The converged solutions merged into distinct points (the smallest residual
    of each cluster), their residuals and counts, the largest count first."""
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
