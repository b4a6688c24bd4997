"""GymnaxAdapter: gymnax environments under the Brax-style protocol."""

import dataclasses
import math
import typing
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from beartype import BeartypeConf
from beartype.door import is_bearable
from jaxtyping import Array, Float, Int, PRNGKeyArray

from .._typecheck import checked
from ._env import AbstractEnv, check_action
from ._state import State


@typing.runtime_checkable
class _GymnaxEnv(typing.Protocol):
    """What the adapter calls on a gymnax env (e.g. `gymnax.make(name)[0]`)."""

    def reset_env(self, key: Any, params: Any) -> Any: ...

    def step_env(self, key: Any, state: Any, action: Any, params: Any) -> Any: ...


_TOWER = BeartypeConf(is_pep484_tower=True)  # an int is a valid float
# Fields that count steps: a whole number >= 1 (gymnax divides by the memory
# length, and an episode limit of 0 steps trains on nothing).
_COUNTS = ("max_steps_in_episode", "memory_length")


def _name(kind: Any) -> str:
    """A type as an error names it: `str`, `gymnax.....cartpole.EnvParams`."""
    module = getattr(kind, "__module__", "builtins")
    name = getattr(kind, "__qualname__", str(kind))
    return name if module == "builtins" else f"{module}.{name}"


def _check_params(env: Any, params: Any) -> None:
    """Refuse params of another class than the env's own, a field not of its
    declared type (arrays of any dtype pass, as vmapped params are), or a
    count that is not a whole number >= 1."""
    expected = type(env.default_params)
    call = f"GymnaxAdapter({env.name}, env_params=...)"
    if not isinstance(params, expected):
        raise TypeError(
            f"{call}: expected the env's own {_name(expected)}, got "
            f"{_name(type(params))}. Fix: pass "
            "env.default_params.replace(field=value), or a dict of the fields to "
            "change as make('gymnax:<name>', env_params={...})."
        )
    hints = typing.get_type_hints(expected)
    problems = []
    for field in dataclasses.fields(params):
        value = getattr(params, field.name)
        hint = hints.get(field.name, Any)
        if not is_bearable(
            value, hint | jax.Array | np.ndarray | np.generic, conf=_TOWER
        ):
            problems.append(f"{field.name}={value!r} is not of type {_name(hint)}")
        elif (
            field.name in _COUNTS
            and not isinstance(value, jax.core.Tracer)
            and not (np.all(value >= 1) and np.all(np.mod(value, 1) == 0))
        ):
            problems.append(f"{field.name}={value!r} is not a whole number >= 1")
    if problems:
        raise ValueError(
            f"{call}: {'; '.join(problems)}. Fix: give each field a value of its "
            f"type and range (the defaults: {env.default_params})."
        )


def _time_limit(env_state: Any, params: Any) -> Any:
    """gymnax < 1.0's `is_truncated`: its `done` includes the time limit but
    flags it nowhere, so read it off the state's step count, as 1.0 does."""
    limit = getattr(params, "max_steps_in_episode", None)
    time = getattr(env_state, "time", None)
    return False if limit is None or time is None else time >= limit


def _strong(tree: Any) -> Any:
    """Arrays with concrete (not weak) dtypes, so reset and step states match."""
    return jax.tree.map(lambda x: jnp.asarray(x, jnp.asarray(x).dtype), tree)


