"""Linear probes: how well a linear read-out decodes a variable from activity."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float, Int, PRNGKeyArray

from .._typecheck import check_range, checked


@checked
def linear_probe(
    features: Float[ArrayLike, "samples features"],
    labels: Int[ArrayLike, " samples"]
    | Bool[ArrayLike, " samples"]
    | Float[ArrayLike, "samples ..."],
    *,
    key: PRNGKeyArray,
    test_fraction: float = 0.25,
    ridge: float = 1e-3,
) -> Float[Array, ""]:
    """The held-out score of a ridge-regression read-out of `labels` from `features`.

    A `test_fraction` share of the samples, shuffled with `key`, is held out;
    the score is the held-out accuracy for integer or boolean labels (classes),
    else the R^2 averaged over targets. `ridge` weighs the squared norm of the
    weights, the intercept's excepted. Call it outside `jit` (the classes are
    read on the host).
    """
    features = jnp.asarray(features, jnp.float32)
    labels = jnp.asarray(labels)
    n = features.shape[0]
    n_test = round(n * test_fraction)
    if not 0 < test_fraction < 1 or n_test < 1 or n - n_test < 2:
        raise ValueError(
            f"linear_probe(test_fraction={test_fraction}) of {n} samples holds out "
            f"{n_test}. Fix: a fraction in (0, 1) that leaves at least one test "
            "and two training samples."
        )
    check_range("linear_probe(ridge=", ridge, 0, open_low=True)
    if labels.shape[0] != n:
        raise ValueError(
            f"linear_probe: {n} feature rows but {labels.shape[0]} labels. Fix: "
            "one label per row of features."
        )
    classify = labels.dtype == jnp.bool_ or jnp.issubdtype(labels.dtype, jnp.integer)
    if classify:
        classes, index = np.unique(np.asarray(labels), return_inverse=True)
        targets = jax.nn.one_hot(jnp.asarray(index), len(classes), dtype=jnp.float32)
    else:
        targets = labels.astype(jnp.float32).reshape(n, -1)
    return _score(features, targets, key, n_test, ridge, classify)


@eqx.filter_jit
def _score(
    features: Float[Array, "samples features"],
    targets: Float[Array, "samples targets"],
    key: PRNGKeyArray,
    n_test: int,
    ridge: float,
    classify: bool,
) -> Float[Array, ""]:
    """The held-out accuracy (`classify`, one-hot `targets`) or R^2 of a ridge
    read-out fitted on all but `n_test` samples, shuffled with `key`."""
    n = features.shape[0]
    order = jax.random.permutation(key, n)
    test, train = order[:n_test], order[n_test:]
    mean = jnp.mean(features[train], axis=0)
    std = jnp.std(features[train], axis=0)
    scaled = (features - mean) / jnp.where(std > 1e-6 * (1 + jnp.abs(mean)), std, 1.0)
    inputs = jnp.concatenate([scaled, jnp.ones((n, 1), jnp.float32)], axis=1)
    # Mean squared error + `ridge` |w|^2, the intercept's (last) column unpenalised.
    fit, fit_targets = inputs[train], targets[train]
    penalty = ridge * jnp.eye(fit.shape[1], dtype=jnp.float32).at[-1, -1].set(0.0)
    gram = fit.T @ fit / len(fit) + penalty
    weights = jnp.linalg.solve(gram, fit.T @ fit_targets / len(fit))
    predicted = inputs[test] @ weights
    if classify:
        hits = jnp.argmax(predicted, axis=1) == jnp.argmax(targets[test], axis=1)
        return jnp.mean(hits.astype(jnp.float32))
    residual = jnp.sum((targets[test] - predicted) ** 2, axis=0)
    spread = jnp.sum((targets[test] - jnp.mean(targets[test], axis=0)) ** 2, axis=0)
    return jnp.mean(1.0 - residual / spread)
