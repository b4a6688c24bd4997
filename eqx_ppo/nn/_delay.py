"""Delay: outputs what it was given `k_steps` calls ago."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, PyTree

from .._typecheck import check_range, checked
from ._errors import check_input
from ._module import AbstractStatefulModule, StatefulModuleOutput, zero_loss
from ._normalizer import canonicalize


@checked
class Delay(AbstractStatefulModule):
    """A `k_steps` delay line: the output at step `t` is the input at `t - k_steps`.

    For the first `k_steps` steps of an episode the output is `initial_value`.
    The carry is a ring buffer of the last `k_steps` inputs and the index of
    the slot to read and overwrite. Inputs are cast to `sample_input`'s dtypes.
    """

    ignores_key = True

    k_steps: int = eqx.field(static=True)
    initial_value: float = eqx.field(static=True)
    treedef: Any = eqx.field(static=True)
    shapes: tuple[tuple[int, ...], ...] = eqx.field(static=True)
    dtypes: tuple[np.dtype, ...] = eqx.field(static=True)

    def __init__(
        self,
        sample_input: PyTree[Array | jax.ShapeDtypeStruct],
        k_steps: int,
        initial_value: float = 0.0,
    ):
        """**Arguments:**

        - `sample_input`: one env's input (arrays or `jax.ShapeDtypeStruct`s).
        - `k_steps`: the delay in steps, `>= 1`.
        - `initial_value`: what the buffer holds at first and after each reset.
        """
        fix = "for no delay, leave the Delay out."
        check_range("Delay(k_steps=", k_steps, 1, fix=fix)
        leaves, treedef = jax.tree.flatten(canonicalize(sample_input))
        self.k_steps = k_steps
        self.initial_value = float(initial_value)
        self.treedef = treedef
        self.shapes = tuple(tuple(leaf.shape) for leaf in leaves)
        self.dtypes = tuple(np.dtype(leaf.dtype) for leaf in leaves)

    def initial_state(self) -> dict[str, Any]:
        """`{"buffer": ..., "idx": 0}`: every slot of the buffer (the input's
        pytree, leaves `[k_steps, *shape]`) holds `initial_value`."""
        buffer = [
            jnp.full((self.k_steps, *shape), self.initial_value, dtype)
            for shape, dtype in zip(self.shapes, self.dtypes, strict=True)
        ]
        return {
            "buffer": jax.tree.unflatten(self.treedef, buffer),
            "idx": jnp.zeros((), jnp.int32),
        }

    def __call__(self, state, x, extras=None, *, key=None) -> StatefulModuleOutput:
        """Push `x`, output the input of `k_steps` calls ago."""
        del extras, key
        x = canonicalize(x)
        specs = zip(self.shapes, self.dtypes, strict=True)
        expected = [jax.ShapeDtypeStruct(*spec) for spec in specs]
        check_input(self, x, jax.tree.unflatten(self.treedef, expected))
        idx, buffer = state["idx"], state["buffer"]
        output = jax.tree.map(lambda b: b[idx], buffer)
        buffer = jax.tree.map(
            lambda b, v: b.at[idx].set(jnp.asarray(v, b.dtype)), buffer, x
        )
        next_state = {"buffer": buffer, "idx": (idx + 1) % self.k_steps}
        return StatefulModuleOutput(next_state, output, zero_loss(), {}, None)
