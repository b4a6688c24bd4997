"""What the optimiser trains: parameters, not statistics and not coefficients."""

import dataclasses
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, PyTree


class AbstractStatistics(eqx.Module):
    """Marks arrays that are never trained (e.g. a normaliser's running moments).

    [`eqx_ppo.nn.trainable`][] excludes every array inside a subclass, so the
    optimiser, gradient norms and weight logging skip them.
    """


def _is_statistics(node: Any) -> bool:
    return isinstance(node, AbstractStatistics)


def coefficient(*, nonnegative: bool = False, **kwargs: Any) -> Any:
    """A field for a layer's coefficient, e.g. an entropy or KL weight.

    The value is stored as a float32 array: a pytree leaf, so changing it
    does not recompile and a sweep can `vmap` over it, but
    [`eqx_ppo.nn.trainable`][] leaves it out, so the optimiser never moves it.
    `eqx.tree_at` skips the conversion: replace it with an array,
    `jnp.float32(0.02)`, not a Python float (which `eqx.filter_jit` would
    treat as a static value, compiling once per value).

    With `nonnegative=True` the layer refuses a concrete value (every entry
    of it) that is negative, infinite or NaN, as a weight of a loss term must
    not be; a value stays concrete even when the layer is built inside a
    trace (a factory under `eqx.filter_jit`), so it is still checked there.
    """
    return eqx.field(
        converter=_concrete_float32,
        metadata={"coefficient": True, "nonnegative": nonnegative},
        **kwargs,
    )


def _concrete_float32(x: Any) -> Array:
    """`jnp.asarray(x, float32)`, evaluated now unless `x` is itself traced."""
    with jax.ensure_compile_time_eval():
        return jnp.asarray(x, jnp.float32)


def nonnegative_coefficients(node: Any) -> dict[str, Array]:
    """A module's `coefficient(nonnegative=True)` fields, by name."""
    fields = dataclasses.fields(node)
    return {
        f.name: getattr(node, f.name)
        for f in fields
        if f.metadata.get("nonnegative", False)
    }


def coefficient_names(node: Any) -> tuple[str, ...]:
    """The names of a module's `coefficient` fields; `()` for anything else."""
    if not isinstance(node, eqx.Module):
        return ()
    fields = dataclasses.fields(node)
    return tuple(f.name for f in fields if f.metadata.get("coefficient", False))


def trainable(model: PyTree) -> PyTree[bool]:
    """A filter spec selecting the trainable leaves of `model`.

    Trainable means: a floating-point array not inside an
    [`eqx_ppo.nn.AbstractStatistics`][] and not a
    [`coefficient`][eqx_ppo.nn.coefficient] field. Use it with `eqx.partition`:

    ```python
    params, static = eqx.partition(model, eqx_ppo.nn.trainable(model))
    ```
    """

    def special(node: Any) -> bool:
        return _is_statistics(node) or bool(coefficient_names(node))

    def mark(node: Any) -> Any:
        if _is_statistics(node):
            return jax.tree.map(lambda _: False, node)
        names = coefficient_names(node)
        if names:
            spec = jax.tree.map(
                mark, node, is_leaf=lambda x: x is not node and special(x)
            )
            return eqx.tree_at(
                lambda s: [getattr(s, n) for n in names],
                spec,
                replace=[False] * len(names),
            )
        return eqx.is_inexact_array(node)

    return jax.tree.map(mark, model, is_leaf=special)
