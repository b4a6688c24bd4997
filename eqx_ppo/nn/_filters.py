"""What the optimiser trains: parameters, not statistics and not coefficients."""

import dataclasses
from typing import Any

import equinox as eqx
import jax
from jaxtyping import PyTree

from .._typecheck import float32_array


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
        converter=float32_array,  # any shape: a vector of shifts too
        metadata={"coefficient": True, "nonnegative": nonnegative},
        **kwargs,
    )


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
