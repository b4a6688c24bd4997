"""How error messages describe arrays, pytrees and a wrong input shape."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp


def array_spec(x: Any) -> str:
    """`float32[8, 2]` for an array or a `jax.ShapeDtypeStruct`, else the type."""
    if eqx.is_array(x) or isinstance(x, jax.ShapeDtypeStruct):
        return f"{x.dtype}{list(x.shape)}"
    return type(x).__name__


def tree_spec(tree: Any) -> str:
    """`{'h': 'float32[8]'}`: `tree` with each array as its `array_spec`."""
    return str(jax.tree.map(array_spec, tree))


def carry_spec(tree: Any) -> Any:
    """What a scan's carry must keep from step to step: the structure and each
    leaf's shape and dtype (not its weak type), as `jax.ShapeDtypeStruct`s."""
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)), tree
    )


def input_shape_fix(got: tuple[int, ...], want: tuple[int, ...]) -> str:
    """How to fix a layer's input of shape `got` where one env's `want` is
    expected: vmap if `got` is a batch of `want`, otherwise match the sizes."""
    if len(got) > len(want) and got[len(got) - len(want) :] == want:
        return (
            "Layers work on a single env: vmap over the env axis, or use "
            "`eqx_ppo.nn.apply_batched`."
        )
    if len(got) < len(want):
        return (
            "The input has fewer axes than one env's: vmap and `apply_batched` "
            "take the leading axis as the env axis, so give them a batch [B, ...]; "
            "otherwise build the network for one env's observation "
            "(obs_size=env.observation_size)."
        )
    return (
        "The sizes differ: build the network for one env's observation "
        "(obs_size=env.observation_size), or the layer for its input."
    )


def check_input(layer: Any, x: Any, want: Any) -> None:
    """Raise at trace time unless `x`, the input of `layer`, is one env's
    input: of shape `want` (a tuple of ints), or shaped like the pytree of
    arrays (or `jax.ShapeDtypeStruct`s) `want`."""
    if isinstance(want, tuple) and all(isinstance(n, int) for n in want):
        got = jnp.shape(x)
        if got == want:
            return
        seen, fix = f"of shape {want}, got shape {got}", input_shape_fix(got, want)
    else:
        leaves, structure = jax.tree.flatten(x)
        wanted, expected = jax.tree.flatten(want)
        shapes = zip(map(jnp.shape, leaves), map(jnp.shape, wanted), strict=False)
        wrong = [(got, shape) for got, shape in shapes if got != shape]
        if structure == expected and not wrong:
            return
        seen = f"{tree_spec(want)}, got {tree_spec(x)}"
        fix = (
            input_shape_fix(*wrong[0])
            if structure == expected
            else "Give it an input of the structure it was built with."
        )
    raise ValueError(f"{type(layer).__name__} expects one env's input {seen}. {fix}")
