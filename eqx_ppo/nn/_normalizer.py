"""Normalizer: running mean/std input standardisation with untrained statistics."""

import math
from collections.abc import Mapping
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray, PyTree

from ._errors import input_shape_fix
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
    return _is_shape(spec) or hasattr(spec, "shape")


def _to_shape(spec: Any) -> tuple[int, ...]:
    if hasattr(spec, "shape"):
        return tuple(spec.shape)
    if isinstance(spec, int):
        return (spec,)
    return tuple(spec)


class NormalizerStatistics(AbstractStatistics):
    """A [`eqx_ppo.nn.Normalizer`][]'s running moments: never trained.

    **Fields:**

    - `mean`: running mean, one array per input leaf.
    - `m2`: running sum of squared deviations from the mean, per input leaf.
    - `count`: number of samples folded in (float32, shared by all leaves).
    """

    mean: PyTree[Float[Array, "..."]]
    m2: PyTree[Float[Array, "..."]]
    count: Float[Array, ""]


class Normalizer(AbstractStatefulModule):
    """Standardises its input with running statistics: `(x - mean) / std`.

    The statistics live in a [`eqx_ppo.nn.NormalizerStatistics`][], so
    [`eqx_ppo.nn.trainable`][] excludes them, and the forward pass reads them
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
        spec = canonicalize(shape)
        leaves = jax.tree.leaves(spec, is_leaf=_is_shape_leaf)
        if not leaves or not all(_is_shape_leaf(leaf) for leaf in leaves):
            raise TypeError(
                "Normalizer(shape=...) expects an int, a tuple of ints, or a pytree "
                f"of those (or of arrays); got {shape!r}."
            )
        shapes = jax.tree.map(_to_shape, spec, is_leaf=_is_shape_leaf)
        for leaf in jax.tree.leaves(shapes, is_leaf=_is_shape):
            if any(d < 0 for d in leaf):
                raise ValueError(
                    f"Normalizer(shape=...) has a negative dimension in {leaf}."
                )
        if not std_min > 0:
            raise ValueError(f"Normalizer(std_min={std_min}) must be > 0.")
        if clip is not None and not clip > 0:
            raise ValueError(
                f"Normalizer(clip={clip}) must be > 0, or None for no clipping."
            )
        zeros = jax.tree.map(
            lambda s: jnp.zeros(s, jnp.float32), shapes, is_leaf=_is_shape
        )
        self.statistics = NormalizerStatistics(
            mean=zeros, m2=zeros, count=jnp.zeros((), jnp.float32)
        )
        self.std_min = float(std_min)
        self.clip = None if clip is None else float(clip)

    def _check_structure(self, what: str, tree: Any) -> None:
        expected = jax.tree.structure(self.statistics.mean)
        received = jax.tree.structure(tree)
        if expected != received:
            raise ValueError(
                f"Normalizer {what} has structure {received}, expected {expected} "
                "(the structure of the `shape` the Normalizer was built with)."
            )

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
        key: PRNGKeyArray | None = None,
    ) -> StatefulModuleOutput:
        """Normalise one env's input; emits the raw input as `extras`."""
        del state, extras, key
        x = canonicalize(x)
        self._check_structure("input", x)
        for leaf, mean in zip(
            jax.tree.leaves(x), jax.tree.leaves(self.statistics.mean), strict=True
        ):
            if jnp.shape(leaf) != mean.shape:
                raise ValueError(
                    f"Normalizer input leaf has shape {jnp.shape(leaf)}, expected "
                    f"{mean.shape} (one env's). "
                    + input_shape_fix(jnp.shape(leaf), mean.shape)
                )
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
        self._check_structure("update_statistics(extras)", extras)
        stats = self.statistics
        leads = set()
        for leaf, mean in zip(
            jax.tree.leaves(extras), jax.tree.leaves(stats.mean), strict=True
        ):
            shape = jnp.shape(leaf)
            n_feat = mean.ndim
            if len(shape) < n_feat or shape[len(shape) - n_feat :] != mean.shape:
                raise ValueError(
                    f"Normalizer.update_statistics: an extras leaf has shape {shape}, "
                    f"expected [*lead, *{mean.shape}] (e.g. [T, B, ...])."
                )
            leads.add(shape[: len(shape) - n_feat])
        if len(leads) != 1:
            raise ValueError(
                "Normalizer.update_statistics: extras leaves disagree on their "
                f"leading axes {sorted(leads)}; all must share the same [T, B]."
            )
        n = math.prod(leads.pop())
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
