"""Principal components of recorded activity, over the live steps only."""

from typing import NamedTuple

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float

from .._typecheck import check_range, checked


class PCA(NamedTuple):
    """What [`eqx_ppo.analysis.pca`][] returns.

    **Fields:**

    - `components`: orthonormal rows by decreasing variance, largest entry positive.
    - `explained_variance_ratio`: each component's share of the total variance.
    - `projections`: every step's `(activity - mean) @ components.T`, masked too.
    - `mean`: the mean activity over the live steps.
    """

    components: Float[Array, "n_components units"]
    explained_variance_ratio: Float[Array, " n_components"]
    projections: Float[Array, "*batch n_components"]
    mean: Float[Array, " units"]


@checked
def pca(
    activations: Float[ArrayLike, "*batch units"],
    dones: Bool[ArrayLike, "*batch"],
    n_components: int,
) -> PCA:
    """Principal component analysis of one recorded layer's live steps.

    `activations` and `dones` are as [`eqx_ppo.record_activations_rollout`][]
    returns them; the steps after an episode ended take no part in the fit,
    whatever they hold (NaN included). Jittable with `n_components` static.
    """
    activations = jnp.asarray(activations, jnp.float32)
    n_units = activations.shape[-1]
    fix = f"ask for 1 to {n_units} components (the activity has {n_units} units)."
    check_range("pca(n_components=", n_components, 1, n_units, fix=fix)
    rows = activations.reshape(-1, n_units)
    live = ~jnp.asarray(dones).reshape(-1, 1)
    n_live = jnp.sum(live).astype(jnp.float32)
    mean = jnp.sum(jnp.where(live, rows, 0.0), axis=0) / n_live
    # Masked rows become zeros, which add nothing to the covariance.
    centred = jnp.where(live, rows - mean, 0.0)
    _, singular, right = jnp.linalg.svd(centred, full_matrices=False)
    variance = singular**2
    components = right[:n_components]
    largest = jnp.take_along_axis(
        components, jnp.argmax(jnp.abs(components), axis=1)[:, None], axis=1
    )
    components = components * jnp.where(largest < 0, -1.0, 1.0)
    return PCA(
        components=components,
        explained_variance_ratio=variance[:n_components] / jnp.sum(variance),
        projections=(activations - mean) @ components.T,
        mean=mean,
    )
