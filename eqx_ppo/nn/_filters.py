"""What the optimiser trains: parameters, not statistics and not coefficients."""

import dataclasses
from typing import Annotated, Any

import equinox as eqx
import jax
import jax.numpy as jnp
from beartype.vale import IsInstance
from jaxtyping import Array, ArrayLike, PyTree, Real


class AbstractStatistics(eqx.Module):
    """Marks arrays that are never trained (e.g. a normaliser's running
    moments): [`eqx_ppo.nn.trainable`][] excludes every array inside one."""


def coefficient(*, nonnegative: bool = False, **kwargs: Any) -> Any:
    """A field for a layer's coefficient, e.g. an entropy or KL weight.

    Stored as a float32 array: a pytree leaf (changing it does not recompile,
    a sweep can `vmap` over it) that [`eqx_ppo.nn.trainable`][] leaves out.
    With `eqx.tree_at`, replace it with an array (`jnp.float32(0.02)`), not a
    Python float, which `eqx.filter_jit` would treat as static. With
    `nonnegative=True` the layer refuses a concrete value that is negative,
    infinite or NaN, even when built inside a trace.
    """
    return eqx.field(
        converter=_concrete_float32,
        metadata={"coefficient": True, "nonnegative": nonnegative},
        **kwargs,
    )


def _concrete_float32(x: Annotated[Real[ArrayLike, "..."], ~IsInstance[bool]]) -> Array:
    """`jnp.asarray(x, float32)`, evaluated now unless `x` is itself traced. Of
    any shape (a vector of shifts is a coefficient too), but a number: not a
    bool, not a string."""
    with jax.ensure_compile_time_eval():
        return jnp.asarray(x, jnp.float32)


def coefficient_names(node: Any, flag: str = "coefficient") -> tuple[str, ...]:
    """The names of a module's `coefficient` fields (with `flag="nonnegative"`,
    of its `coefficient(nonnegative=True)` ones); `()` for anything else."""
    if not isinstance(node, eqx.Module):
        return ()
    fields = dataclasses.fields(node)
    return tuple(f.name for f in fields if f.metadata.get(flag, False))


def trainable(model: PyTree) -> PyTree[bool]:
    """A filter spec selecting the trainable leaves of `model`, for `eqx.partition`:
    the floating-point arrays that are neither inside an
    [`eqx_ppo.nn.AbstractStatistics`][] nor a
    [`coefficient`][eqx_ppo.nn.coefficient] field.
    """

    def special(node: Any) -> bool:
        return isinstance(node, AbstractStatistics) or bool(coefficient_names(node))

    def mark(node: Any) -> Any:
        if isinstance(node, AbstractStatistics):
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
