"""Declared types, checked at the public boundary by beartype (`checked`).

A converted field is checked by its converter's annotation, before it is
converted: a string where a number belongs is refused, never parsed. What a
type cannot say (ranges, agreement between arguments) is checked by hand, once.
"""

import functools
import math
from collections.abc import Callable, Mapping
from typing import Annotated, Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from beartype import BeartypeConf, beartype
from beartype.door import is_bearable
from beartype.vale import Is, IsInstance
from jaxtyping import Array, ArrayLike, Float, Integer, Real

_CONF = BeartypeConf(is_color=False, violation_type=TypeError)

Int = Annotated[int, ~IsInstance[bool]]
"""An int, not a bool (`isinstance(True, int)` holds in Python)."""

Number = Annotated[int | float, ~IsInstance[bool]]
"""A Python number: an `int` or `float`, not a `bool`."""

Scalar = Annotated[Real[ArrayLike, ""], ~IsInstance[bool]]
"""A real number: an `int` or `float` (not a `bool`), or a scalar array, traced
ones included (a learner built inside `jax.vmap`)."""


def each(container: Any, item: Any) -> Any:
    """`container[item]` (`tuple[item, ...]`, `Mapping[str, item]`) with every
    item (a mapping's every value) checked: beartype checks one random item of
    a container per call (its linear-time strategy is not implemented), so a
    bool among ints would pass half the time."""
    if container is Mapping:
        hint, items = Mapping[str, item], lambda xs: xs.values()
    else:
        hint = container[item, ...] if container is tuple else container[item]
        items = iter
    return Annotated[hint, Is[lambda xs: all(is_bearable(x, item) for x in items(xs))]]


Index = Int | np.integer | Integer[Array, ""] | Integer[np.ndarray, ""]
"""An integer index: an `int`, or an integer scalar array (NumPy's, JAX's)."""

F = TypeVar("F", bound=Callable[..., Any])


def checked(obj: F) -> F:
    """Check `obj`'s annotations at every call: a function's arguments, or a
    class's `__init__` arguments (for an `eqx.Module`, converted fields by
    their converter's annotation)."""
    if not isinstance(obj, type):
        return _named(beartype(conf=_CONF)(obj), f"eqx_ppo.{obj.__name__}")
    init = beartype(conf=_CONF)(obj.__init__)
    if "__init__" not in vars(obj):  # beartype's message names the base class
        public = [p for p in obj.__module__.split(".") if not p.startswith("_")]
        init = _named(init, ".".join([*public, obj.__name__]))
    obj.__init__ = init
    return obj


def _named(fn: Callable[..., Any], name: str) -> Any:
    """`fn`, whose refusals get a note naming the public call `name`; the
    outermost (the user's) call names itself last, replacing an inner call's."""
    note = f"(raised in {name})"

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (TypeError, ValueError) as error:
            notes = getattr(error, "__notes__", [])
            if notes and notes[-1].startswith("(raised in eqx_ppo."):
                notes[-1] = note
            else:
                error.add_note(note)
            raise

    return call


Reals = Annotated[Real[ArrayLike, "..."], ~IsInstance[bool]]
"""Real numbers of any shape: an `int`, a `float` or a real array, not a `bool`."""


def float32_array(value: Reals) -> Float[Array, "..."]:
    """A coefficient as a float32 array: a pytree leaf, so changing it does not
    recompile and `jax.vmap` can sweep it. A concrete value stays concrete
    inside a trace (a learner built under `jit`), so its range is checked."""
    with jax.ensure_compile_time_eval():
        return jnp.asarray(value, jnp.float32)


def float32(value: Scalar) -> Float[Array, ""]:
    """`float32_array` of one number."""
    return float32_array(value)


def optional_float32(value: Scalar | None) -> Float[Array, ""] | None:
    """`float32`, with `None` kept: a switch that `None` turns off."""
    return None if value is None else float32(value)


def check_range(
    call: str,
    value: Any,
    low: float | int | None = None,
    high: float | int | None = None,
    *,
    open_low: bool = False,
    fix: str = "",
) -> None:
    """Raise a `ValueError` naming `call` (e.g. `"PPO(clip_range="`) unless a
    concrete scalar `value` is finite and in `[low, high]` (`(low, high]` with
    `open_low`); traced values and `None` pass."""
    if value is None or isinstance(value, jax.core.Tracer):
        return
    array = np.asarray(value)
    if array.ndim:
        raise ValueError(
            f"{call}array of shape {array.shape}): must be a scalar. Fix: to sweep "
            "it, build the learner inside `jax.vmap`."
        )
    v = float(array)
    too_low = low is not None and (v < low or (open_low and v == low))
    if math.isfinite(v) and not too_low and (high is None or v <= high):
        return
    wanted = [f"{'>' if open_low else '>='} {low}"] if low is not None else []
    wanted += [f"<= {high}"] if high is not None else []
    if np.issubdtype(array.dtype, np.inexact):
        wanted.insert(0, "finite")
    # float32's shortest repr: the value as written (0.001, not 0.0010000000474974513).
    shown = str(np.float32(v)) if array.dtype == np.float32 else str(value)
    fix = f" Fix: {fix}" if fix else ""
    raise ValueError(f"{call}{shown}): must be {' and '.join(wanted)}.{fix}")
