"""Parrot: repeat the observation just shown."""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from .._typecheck import Int, Number, check_range, checked
from ._env import AbstractEnv, check_action
from ._state import State, ongoing


@checked
class Parrot(AbstractEnv):
    """Echo the observation, a vector of `obs_size` values: the simplest
    feed-forward probe. The reward falls to `exp(-1/2)` at the distance
    `reward_falloff`."""

    obs_size: Int = eqx.field(static=True, default=3)
    reward_falloff: Number = eqx.field(static=True, default=0.5)

    def __check_init__(self):
        fix = "a length of 1 or more for the observation (and the action)."
        check_range("Parrot(obs_size=", self.obs_size, 1, fix=fix)
        check_range("Parrot(reward_falloff=", self.reward_falloff, 0, open_low=True)

    def _state(self, key: PRNGKeyArray, reward: Float[Array, ""]) -> State:
        obs_key, next_key = jax.random.split(key)
        obs = jnp.tanh(jax.random.normal(obs_key, (self.obs_size,), jnp.float32))
        return ongoing(next_key, obs, reward)

    def reset(self, key: PRNGKeyArray) -> State:
        return self._state(key, jnp.zeros((), jnp.float32))

    def step(self, state: State, action: Float[Array, " action"]) -> State:
        action = check_action(self, action, (self.obs_size,))
        sq_dist = jnp.sum((action - state.obs) ** 2)
        reward = jnp.exp(-sq_dist / (2 * self.reward_falloff**2))
        return self._state(state.pipeline_state, reward)

    @property
    def observation_size(self) -> int:
        return self.obs_size

    action_size = observation_size