@checked
class GymnaxAdapter(AbstractEnv):
    """Runs a [gymnax](https://github.com/RobertTLange/gymnax) env as an eqx_ppo env.

    It steps gymnax's non-resetting `reset_env` / `step_env` (the library owns
    resets) with a key kept in `pipeline_state["key"]`, so episodes replay from
    the reset key alone. Spaces, truncation and observations: see the
    environments guide.

    **Arguments:**

    - `env`: a gymnax environment, e.g. `gymnax.make("CartPole-v1")[0]`.
    - `env_params`: the env's own params object (`env.default_params` if `None`).
    - `rescale_actions`: map continuous actions from `[-1, 1]` to the Box bounds.
    - `flatten_obs`: flatten observations; `False` keeps their shape (images).
    - `truncation_from_info`: read the time limit from `step_env`'s `info`
        (stable-gymnax; gymnax < 1.0, whose info lacks it, from the state's
        `time`); `None` does so when the env has no `is_truncated`.
    - `max_len`: the episode limit; by default the params' `max_steps_in_episode`.
    """

    env: Any
    env_params: Any
    rescale_actions: bool = eqx.field(static=True)
    flatten_obs: bool = eqx.field(static=True)
    truncation_from_info: bool = eqx.field(static=True)
    max_len: int | None = eqx.field(static=True)

    def __init__(
        self,
        env: _GymnaxEnv,
        env_params: Any = None,
        *,
        rescale_actions: bool = True,
        flatten_obs: bool = True,
        truncation_from_info: bool | None = None,
        max_len: int | None = None,
    ):
        env_params = env.default_params if env_params is None else env_params
        _check_params(env, env_params)
        self.env = env
        self.env_params = env_params
        self.rescale_actions = rescale_actions
        self.flatten_obs = flatten_obs
        if truncation_from_info is None:
            truncation_from_info = not hasattr(env, "is_truncated")
        self.truncation_from_info = truncation_from_info
        if max_len is None:
            limit = getattr(self.env_params, "max_steps_in_episode", None)
            max_len = None if limit is None else int(limit)
        self.max_len = max_len
        from gymnax.environments import spaces

        space = self._action_space()
        if not isinstance(space, spaces.Discrete | spaces.Box):
            raise ValueError(
                f"`GymnaxAdapter({env.name})`: action space {space!r} is not "
                "supported; only `Discrete` and `Box` spaces are."
            )

    def _action_space(self) -> Any:
        return self.env.action_space(self.env_params)

    def _obs(self, obs: Any) -> Float[Array, "..."]:
        obs = jnp.asarray(obs, jnp.float32)
        return jnp.ravel(obs) if self.flatten_obs else obs

    def _action(self, action: Any) -> Array:
        space = self._action_space()
        if self.n_actions is not None:
            dtype = jax.dtypes.canonicalize_dtype(space.dtype)  # gymnax 0.0.9: int64
            return check_action(self, action, (), space.n).astype(dtype)
        action = check_action(self, action, (math.prod(space.shape),))
        if self.rescale_actions:
            low = jnp.broadcast_to(jnp.asarray(space.low, jnp.float32), space.shape)
            high = jnp.broadcast_to(jnp.asarray(space.high, jnp.float32), space.shape)
            unit = jnp.clip(action.reshape(space.shape), -1.0, 1.0)
            return low + (unit + 1.0) * 0.5 * (high - low)
        return action.reshape(space.shape)

    def reset(self, key: PRNGKeyArray) -> State:
        reset_key, next_key = jax.random.split(key)
        with jax.numpy_dtype_promotion("standard"):
            obs, env_state = self.env.reset_env(reset_key, self.env_params)
        zero = jnp.zeros((), jnp.float32)
        return State(
            pipeline_state={"env_state": _strong(env_state), "key": next_key},
            obs=self._obs(obs),
            reward=zero,
            done=zero,
            info={"truncation": zero},
        )

    def step(
        self, state: State, action: Float[Array, " action"] | Int[Array, ""]
    ) -> State:
        step_key, next_key = jax.random.split(state.pipeline_state["key"])
        action = self._action(action)
        with jax.numpy_dtype_promotion("standard"):
            obs, env_state, reward, ended, info = self.env.step_env(
                step_key, state.pipeline_state["env_state"], action, self.env_params
            )
            if self.truncation_from_info:
                truncated = info.get("truncation", info.get("truncated"))
                if truncated is None:
                    truncated = _time_limit(env_state, self.env_params)
            else:
                truncated = self.env.is_truncated(env_state, self.env_params)
        ended = jnp.asarray(ended, bool)
        truncated = jnp.asarray(truncated, bool)
        # gymnax's `ended` is termination alone; stable-gymnax's is `done`.
        truncation = truncated if self.truncation_from_info else truncated & ~ended
        return State(
            pipeline_state={"env_state": _strong(env_state), "key": next_key},
            obs=self._obs(obs),
            reward=jnp.asarray(reward, jnp.float32).reshape(()),
            done=(ended | truncated).astype(jnp.float32),
            info={"truncation": truncation.astype(jnp.float32)},
        )

    @property
    def observation_size(self) -> int | tuple[int, ...]:
        shape = tuple(self.env.observation_space(self.env_params).shape)
        return math.prod(shape) if self.flatten_obs else shape

    @property
    def action_size(self) -> int:
        return self.n_actions or math.prod(self._action_space().shape)

    @property
    def n_actions(self) -> int | None:
        from gymnax.environments import spaces

        space = self._action_space()
        return space.n if isinstance(space, spaces.Discrete) else None

    @property
    def dt(self) -> float:
        return float(getattr(self.env_params, "dt", 1.0))
