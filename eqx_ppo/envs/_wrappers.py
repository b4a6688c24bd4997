"""Env wrappers: episode time limits and reward scaling."""

from collections.abc import Mapping
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from beartype.door import is_bearable
from jaxtyping import Array, PRNGKeyArray, PyTree

from .._typecheck import Int, Scalar, check_range, checked
from ._env import AbstractEnv, Size, check_env, reported_truncation, reset_one


class AbstractWrapper(AbstractEnv):
    """Base class of wrappers: an env built around another env, `env` (an
    `AbstractEnv`, a Brax or a Playground env). Every attribute the wrapper does
    not define itself (`observation_size`, `render`, `sys`, ...) is read from
    `env`, and states are `env`'s own. Subclasses define `env`, `reset`, `step`.
    """

    env: eqx.AbstractVar[Any]

    def __check_init__(self):
        check_env(self.env)

    @property
    def observation_size(self) -> Size:
        inner = type(self.unwrapped)
        owner = next((c for c in inner.__mro__ if "observation_size" in vars(c)), inner)
        if owner.__module__.partition(".")[0] not in ("brax", "mujoco_playground"):
            return self.env.observation_size
        # Brax and Playground run or trace a reset to answer; this traces the
        # reset a run's programs trace (once), by their rule: the last axis of
        # an array observation, the shapes of a dict's.
        obs = eqx.filter_eval_shape(reset_one, self, jax.random.key(0)).obs
        if isinstance(obs, Mapping):
            return jax.tree.map(lambda x: x.shape, obs)
        return obs.shape[-1]

    @property
    def action_size(self) -> Size:
        return self.env.action_size

    @property
    def n_actions(self) -> int | tuple[int, ...] | dict[str, Any] | None:
        return getattr(self.env, "n_actions", None)

    @property
    def dt(self) -> float:
        return self.env.dt

    @property
    def unwrapped(self) -> Any:
        return getattr(self.env, "unwrapped", self.env)

    def __getattr__(self, name: str) -> Any:
        # Only reached for names the wrapper lacks. `env` itself is excluded so
        # that a half-built wrapper raises instead of recursing forever.
        if name == "env" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.env, name)


@checked
class EpisodeWrapper(AbstractWrapper):
    """Ends every episode after `max_len` steps, marking it as a truncation.

    Counts steps in `info["steps"]`; `info["truncation"]` is `0` when the env
    terminated by itself, also on the limit's step (see the environments guide).

    **Arguments:**

    - `env`: the env to limit (built-in, Brax or Playground).
    - `max_len`: the episode length limit, in steps.
    - `random_initial_steps`: start each episode's counter at a random value in
        `[0, max_len // 2)`, to desynchronise envs that start together.
    """

    env: Any
    max_len: int = eqx.field(static=True)
    random_initial_steps: bool = eqx.field(static=True)

    def __init__(
        self, env: Any, max_len: Int | np.integer, *, random_initial_steps: bool = False
    ):
        fix = "a positive int, the number of steps after which episodes end."
        check_range("EpisodeWrapper(max_len=", max_len, 1, fix=fix)
        self.env = env
        self.max_len = int(max_len)
        self.random_initial_steps = random_initial_steps

    def reset(self, key: PRNGKeyArray) -> Any:
        if self.random_initial_steps:
            key, steps_key = jax.random.split(key)
            steps = jax.random.randint(steps_key, (), 0, max(self.max_len // 2, 1))
        else:
            steps = jnp.zeros((), jnp.int32)
        state = self.env.reset(key)
        info = {
            **state.info,
            "steps": steps.astype(jnp.int32),
            "truncation": jnp.zeros_like(state.done),
        }
        return state.replace(info=info)

    def step(self, state: Any, action: PyTree[Array]) -> Any:
        next_state = self.env.step(state, action)
        steps = state.info["steps"] + 1
        done = next_state.done
        at_limit = steps >= self.max_len
        truncation = jnp.where(
            done.astype(bool),
            reported_truncation(next_state).astype(done.dtype),
            at_limit.astype(done.dtype),
        )
        info = {**next_state.info, "steps": steps, "truncation": truncation}
        return next_state.replace(
            done=jnp.where(at_limit, jnp.ones_like(done), done), info=info
        )


@checked
class RewardScalingWrapper(AbstractWrapper):
    """Multiplies the env's reward by `scale`, for scalar or dict rewards.

    **Arguments:**

    - `env`: the env whose rewards to scale.
    - `scale`: a float for every reward leaf, or a pytree with the reward's
      structure (e.g. `{"arm1": 1.0, "arm2": 0.1}`).
    """

    env: Any
    # Kept as static Python floats so the wrapper stays hashable, as
    # `jax.jit(env.step)` requires of a bound method's owner.
    scale_leaves: tuple[float, ...] = eqx.field(static=True)
    scale_treedef: Any = eqx.field(static=True)

    def __init__(self, env: Any, scale: PyTree[float]):
        leaves, treedef = jax.tree.flatten(scale)
        if not leaves or not all(is_bearable(s, Scalar) for s in leaves):
            raise TypeError(
                f"`RewardScalingWrapper(scale={scale!r})`: scale must be a float or "
                "a dict of floats with the reward's keys."
            )
        factors = tuple(float(s) for s in leaves)
        if not all(np.isfinite(factors)) or not any(factors):
            raise ValueError(
                f"`RewardScalingWrapper(scale={scale!r})`: every factor must be "
                "finite and at least one non-zero; scaling every reward to zero "
                "leaves nothing to learn."
            )
        self.env = env
        self.scale_leaves = factors
        self.scale_treedef = treedef

    @property
    def scale(self) -> PyTree[float]:
        """The factor, or the pytree of per-key factors."""
        return jax.tree.unflatten(self.scale_treedef, self.scale_leaves)

    def _scaled(self, state: Any) -> Any:
        if self.scale_treedef.num_nodes == 1:
            (factor,) = self.scale_leaves
            reward = jax.tree.map(lambda r: r * factor, state.reward)
        elif self.scale_treedef == jax.tree.structure(state.reward):
            reward = jax.tree.map(lambda r, s: r * s, state.reward, self.scale)
        else:
            raise ValueError(
                "`RewardScalingWrapper`: a dict scale must have the reward's "
                f"structure; scale is {self.scale_treedef}, the reward is "
                f"{jax.tree.structure(state.reward)}. Give one factor per reward "
                "key, or a single float."
            )
        return state.replace(reward=reward)

    def reset(self, key: PRNGKeyArray) -> Any:
        return self._scaled(self.env.reset(key))

    def step(self, state: Any, action: PyTree[Array]) -> Any:
        return self._scaled(self.env.step(state, action))
