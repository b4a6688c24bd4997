"""Plots of the analyses, with matplotlib imported only when one is drawn."""

from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.flatten_util import ravel_pytree
from jaxtyping import Array, ArrayLike, Bool, Float, PyTree

from .._optional import import_optional
from ._fixed_points import FixedPoints
from ._pca import PCA


def _axes(ax: Any) -> Any:
    if ax is not None:
        return ax
    import_optional("matplotlib", "eqx_ppo.analysis.plot_*", "analysis")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(6, 4))[1]


def plot_importance(
    importance: Float[ArrayLike, " units"], *, ax: Any = None, sort: bool = True
) -> Any:
    """Bars of [`eqx_ppo.analysis.unit_importance`][]: one per unit, the most
    important first if `sort`, labelled with the unit's index. Returns the
    matplotlib axes (new ones unless `ax` is given)."""
    ax = _axes(ax)
    values = np.asarray(importance, np.float64)
    order = np.argsort(-values, kind="stable") if sort else np.arange(len(values))
    ax.bar(np.arange(len(values)), values[order], color="C0")
    ax.set_xticks(
        np.arange(len(values)),
        [str(i) for i in order],
        fontsize="small",
        rotation=90 if len(values) > 8 else 0,
    )
    ax.axhline(0.0, color="k", lw=0.8)
    ax.set(xlabel="unit", ylabel="drop in return when ablated")
    return ax


def plot_trajectories(
    result: PCA,
    dones: Bool[ArrayLike, "time env"],
    color_by: Float[ArrayLike, " env"],
    *,
    components: tuple[int, int] = (0, 1),
    ax: Any = None,
    cmap: str = "coolwarm",
) -> Any:
    """Each env's live steps on two components of [`eqx_ppo.analysis.pca`][] of
    `[time, env, units]` activity, coloured by a task variable per env (e.g.
    the cue). Returns the matplotlib axes."""
    ax = _axes(ax)
    import matplotlib as mpl

    projections = np.asarray(result.projections)
    live = ~np.asarray(dones)
    value = np.asarray(color_by, np.float64)
    norm = mpl.colors.Normalize(value.min(), value.max() + 1e-12)
    colors = mpl.colormaps[cmap](norm(value))
    a, b = components
    for env in range(projections.shape[1]):
        steps = projections[live[:, env], env]
        ax.plot(steps[:, a], steps[:, b], color=colors[env], alpha=0.6, lw=1)
        ax.plot(steps[:1, a], steps[:1, b], "o", color=colors[env], ms=3)
    ratio = np.asarray(result.explained_variance_ratio)
    ax.set(
        xlabel=f"PC{a + 1} ({100 * ratio[a]:.0f}% of variance)",
        ylabel=f"PC{b + 1} ({100 * ratio[b]:.0f}% of variance)",
    )
    ax.figure.colorbar(mpl.cm.ScalarMappable(norm, cmap), ax=ax)
    return ax


def plot_fixed_points(
    points: FixedPoints,
    *,
    select: Callable[[PyTree[Array]], Float[Array, "points units"]] | None = None,
    pca: PCA | None = None,
    components: tuple[int, int] = (0, 1),
    ax: Any = None,
) -> Any:
    """The points of [`eqx_ppo.analysis.fixed_points`][] (stable ones filled) on two
    coordinates of `select(states)` (default the flattened carry), or on two
    components of `pca`, to draw over [`eqx_ppo.analysis.plot_trajectories`][].
    Returns the matplotlib axes."""
    ax = _axes(ax)
    select = jax.vmap(lambda s: ravel_pytree(s)[0]) if select is None else select
    vectors = np.asarray(select(points.states), np.float64)
    if pca is not None:
        vectors = (vectors - np.asarray(pca.mean)) @ np.asarray(pca.components).T
    xy = vectors[:, list(components)]
    stable = np.asarray(points.stable)
    ax.scatter(*xy[stable].T, s=80, c="k", marker="o", label="stable", zorder=3)
    hollow = dict(facecolors="none", edgecolors="k", lw=1.5)
    ax.scatter(*xy[~stable].T, s=80, label="unstable", zorder=3, **hollow)
    ax.legend()
    return ax
