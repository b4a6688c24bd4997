"""Counter: reward for outputting the step number; exposes carry misalignment."""

from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from .._typecheck import Int, check_range, checked
from ._env import AbstractEnv, check_action
from ._state import State, ongoing


@checked
class Counter(AbstractEnv):
    """Say which step of the episode this is; episodes last from `min_length` to
    `max_length` steps, at random. A probe for reset logic: the observation is
    constant, so only a carry that counts steps and is reset exactly with the env
    scores."""

    min_length: Int = eqx.field(static=True, default=3)
    max_length: Int = eqx.field(static=True, default=9)
    observation_size: ClassVar[int] = 1
    action_size: ClassVar[int] = 1

    def __check_init__(self):
        fix = "1 <= min_length <= max_length, the range of episode lengths."
        check_range("Counter(min_length=", self.min_length, 1, fix=fix)
        check_range("Counter(max_length=", self.max_length, self.min_length, fix=fix)

    @property
    def max_len(self) -> int:
        """The longest episode, `max_length`: the env ends episodes itself."""
        return self.max_length

    def reset(self, key: PRNGKeyArray) -> State:
        length = jax.random.randint(key, (), self.min_length, self.max_length + 1)
        pipeline_state = {"step": jnp.zeros((), jnp.int32), "length": length}
        zero = jnp.zeros((), jnp.float32)
        return ongoing(pipeline_state, jnp.zeros(1, jnp.float32), zero)

    def step(self, state: State, action: Float[Array, " action"]) -> State:
        action = check_action(self, action, (1,))
        step = state.pipeline_state["step"] + 1
        hit = jnp.abs(action[0] - step.astype(action.dtype)) < 0.5
        return State(
            pipeline_state={**state.pipeline_state, "step": step},
            obs=jnp.zeros(1, jnp.float32),
            reward=hit.astype(jnp.float32),
            done=(step >= state.pipeline_state["length"]).astype(jnp.float32),
        )
