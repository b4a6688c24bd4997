"""Delay: outputs what it was given `k_steps` calls ago."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Int, Key, PyTree

from .._typecheck import checked
from ._errors import tree_spec
from ._module import AbstractStatefulModule, StatefulModuleOutput, zero_loss
from ._normalizer import canonicalize

DelayState = dict[str, Any]
"""A Delay carry: `{"buffer": <input pytree, leaves [k_steps, *shape]>,
"idx": <int32 scalar, the slot read and then overwritten this step>}`."""


@checked
class Delay(AbstractStatefulModule):
    """A `k_steps` delay line: the output at step `t` is the input at `t - k_steps`.

    For the first `k_steps` steps of an episode the output is `initial_value`.
    The carry is a ring buffer of the last `k_steps` inputs plus a write
    index, so a step costs one read and one write whatever `k_steps` is;
    a reset refills the buffer with `initial_value`. Inputs may be any pytree
    of arrays (e.g. dict observations; a `Mapping` is treated as a `dict`),
    and are cast to the dtypes of `sample_input`.

    ```python
    delay = Delay(jnp.zeros(3), k_steps=2)
    state = delay.initial_state()
    out = delay(state, obs)  # out.output is the obs of two calls ago
    ```
    """

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

        - `sample_input`: one env's input, a pytree of arrays or
            `jax.ShapeDtypeStruct`s; only its structure, shapes and dtypes
            are kept.
        - `k_steps`: the delay in steps, `>= 1`.
        - `initial_value`: what the buffer holds before it has been written
            `k_steps` times, and after each reset.
        """
        if k_steps < 1:
            raise ValueError(
                f"Delay(k_steps={k_steps!r}) must be >= 1; for no delay, leave the "
                "Delay out."
            )
        leaves, treedef = jax.tree.flatten(canonicalize(sample_input))
        self.k_steps = k_steps
        self.initial_value = float(initial_value)
        self.treedef = treedef
        self.shapes = tuple(tuple(leaf.shape) for leaf in leaves)
        self.dtypes = tuple(np.dtype(leaf.dtype) for leaf in leaves)

    def initial_state(self) -> DelayState:
        """A buffer full of `initial_value`, write index 0."""
        buffer = [
            jnp.full((self.k_steps, *shape), self.initial_value, dtype)
            for shape, dtype in zip(self.shapes, self.dtypes, strict=True)
        ]
        return {
            "buffer": jax.tree.unflatten(self.treedef, buffer),
            "idx": jnp.zeros((), jnp.int32),
        }

    def __call__(
        self,
        state: DelayState,
        x: PyTree[Array],
        extras: Any = None,
        *,
        key: Key[Array, ""] | None = None,
    ) -> StatefulModuleOutput:
        """Push `x`, output the input of `k_steps` calls ago."""
        del extras, key
        leaves, treedef = jax.tree.flatten(canonicalize(x))
        if treedef != self.treedef or tuple(map(jnp.shape, leaves)) != self.shapes:
            specs = zip(self.shapes, self.dtypes, strict=True)
            expected = jax.tree.unflatten(
                self.treedef, [jax.ShapeDtypeStruct(*spec) for spec in specs]
            )
            raise ValueError(
                f"Delay expects one env's input shaped like its sample_input, "
                f"{tree_spec(expected)}; got {tree_spec(x)}. Layers work on a single "
                "env: vmap over the env axis, or use `eqx_ppo.nn.apply_batched`."
            )
        idx: Int[Array, ""] = state["idx"]
        buffer = jax.tree.leaves(state["buffer"])
        delayed = [b[idx] for b in buffer]
        buffer = [
            b.at[idx].set(jnp.asarray(v, b.dtype))
            for b, v in zip(buffer, leaves, strict=True)
        ]
        next_state = {
            "buffer": jax.tree.unflatten(self.treedef, buffer),
            "idx": (idx + 1) % self.k_steps,
        }
        output = jax.tree.unflatten(self.treedef, delayed)
        return StatefulModuleOutput(next_state, output, zero_loss(), {}, None)
