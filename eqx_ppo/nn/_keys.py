"""Keys: checking a key, and handing a container's key to its children."""

import reprlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Key, PRNGKeyArray

from ._errors import array_spec

if TYPE_CHECKING:
    from ._module import AbstractStatefulModule


def check_key(
    where: str, key: Any, several: str = "vmap over keys to use several"
) -> None:
    """Raise a `TypeError` unless `key` is one PRNG key: a typed key
    (`jax.random.key`) or legacy raw key data (`jax.random.PRNGKey`, uint32).
    `several` tells how `where` takes more than one key."""
    if eqx.is_array(key):
        if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
            if key.shape == ():
                return
        elif key.dtype == np.uint32 and key.shape in ((2,), (4,)):
            return
        value, seen = array_spec(key), f"a {array_spec(key)} array"
    else:
        value, seen = reprlib.repr(key), type(key).__name__
    raise TypeError(
        f"{where}(key={value}): expected a PRNG key such as jax.random.key(0), got "
        f"{seen}. Fix: pass a single key, e.g. key=jax.random.key(seed) "
        f"({several})."
    )


def split_key(key: PRNGKeyArray | None, n: int) -> list[PRNGKeyArray | None]:
    """Split `key` among `n` children; `None` stays `None` (deterministic calls)."""
    if key is None:
        return [None] * n
    return list(jax.random.split(key, n))


def route_keys(
    key: PRNGKeyArray | None, children: Sequence["AbstractStatefulModule"]
) -> list[PRNGKeyArray | None]:
    """One key per child, for the children whose `uses_key` is set.

    Children that use no key get `None`. A single user gets `key` itself; more
    users get one split of it, in order. Every container routes keys this way,
    so a network with one stochastic layer (e.g. its sampler) spends no key
    splits at all.
    """
    users = [i for i, child in enumerate(children) if child.uses_key]
    keys: list[PRNGKeyArray | None] = [None] * len(children)
    if key is None or not users:
        return keys
    if len(users) == 1:
        keys[users[0]] = key
        return keys
    for i, child_key in zip(users, jax.random.split(key, len(users)), strict=True):
        keys[i] = child_key
    return keys


def route_sequence_keys(
    keys: Key[Array, "*steps"] | None, children: Sequence["AbstractStatefulModule"]
) -> list[Key[Array, "*steps"] | None]:
    """[`eqx_ppo.nn.route_keys`][] applied to every key of a `[T]` sequence
    (or of a `[T, M]` batch of them).

    A container's replay uses it to hand each child the keys its `__call__`
    would have handed it, step by step.
    """
    if keys is None:
        return [None] * len(children)
    steps = jnp.shape(keys)
    if not jnp.issubdtype(keys.dtype, jax.dtypes.prng_key):
        steps = steps[:-1]  # legacy uint32 key data: [*steps, 2]
    flat = keys.reshape(-1, *keys.shape[len(steps) :])
    routed = jax.vmap(lambda k: route_keys(k, children))(flat)
    return [None if k is None else k.reshape(*steps, *k.shape[1:]) for k in routed]
