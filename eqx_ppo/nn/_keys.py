"""Keys: the key each layer inside a container gets, and the check that a
stochastic layer got one.

A container hands child `i` of a `Sequential` the key
`jax.random.fold_in(key, i)`, and the child named `name` of a dict container
(or a graph's connection `name`) `fold_in(key, crc32(name))`. A container
inside a container passes the key on with the path to its children, so a
layer deeper down gets one fold of the outermost container's key by its whole
path (`child_key`), not one fold per level: on a CPU, JAX computes each fold
in a loop of its own, once per env and step. A layer's key depends only on
that key and its own path, never on its siblings, so adding, removing or
changing a sibling leaves its noise as it was. Every layer gets a key, used
or not: XLA removes a key no layer draws from.
"""

import functools
import zlib
from collections.abc import Hashable
from typing import Any

import jax
from jaxtyping import Array, Key


def child_key(
    key: Key[Array, "*batch"] | None, path: tuple[Hashable, ...]
) -> Key[Array, "*batch"] | None:
    """The key of the layer at `path` (positions and names, one per level)
    below the container called with `key`, for each of `key`'s keys; `None`
    stays `None`.

    One fold however deep the layer sits: `fold_in(key, i)` for child `i`,
    `fold_in(key, crc32(name))` for the child `name`, and for a deeper layer
    `fold_in(key, crc32("/".join(map(repr, path))))`.
    """
    if key is None:
        return None
    if len(path) > 1:
        data = zlib.crc32("/".join(map(repr, path)).encode())
    elif isinstance(path[0], int):
        data = path[0]
    else:
        data = zlib.crc32(str(path[0]).encode())
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
