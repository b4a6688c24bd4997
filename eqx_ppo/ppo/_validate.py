"""Input checks that turn silently-wrong arguments into clear errors.

Every check runs in Python on values, types and shapes: at construction, at
the start of a call, or at trace time; none adds work to a compiled program.
Messages follow the library's style, `where(argument=value): what was
expected, what was seen. Fix: ...`.
"""

import dataclasses
import inspect
import math
import numbers
import os
import reprlib
from collections.abc import Callable, Mapping
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, PyTree

from ..nn._dense import Dense
from ..nn._errors import array_spec
from ..nn._linear_recurrent import MinGRU
from ..nn._module import AbstractStatefulModule
from ..nn._recurrent import GRU, LSTM

_CALLBACK_CALLS = {
    "log_fn": "log_fn(metrics, step)",
    "video_fn": "video_fn(video_data)",
    "checkpoint_fn": "checkpoint_fn(training_state, step)",
}


def check_finite_value(kind: str, name: str, value: numbers.Real) -> None:
    """Raise unless `value` is finite: NaN passes every bound check silently."""
    if not math.isfinite(value):
        raise ValueError(
            f"{kind}({name}={value}): must be finite, got {value}. "
            f"Fix: pass a finite {name} (check how it was computed)."
        )


def check_int(kind: str, name: str, value: Any, minimum: int = 1) -> None:
    """Raise unless `value`, the argument `name` of `kind`, is an int (not a
    bool) >= `minimum`."""
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if not is_int or value < minimum:
        seen = value if is_int else type(value).__name__
        what = "a positive int" if minimum == 1 else f"an int >= {minimum}"
        raise ValueError(
            f"{kind}({name}={value!r}): {name} must be {what}, got {seen}. "
            f"Fix: pass an int >= {minimum}."
        )


def check_positive_ints(config: Any, *names: str) -> None:
    """Raise unless each field `names` of `config` is an int >= 1 (not a bool)."""
    for name in names:
        check_int(type(config).__name__, name, getattr(config, name))


def check_bools(config: Any, *names: str) -> None:
    """Raise a `TypeError` unless each field `names` of `config` is a bool: a
    string such as `"false"` (from a YAML file or a command line) would
    otherwise count as true."""
    for name in names:
        value = getattr(config, name)
        if not isinstance(value, bool):
            raise TypeError(
                f"{type(config).__name__}({name}={value!r}): expected True or "
                f"False, got {type(value).__name__}. Fix: pass a Python bool."
            )


def check_flags(where: str, name: str, value: Any, cls: type, example: str) -> None:
    """Raise a `TypeError` unless `value`, the argument `name` of `where`, is a
    `cls` flag enum (`example` shows how to build one)."""
    if not isinstance(value, cls):
        raise TypeError(
            f"{where}({name}={value!r}): expected a {cls.__name__}, got "
            f"{type(value).__name__}. Fix: combine flags, e.g. {name}={example}."
        )


def as_percentiles(percentiles: Any) -> Any:
    """A list or tuple of percentile levels as a tuple (a static, hashable
    field); anything else as it is, for `check_percentiles` to name."""
    return tuple(percentiles) if isinstance(percentiles, list | tuple) else percentiles


def check_percentiles(kind: str, percentiles: Any) -> None:
    """Raise unless `percentiles` is `None` or a tuple of numbers in [0, 100]."""
    if percentiles is None:
        return
    where = f"{kind}(logging_percentiles={reprlib.repr(percentiles)})"
    if not isinstance(percentiles, tuple):
        raise ValueError(
            f"{where}: expected a tuple of numbers in [0, 100] or None, got "
            f"{type(percentiles).__name__}. Fix: pass a tuple, e.g. (5, 50, 95)."
        )
    for p in percentiles:
        is_real = isinstance(p, numbers.Real) and not isinstance(p, bool)
        if not is_real or not 0 <= p <= 100:
            raise ValueError(
                f"{where}: percentiles must be numbers in [0, 100], got {p!r}. "
                "Fix: use levels such as (5, 50, 95)."
            )


