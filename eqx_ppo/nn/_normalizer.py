"""Normalizer: running mean/std input standardisation with untrained statistics."""

import math
from collections.abc import Mapping
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PyTree

from .._typecheck import check_range, checked
from ._errors import check_input
from ._filters import AbstractStatistics
from ._module import AbstractStatefulModule, StatefulModuleOutput, zero_loss


def canonicalize(tree: Any) -> Any:
    """`tree` with every `Mapping` (OrderedDict, FrozenDict, ...) a plain
    `dict`, which JAX flattens alike, and lists and tuples recursed into."""
    if isinstance(tree, Mapping):
        return {k: canonicalize(v) for k, v in tree.items()}
    if type(tree) in (list, tuple):
        return type(tree)(canonicalize(v) for v in tree)
    return tree


def _is_shape_leaf(spec: Any) -> bool:
    """Whether `spec` is a leaf of `Normalizer`'s `shape`."""
    if type(spec) in (tuple, list):
        return all(isinstance(d, int) for d in spec)
    return isinstance(spec, int | jax.ShapeDtypeStruct) or eqx.is_array(spec)


def _zeros(spec: Any) -> Float[Array, "..."]:
    """float32 zeros of the shape a leaf of `Normalizer`'s `shape` gives."""
    if eqx.is_array(spec) or isinstance(spec, jax.ShapeDtypeStruct):
        return jnp.zeros(spec.shape, jnp.float32)
    return jnp.zeros((spec,) if isinstance(spec, int) else tuple(spec), jnp.float32)


class NormalizerStatistics(AbstractStatistics):
    """A `Normalizer`'s running moments: the `mean` and the sum of squared
    deviations `m2` of each input leaf, and the `count` of samples."""

    mean: PyTree[Float[Array, "..."]]
    m2: PyTree[Float[Array, "..."]]
    count: Float[Array, ""]


@checked
class Normalizer(AbstractStatefulModule):
    """Standardises its input with running statistics: `(x - mean) / std`.

    The running moments (`statistics`) are an
    [`eqx_ppo.nn.AbstractStatistics`][]: never trained, changed only by
    `update_statistics`, once per iteration after the gradient phase, from
    the raw inputs this layer emitted as `extras`. Before any data it is the
    identity (nnx-ppo divides by 10). Inputs may be any pytree of arrays.
    """

    ignores_key = True

    statistics: NormalizerStatistics
    std_min: float = eqx.field(static=True)
    clip: float | None = eqx.field(static=True)

    def __init__(
        self,
        shape: PyTree[int | Array | np.ndarray | jax.ShapeDtypeStruct],
        *,
        std_min: float = 1e-3,
        clip: float | None = None,
    ):
        """**Arguments:**

        - `shape`: one env's input shape, or a pytree of them (or of arrays).
        - `std_min`: floor on the standard deviation.
        - `clip`: if given, clip the normalised output to `[-clip, clip]`.
        """
        check_range("Normalizer(std_min=", std_min, 0, open_low=True)
        fix = "a positive bound, or None for no clipping."
        check_range("Normalizer(clip=", clip, 0, open_low=True, fix=fix)
        zeros = jax.tree.map(_zeros, canonicalize(shape), is_leaf=_is_shape_leaf)
        self.statistics = NormalizerStatistics(
            mean=zeros, m2=zeros, count=jnp.zeros((), jnp.float32)
        )
        self.std_min = float(std_min)
        self.clip = None if clip is None else float(clip)

    def std(self) -> PyTree[Float[Array, "..."]]:
        """The standard deviation used to normalise: floored, 1 before any data."""
        stats = self.statistics
        has_data = stats.count > 0
        # The max keeps the unused branch finite, so gradients stay NaN-free.
        count = jnp.maximum(stats.count, 1.0)
        return jax.tree.map(
            lambda m2: jnp.where(
                has_data, jnp.sqrt(jnp.maximum(m2 / count, self.std_min**2)), 1.0
            ),
            stats.m2,
        )

    def __call__(self, state, x, extras=None, *, key=None) -> StatefulModuleOutput:
        """Normalise one env's input; emits the raw input as `extras`."""
        del state, extras, key
        x = canonicalize(x)
        check_input(self, x, self.statistics.mean)
        # Statistics are data, not parameters: no gradient may reach them.
        frozen = eqx.tree_at(
            lambda m: m.statistics, self, jax.lax.stop_gradient(self.statistics)
        )

        def normalise(v, mean, std):
            y = (jnp.asarray(v, jnp.float32) - mean) / std
            if self.clip is not None:
                y = jnp.clip(y, -self.clip, self.clip)
            return y

        output = jax.tree.map(normalise, x, frozen.statistics.mean, frozen.std())
        return StatefulModuleOutput((), output, zero_loss(), {}, x)

    def update_statistics(self, extras: PyTree[Array]) -> "Normalizer":
        """Fold a rollout's raw inputs (leaves `[*lead, *shape]`, usually
        `lead = [T, B]`) into the running statistics, in one Welford/Chan
        update."""
        extras = canonicalize(extras)
        stats = self.statistics
        leaf, mean = jax.tree.leaves(extras)[0], jax.tree.leaves(stats.mean)[0]
        n = math.prod(jnp.shape(leaf)[: jnp.ndim(leaf) - mean.ndim])
        if n == 0:
            return self

        def merge(v, mean, m2):
            v = jnp.asarray(v, jnp.float32).reshape(n, *mean.shape)
            batch_mean = jnp.mean(v, axis=0)
            batch_m2 = jnp.sum(jnp.square(v - batch_mean), axis=0)
            delta = batch_mean - mean
            new_mean = mean + delta * (n / new_count)
            new_m2 = m2 + batch_m2 + jnp.square(delta) * (stats.count * n / new_count)
            return new_mean, new_m2

        new_count = stats.count + n
        merged = jax.tree.map(merge, extras, stats.mean, stats.m2)
        outer = jax.tree.structure(stats.mean)
        new_mean, new_m2 = jax.tree.transpose(outer, jax.tree.structure((0, 0)), merged)
        new_stats = NormalizerStatistics(new_mean, new_m2, new_count)
        return eqx.tree_at(lambda m: m.statistics, self, new_stats)
