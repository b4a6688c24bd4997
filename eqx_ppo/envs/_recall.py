"""Recall: a memory task no feed-forward policy can solve."""

from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from .._typecheck import Int, check_range, checked
from ._env import AbstractEnv, check_action
from ._state import State


@checked
class Recall(AbstractEnv):
    """Remember a cue shown once and act on it for the rest of the episode, of
    `length` steps (at least 2)."""

    length: Int = eqx.field(static=True, default=5)
    observation_size: ClassVar[int] = 2
    action_size: ClassVar[int] = 1

    def __check_init__(self):
        check_range(
            "Recall(length=",
            self.length,
            2,
            fix="two or more: with one there is nothing to recall.",
        )

    @property
    def max_len(self) -> int:
        """The episode length, `length`: the env ends episodes itself."""
        return self.length

    def _state(
        self, ps: dict[str, Array], reward: Float[Array, ""], done: Float[Array, ""]
    ) -> State:
        """The state at step `ps["t"]`: the cue on step 0 only, and the clock."""
        cue, t = ps["cue"], ps["t"]
        shown = jnp.where(t == 0, cue, jnp.zeros_like(cue))
        obs = jnp.stack([shown, t.astype(jnp.float32) / self.length])
        return State(pipeline_state=ps, obs=obs, reward=reward, done=done)

    def reset(self, key: PRNGKeyArray) -> State:
        cue = jnp.where(jax.random.bernoulli(key), 1.0, -1.0).astype(jnp.float32)
        zero = jnp.zeros((), jnp.float32)
        return self._state({"cue": cue, "t": jnp.zeros((), jnp.int32)}, zero, zero)

    def step(self, state: State, action: Float[Array, " action"]) -> State:
        action = check_action(self, action, (1,))
        cue = state.pipeline_state["cue"]
        reward = jnp.clip(action[0], -1.0, 1.0) * cue
        t = state.pipeline_state["t"] + 1
        done = (t >= self.length).astype(jnp.float32)
        return self._state({"cue": cue, "t": t}, reward, done)