def check_config_types(config: Any, **types: type) -> None:
    """Raise a `TypeError` if a sub-config field holds another type (e.g. a dict
    of its arguments instead of the config)."""
    kind = type(config).__name__
    for name, cls in types.items():
        value = getattr(config, name)
        if not isinstance(value, cls):
            fix = (
                f"{kind}({name}={cls.__name__}(**d)) for a dict `d` of its arguments"
                if isinstance(value, Mapping)
                else f"pass a {cls.__name__}"
            )
            raise TypeError(
                f"{kind}({name}={reprlib.repr(value)}): expected {cls.__name__}, "
                f"got {type(value).__name__}. Fix: {fix}."
            )


def check_callbacks(where: str, **callbacks: Any) -> None:
    """Raise a `TypeError` for a callback that is neither callable nor `None`,
    before training starts rather than at its first call."""
    for name, fn in callbacks.items():
        if fn is not None and not callable(fn):
            raise TypeError(
                f"{where}({name}={reprlib.repr(fn)}): expected a function or None, "
                f"got {type(fn).__name__}. Fix: pass a function called as "
                f"`{_CALLBACK_CALLS[name]}`, or None."
            )


def check_network_factory(factory: Callable, where: str) -> None:
    """Raise a `TypeError` unless `factory` can be called with one key."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # no signature to read: let the call decide
        return
    try:
        signature.bind(None)
    except TypeError:
        name = getattr(factory, "__qualname__", type(factory).__name__)
        raise TypeError(
            f"{where}: a network factory must be a function `key -> network`, "
            f"called with one PRNG key; {name} has the signature {signature}. "
            "Fix: wrap it, e.g. `lambda key: make_network(..., key=key)`."
        ) from None


def check_config_type(
    where: str, config: Any, cls: type, field: str, inner: type
) -> None:
    """Raise a `TypeError` unless `config` is a `cls`, the driver config that
    holds the algorithm's `inner` config as `field` (e.g. `TrainConfig`,
    `"ppo"`, `PPOConfig`)."""
    if isinstance(config, cls):
        return
    fix = (
        f"wrap it: {cls.__name__}({field}=...)"
        if isinstance(config, inner)
        else f"pass a {cls.__name__}({field}={inner.__name__}(...))"
    )
    raise TypeError(
        f"{where}(config={type(config).__name__}(...)): expected a {cls.__name__}, "
        f"got {type(config).__name__}. Fix: {fix}."
    )


def check_network_argument(where: str, name: str, network: Any) -> None:
    """Raise a `TypeError` unless the argument `name` of `where` is a network,
    not a network factory or a training state."""
    if isinstance(network, AbstractStatefulModule):
        return
    kind = type(network).__name__
    if isinstance(getattr(network, "network", None), AbstractStatefulModule):
        seen, fix = f"a {kind}", f"pass its network, {name}=state.network"
    elif callable(network):
        seen = "a function"
        fix = f"call the factory with a key, {name}=factory(key)"
    else:
        seen = kind
        fix = "pass a network, e.g. make_mlp_actor_critic(..., key=key)"
    raise TypeError(
        f"{where}({name}=<{kind}>): expected an eqx_ppo network (an "
        f"AbstractStatefulModule), got {seen}. Fix: {fix}."
    )


_MATRIX_LAYERS = (Dense, LSTM, GRU, MinGRU)
"""Layers whose `kernel` is a matrix, so a third axis on it is a seed axis."""


def check_one_network(where: str, name: str, network: AbstractStatefulModule) -> None:
    """Raise a `ValueError` if `network`'s weights carry a leading seed axis.

    A multi-seed run's network (`TrainConfig(n_seeds > 1)`) passed whole
    would otherwise fail deep inside a layer with a shape error, or broadcast
    its seeds through the matmuls. Under a `vmap` over seeds each network is
    one seed's, so this passes.
    """
    is_layer = lambda x: isinstance(x, _MATRIX_LAYERS)  # noqa: E731
    for layer in jax.tree.leaves(network, is_leaf=is_layer):
        kernel = getattr(layer, "kernel", None) if is_layer(layer) else None
        if eqx.is_array(kernel) and kernel.ndim > 2:
            raise ValueError(
                f"{where}({name}=...): the network's weights have a leading axis "
                f"(a {type(layer).__name__} kernel of shape {kernel.shape}): a "
                f"network from a run with TrainConfig(n_seeds={kernel.shape[0]}). "
                "Fix: pick one seed, eqx_ppo.select_seed(network, i), or "
                "jax.vmap over the seeds."
            )


def check_network(network: Any, where: str) -> AbstractStatefulModule:
    """Return `network`, the result of a network factory, if it is a network."""
    if not isinstance(network, AbstractStatefulModule):
        raise TypeError(
            f"{where}: the network factory (`key -> network`) returned a "
            f"{type(network).__name__}, not an eqx_ppo network. Fix: return the "
            "network itself, e.g. `make_mlp_actor_critic(..., key=key)`."
        )
    return network


def _per_env(tree: PyTree[Array]) -> list[tuple[str, tuple[int, ...], Any]]:
    """(path, per-env shape, dtype) of every leaf of an `[env, ...]` pytree."""
    return [
        (jax.tree_util.keystr(path), tuple(x.shape[1:]), x.dtype)
        for path, x in jax.tree_util.tree_leaves_with_path(tree)
    ]


def _check_carried_fields(before: Any, after: Any) -> None:
    """Raise a `ValueError` naming the first field besides obs, reward and done
    (`info`, `metrics`, `pipeline_state`, ...) whose leaves `env.step` changes:
    added, dropped, reshaped or retyped (the rollout's scan would refuse it)."""
    for field in (f.name for f in dataclasses.fields(before)):
        if field in ("obs", "reward", "done"):
            continue
        want = {p: (s, d) for p, s, d in _per_env(getattr(before, field))}
        got = {p: (s, d) for p, s, d in _per_env(getattr(after, field, None))}
        problems = [
            f"{field}{p} is new"
            if p not in want
            else f"{field}{p} is missing"
            if p not in got
            else f"{field}{p} has per-env shape {got[p][0]} and dtype {got[p][1]}, "
            f"not {want[p][0]} and {want[p][1]}"
            for p in sorted(want.keys() | got.keys())
            if want.get(p) != got.get(p)
        ]
        if problems:
            raise ValueError(
                f"env.step returned a state whose {field} differs from the one "
                f"env.reset returned: {'; '.join(problems[:3])}"
                f"{'; ...' if len(problems) > 3 else ''}. Fix: make env.reset "
                f"return every {field} entry env.step returns, with the same "
                "shapes and dtypes; the rollout carries the env state between steps."
            )


def check_step_output(before: Any, after: Any) -> None:
    """Raise a `ValueError` if the batched `env.step` output `after` changes the
    obs, reward or done structure, per-env shapes or dtypes of the state
    `before` it stepped, or has a reward or done that is not one scalar per env;
    or changes any other field's leaves (`info`, `metrics`, ...).
    """
    for field in ("obs", "reward", "done"):
        want, got = getattr(before, field), getattr(after, field)
        fix = (
            f"Fix: make env.step return {field} of the structure, shape and dtype "
            "env.reset returns; the rollout carries the env state between steps."
        )
        if jax.tree.structure(got) != jax.tree.structure(want):
            raise ValueError(
                f"env.step returned {field} with structure {jax.tree.structure(got)}"
                ", but the state it was given (from env.reset) has "
                f"{jax.tree.structure(want)}. {fix}"
            )
        for (path, shape, dtype), (_, want_shape, want_dtype) in zip(
            _per_env(got), _per_env(want), strict=True
        ):
            if field != "obs" and shape != ():
                raise ValueError(
                    f"env.step returned {field}{path} of per-env shape {shape}; "
                    "expected () (one scalar per env). Fix: return a scalar "
                    f"{field} per env from env.step, e.g. `jnp.squeeze({field})`."
                )
            if (shape, dtype) != (want_shape, want_dtype):
                raise ValueError(
                    f"env.step returned {field}{path} of per-env shape {shape} and "
                    f"dtype {dtype}, but the state it was given (from env.reset) "
                    f"has shape {want_shape} and dtype {want_dtype}. {fix}"
                )
    if dataclasses.is_dataclass(before):
        _check_carried_fields(before, after)


def _same_leaf(x: Any, spec: jax.ShapeDtypeStruct) -> bool:
    if not eqx.is_array(x):
        return False
    if jnp.issubdtype(spec.dtype, jax.dtypes.prng_key) and x.dtype == np.uint32:
        return x.shape[:-1] == spec.shape  # legacy raw key data
    return (x.shape, x.dtype) == (spec.shape, spec.dtype)


def _leaf_at(paths: list[str], i: int) -> str:
    return f"initial_state{paths[i]}" if i < len(paths) else "(no leaf)"


def _seed_axis(shape: tuple[int, ...]) -> str:
    return f"a seed axis of {shape[0]}" if shape else "no seed axis"


def check_resume_length(where: str, state: Any, config: Any) -> None:
    """Raise if `state` has trained more iterations than `config` (a
    `LearnerConfig`) runs: the run would return it untrained, silently."""
    done = int(np.max(jax.device_get(state.iteration)))
    if done > config.n_iterations:
        trained = done * config.steps_per_iteration
        raise ValueError(
            f"{where}(initial_state=...): the state has trained {trained} env "
            f"steps, more than total_steps={config.total_steps}. Fix: pass "
            f"total_steps >= {trained} to train it further, or use the state as "
            "it is."
        )


def check_initial_state(where: str, state: Any, fresh: Callable[[], Any]) -> None:
    """Raise unless `state` (if not `None`) has the seed count, env count and
    leaves (paths, shapes, dtypes) of the state `fresh()` builds from the
    run's network and config. `fresh` is only traced (`eqx.filter_eval_shape`):
    nothing is compiled or run."""
    if state is None:
        return
    prefix = f"{where}(initial_state=...)"
    for path, x in jax.tree_util.tree_flatten_with_path(state)[0]:
        if isinstance(x, jax.Array) and x.is_deleted():
            raise ValueError(
                f"{prefix}: initial_state{jax.tree_util.keystr(path)} has been "
                "deleted: a state that `checkpoint_fn` received and kept as it is "
                "lends its buffers to the next compiled chunk. Fix: keep a host "
                "copy inside checkpoint_fn (jax.device_get), or load the "
                "checkpoint it saved."
            )
    expected = eqx.filter_eval_shape(fresh)
    fix = "Fix: pass the network and config the state was built with."
    if type(state) is not type(expected):
        raise TypeError(
            f"{prefix}: expected a {type(expected).__name__}, got "
            f"{type(state).__name__}. {fix}"
        )
    seeds, want_seeds = jnp.shape(state.iteration), expected.iteration.shape
    if seeds != want_seeds:
        raise ValueError(
            f"{prefix}: the state has {_seed_axis(seeds)} (on every leaf), but "
            f"config.n_seeds={want_seeds[0] if want_seeds else 1} expects "
            f"{_seed_axis(want_seeds)}. Fix: set n_seeds to the state's seed "
            "count, or resume one seed with `select_seed(state, i)`."
        )
    n_envs = jnp.shape(state.env_state.done)[len(seeds)]
    want_envs = expected.env_state.done.shape[len(seeds)]
    if n_envs != want_envs:
        raise ValueError(
            f"{prefix}: the state's env_state and carries hold {n_envs} envs, but "
            f"the config's n_envs is {want_envs}. Fix: resume with n_envs={n_envs}, "
            "the value the state was built with."
        )
    got = jax.tree_util.tree_flatten_with_path(state)[0]
    want = jax.tree_util.tree_flatten_with_path(expected)[0]
    got_paths = [jax.tree_util.keystr(p) for p, _ in got]
    want_paths = [jax.tree_util.keystr(p) for p, _ in want]
    if got_paths != want_paths:
        i = len(os.path.commonprefix([got_paths, want_paths]))
        raise ValueError(
            f"{prefix}: the state's structure differs from a fresh state's "
            f"(network and optimiser state): its leaf {i} is "
            f"{_leaf_at(got_paths, i)}, a fresh state's is {_leaf_at(want_paths, i)}. "
            f"{fix}"
        )
    for (path, x), (_, spec) in zip(got, want, strict=True):
        if isinstance(spec, jax.ShapeDtypeStruct) and not _same_leaf(x, spec):
            raise ValueError(
                f"{prefix}: initial_state{jax.tree_util.keystr(path)} is "
                f"{array_spec(x)}, but a fresh state has {array_spec(spec)}. {fix}"
            )
