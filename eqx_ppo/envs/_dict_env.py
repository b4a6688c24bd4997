"""DictObsAct: MoveToCenter with dict observations and dict actions."""

import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from ._env import check_action_tree
from ._move_to_center import AbstractCenterTask, distance, push, start_on_circle
from ._state import State, ongoing


class DictObsAct(AbstractCenterTask):
    """`MoveToCenter`'s task with dict observations `{"pos", "vel"}` and a dict
    action `{"force"}`: a probe for pytree plumbing."""

    def _state(
        self, pos: Float[Array, "2"], vel: Float[Array, "2"], reward: Float[Array, ""]
    ) -> State:
        obs = {"pos": pos, "vel": vel}
        return ongoing(obs, obs, reward)

    def reset(self, key: PRNGKeyArray) -> State:
        pos = start_on_circle(key, self.start_radius)
        return self._state(pos, jnp.zeros(2, jnp.float32), jnp.zeros((), jnp.float32))

    def step(self, state: State, action: dict[str, Float[Array, "2"]]) -> State:
        action = check_action_tree(self, action, {"force": (2,)})
        pos, vel = push(state.pipeline_state["pos"], action["force"], self.speed)
        return self._state(pos, vel, -distance(pos))

    @property
    def observation_size(self) -> dict[str, int]:
        return {"pos": 2, "vel": 2}

    @property
    def action_size(self) -> dict[str, int]:
        return {"force": 2}
