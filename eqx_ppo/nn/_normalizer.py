"""Normalizer: running mean/std input standardisation with untrained statistics."""

import math
from collections.abc import Mapping
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Key, PyTree

from .._typecheck import checked
from ._errors import input_shape_fix, tree_spec
from ._filters import AbstractStatistics
from ._module import AbstractStatefulModule, StatefulModuleOutput, zero_loss


def canonicalize(tree: Any) -> Any:
    """Turn every `Mapping` (OrderedDict, FrozenDict, ...) into a plain `dict`.

    JAX treats `dict` and `OrderedDict` as different pytree nodes, so a
    normaliser built from one would not line up with observations given as
    the other. Lists and tuples are recursed into; other nodes are kept.
    """
    if isinstance(tree, Mapping):
        return {k: canonicalize(v) for k, v in tree.items()}
    if type(tree) in (list, tuple):
        return type(tree)(canonicalize(v) for v in tree)
    return tree


def _is_shape(spec: Any) -> bool:
    return isinstance(spec, int) or (
        type(spec) in (tuple, list) and all(isinstance(d, int) for d in spec)
    )


def _is_shape_leaf(spec: Any) -> bool:
    return _is_shape(spec) or _is_array_like(spec)


def _is_array_like(spec: Any) -> bool:
    return eqx.is_array(spec) or isinstance(spec, jax.ShapeDtypeStruct)


def _to_shape(spec: Any) -> tuple[int, ...]:
    if _is_array_like(spec):
        return tuple(spec.shape)
    if isinstance(spec, int):
        return (spec,)
    return tuple(spec)


def _check_input(x: PyTree[Array], mean: PyTree[Array]) -> None:
    """Raise at trace time unless `x` is one env's input, shaped like `mean`."""
    leaves, structure = jax.tree.flatten(x)
    means, expected = jax.tree.flatten(mean)
    if structure == expected and all(
        jnp.shape(leaf) == m.shape for leaf, m in zip(leaves, means, strict=True)
    ):
        return
    if structure == expected:
        got, want = next(
            (jnp.shape(leaf), m.shape)
            for leaf, m in zip(leaves, means, strict=True)
            if jnp.shape(leaf) != m.shape
        )
        fix = input_shape_fix(got, want)
    else:
        fix = "Give it an input of the structure it was built with (its `shape`)."
    raise ValueError(
        f"Normalizer expects one env's input {tree_spec(mean)}, got "
        f"{tree_spec(x)}. {fix}"
    )


class NormalizerStatistics(AbstractStatistics):
    """A `Normalizer`'s running moments: never trained.

    **Fields:**

    - `mean`: running mean, one array per input leaf.
    - `m2`: running sum of squared deviations from the mean, per input leaf.
    - `count`: number of samples folded in (float32, shared by all leaves).
    """

    mean: PyTree[Float[Array, "..."]]
    m2: PyTree[Float[Array, "..."]]
    count: Float[Array, ""]


@checked
class Normalizer(AbstractStatefulModule):
    """Standardises its input with running statistics: `(x - mean) / std`.

    The statistics (`statistics`: the running `mean`, `m2` and `count`) are an
    [`eqx_ppo.nn.AbstractStatistics`][], so [`eqx_ppo.nn.trainable`][]
    excludes them, and the forward pass reads them
    through `lax.stop_gradient`. They change only through
    `update_statistics`, which the trainer calls once per iteration, after the
    gradient phase, with the raw inputs this layer saw during the rollout (it
    emits them as `extras`).

    Differences from nnx-ppo's `Normalizer`, on purpose:

    1. Before any data (`count == 0`) the layer is the identity (mean 0,
       std 1); nnx-ppo divides by 10 instead.
    2. The std floor is `std_min` (default `1e-3`, the same as nnx-ppo's
       variance floor of `1e-6`).
    3. An optional `clip` bounds the normalised output to `[-clip, clip]`.

    Inputs may be a single array or a pytree of arrays (e.g. dict
    observations); any `Mapping` is treated as a plain `dict`.

    ```python
    norm = Normalizer({"pos": 3, "vel": (2,)})
    out = norm((), {"pos": jnp.ones(3), "vel": jnp.ones(2)})
    norm = norm.update_statistics(rollout_extras)  # leaves [T, B, *shape]
    ```
    """

    statistics: NormalizerStatistics
    std_min: float = eqx.field(static=True)
    clip: float | None = eqx.field(static=True)

    def __init__(
        self,
        shape: int | tuple[int, ...] | PyTree[Any],
        *,
        std_min: float = 1e-3,
        clip: float | None = None,
    ):
        """**Arguments:**

        - `shape`: one env's input shape: an int, a tuple of ints, or a pytree
            (e.g. a dict) whose leaves are ints, tuples of ints, or arrays /
            `jax.ShapeDtypeStruct`s whose shapes are used.
        - `std_min`: floor on the standard deviation, so near-constant
            features are not blown up.
        - `clip`: if given, the normalised output is clipped to
            `[-clip, clip]`.
        """
        if not std_min > 0:
            raise ValueError(f"Normalizer(std_min={std_min}) must be > 0.")
        if clip is not None and not clip > 0:
            raise ValueError(
                f"Normalizer(clip={clip}) must be > 0, or None for no clipping."
            )
        shapes = jax.tree.map(_to_shape, canonicalize(shape), is_leaf=_is_shape_leaf)
        zeros = jax.tree.map(
            lambda s: jnp.zeros(s, jnp.float32), shapes, is_leaf=_is_shape
        )
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

    def __call__(
        self,
        state: tuple[()],
        x: PyTree[Array],
        extras: Any = None,
        *,
        key: Key[Array, ""] | None = None,
    ) -> StatefulModuleOutput:
        """Normalise one env's input; emits the raw input as `extras`."""
        del state, extras, key
        x = canonicalize(x)
        _check_input(x, self.statistics.mean)
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
        """Fold a rollout's raw inputs into the running statistics.

        `extras` has this layer's input structure with leaves
        `[*lead, *shape]` (usually `lead = [T, B]`); all samples are merged
        in one batched Welford/Chan update. Returns a new Normalizer.
        """
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
