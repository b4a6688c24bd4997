"""Small stateless layers that reshape, select and scale pytrees."""

from collections.abc import Callable, Mapping
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PyTree

from .._typecheck import check_range, checked
from ._module import AbstractStatelessLayer

FilterSpec = str | int | tuple[str | int, ...] | Callable[[Any], Any]
"""One entry of a [`eqx_ppo.nn.Filter`][] spec: a key, a path of keys, or a function."""


@checked
class Splitter(AbstractStatelessLayer):
    """Splits the last axis into named slices, in argument order.

    `Splitter(mean=3, value=1)` maps `x` of shape `(4,)` to
    `{"mean": x[0:3], "value": x[3:4]}`; the positive sizes must add up to
    the input's last axis.
    """

    sizes: tuple[tuple[str, int], ...] = eqx.field(static=True)

    def __init__(self, **sizes: int):
        for name, size in sizes.items():
            fix = "give every slice at least one feature."
            check_range(f"Splitter({name}=", size, 1, fix=fix)
        self.sizes = tuple(sizes.items())

    def forward(self, x: Float[Array, "*batch features"]) -> Any:
        total = sum(size for _, size in self.sizes)
        if x.shape[-1] != total:
            described = ", ".join(f"{name}={size}" for name, size in self.sizes)
            raise ValueError(
                f"`Splitter({described})`: the sizes add up to {total} but the "
                f"input's last axis has {x.shape[-1]} features (input shape "
                f"{x.shape}); make the sizes sum to {x.shape[-1]}."
            )
        output, start = {}, 0
        for name, size in self.sizes:
            output[name] = x[..., start : start + size]
            start += size
        return output


def _flatten(x: Any, preserve_levels: int) -> Any:
    if isinstance(x, dict) and preserve_levels > 0:
        return {k: _flatten(v, preserve_levels - 1) for k, v in x.items()}
    if isinstance(x, list | tuple) and preserve_levels > 0:
        return type(x)(_flatten(v, preserve_levels - 1) for v in x)
    return jnp.concatenate([jnp.ravel(leaf) for leaf in jax.tree.leaves(x)])


@checked
class Flattener(AbstractStatelessLayer):
    """Flattens a pytree of arrays into one feature vector.

    Every leaf is raveled and the results concatenated in pytree order
    (dicts in sorted key order): `{"b": (2,), "a": (3, 1)}` becomes
    `concat([ravel(a), ravel(b)])`. `preserve_levels=N >= 0` keeps the top
    `N` levels of dict/list/tuple structure: `Flattener(1)` maps
    `{"a": {"p": (4,), "t": (8,)}, "b": (6,)}` to `{"a": (12,), "b": (6,)}`.
    """

    preserve_levels: int = eqx.field(static=True, default=0)

    def __check_init__(self):
        fix = "pass 0 to flatten the whole input."
        check_range("Flattener(preserve_levels=", self.preserve_levels, 0, fix=fix)

    def forward(self, x: PyTree[Array]) -> Any:
        return _flatten(x, self.preserve_levels)


def _has_entry(value: Any, part: str | int) -> bool:
    """Whether `value[part]` exists (JAX clamps an out-of-range index)."""
    if eqx.is_array(value):
        return (
            isinstance(part, int)
            and value.ndim > 0
            and -len(value) <= part < len(value)
        )
    try:
        value[part]
    except (KeyError, IndexError, TypeError):
        return False
    return True


def _select(x: Any, out_key: str, spec: FilterSpec) -> Any:
    if callable(spec):
        return spec(x)
    path = spec if isinstance(spec, tuple) else (spec,)
    value = x
    for i, part in enumerate(path):
        if not _has_entry(value, part):
            raise ValueError(
                f"`Filter`: output {out_key!r} asks for the path {path!r}, but "
                f"there is no entry {part!r} at {path[:i]!r}; check the spec "
                "against the input's structure."
            )
        value = value[part]
    return value


@checked
class Filter(AbstractStatelessLayer):
    """Selects parts of a pytree into a new dict; the rest is dropped.

    `spec` maps each output key to a key `k` (`x[k]`), a tuple path
    `(k1, k2, ...)` (`x[k1][k2]...`) or a callable `fn` (`fn(x)`).

    ```python
    Filter({"policy_obs": "state", "goal": ("task", "target"), "n": len})
    ```
    """

    spec: tuple[tuple[str, FilterSpec], ...] = eqx.field(static=True)

    def __init__(self, spec: Mapping[str, FilterSpec]):
        self.spec = tuple(spec.items())

    def forward(self, x: Any) -> Any:
        return {k: _select(x, k, entry) for k, entry in self.spec}


@checked
class Scale(AbstractStatelessLayer):
    """Multiplies every leaf of the input by a fixed, finite `factor`
    (static configuration, never trained)."""

    factor: float = eqx.field(static=True, converter=float)

    def __check_init__(self):
        fix = "pass a finite one; a NaN or inf makes every output non-finite."
        check_range("Scale(factor=", self.factor, fix=fix)

    def forward(self, x: PyTree[Array]) -> Any:
        return jax.tree.map(lambda leaf: leaf * self.factor, x)
