"""Keys: the key each child of a container gets, and the check that a
stochastic layer got one.

A container hands child `i` of a `Sequential` the key
`jax.random.fold_in(key, i)`, and the child named `name` of a dict container
(or a graph's connection `name`) `fold_in(key, crc32(name))`. A child's key
depends only on its parent's key and its own position or name, never on its
siblings, so adding, removing or changing a sibling leaves its noise as it
was. Every child gets a key, used or not: folding in is cheap, and XLA
removes a key no layer draws from.
"""

import functools
import zlib
from typing import Any

import jax
from jaxtyping import Array, Key


def child_key(
    key: Key[Array, "*batch"] | None, child: int | str
) -> Key[Array, "*batch"] | None:
    """The key of the child at position `child` (an int) or named `child` (a
    str), for each of `key`'s keys; `None` stays `None`."""
    if key is None:
        return None
    data = child if isinstance(child, int) else zlib.crc32(child.encode())
    fold = functools.partial(jax.random.fold_in, data=data)
    for _ in range(key.ndim):
        fold = jax.vmap(fold)
    return fold(key)


def check_draws(layer: Any, key: Key[Array, ""] | None) -> None:
    """Raise unless `layer`, which draws noise unless its `inference` field is
    set, has a key to draw from."""
    if key is None and not layer.inference:
        raise ValueError(
            f"`{type(layer).__name__}` draws noise and needs `key=`, got `key=None`; "
            "pass a PRNG key, or use `eqx.nn.inference_mode(net)` for its "
            "deterministic output."
        )
