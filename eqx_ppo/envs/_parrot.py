"""Parrot: repeat the observation just shown."""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from ._env import AbstractEnv, check_action
from ._state import State, ongoing


class Parrot(AbstractEnv):
    """Echo the observation: the simplest feed-forward probe.

    Each step shows a fresh random vector and rewards the action for matching
    the vector shown *before* it, i.e. the observation the action was chosen
    from, so the memoryless policy `action = obs` is optimal.

    - **Observation**: `tanh` of a standard normal vector,
      `Float[Array, "obs_size"]`, fresh every step.
    - **Action**: `Float[Array, "obs_size"]`.
    - **Reward**: `exp(-|action - obs|^2 / (2 reward_falloff^2))` with `obs`
      the observation the action answered; in `(0, 1]`.
    - **Episode end**: never by itself; `make("parrot")` truncates at 10 steps.
    - **Optimal return**: `1` per step (`action = obs`), `10` with
      `make("parrot")`.

    **Arguments:**

    - `obs_size`: the length of the observation and action vectors.
    - `reward_falloff`: the distance at which the reward falls to `exp(-1/2)`.
    """

    obs_size: int = eqx.field(static=True, default=3)
    reward_falloff: float = eqx.field(static=True, default=0.5)

    def __check_init__(self):
        if self.obs_size < 1 or self.reward_falloff <= 0:
            raise ValueError(
                f"`Parrot(obs_size={self.obs_size}, reward_falloff="
                f"{self.reward_falloff})`: need obs_size >= 1 and reward_falloff > 0."
            )

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

    @property
    def action_size(self) -> int:
        return self.obs_size
