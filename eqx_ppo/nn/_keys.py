"""The key of each layer inside a container (the rule is in
`docs/concepts.md`), and the check that a stochastic layer got one."""

import functools
import zlib
from collections.abc import Hashable
from typing import Any

import jax
from jaxtyping import Array, Key


def child_key(
    key: Key[Array, "*batch"] | None, path: tuple[Hashable, ...]
) -> Key[Array, "*batch"] | None:
    """The key of the layer at `path` (one position or name per level) below
    the container called with `key` (any batch of keys; `None` stays `None`):
    `fold_in(key, i)` for child `i`, `fold_in(key, crc32(name))` for child
    `name`, `fold_in(key, crc32("/".join(map(repr, path))))` deeper down."""
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
