"""TwoArm: two independent MoveToCenter tasks with one reward key each."""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from .._typecheck import check_range
from ._env import AbstractEnv, check_action_tree
from ._move_to_center import distance, push, start_on_circle
from ._state import State, ongoing

_ARMS = ("arm1", "arm2")


class TwoArm(AbstractEnv):
    """Two `MoveToCenter` arms, starting `arm1_radius` and `arm2_radius` from
    the origin, each with its own reward key: a probe for multi-head values (the
    keys' optimal returns differ)."""

    arm1_radius: float = eqx.field(static=True, default=1.0)
    arm2_radius: float = eqx.field(static=True, default=0.5)
    speed: float = eqx.field(static=True, default=0.2)

    def __check_init__(self):
        for name in ("arm1_radius", "arm2_radius", "speed"):
            check_range(f"TwoArm({name}=", getattr(self, name), 0, open_low=True)

    def reset(self, key: PRNGKeyArray) -> State:
        radii = (self.arm1_radius, self.arm2_radius)
        obs = {
            arm: {"pos": start_on_circle(k, r), "vel": jnp.zeros(2, jnp.float32)}
            for arm, k, r in zip(_ARMS, jax.random.split(key), radii, strict=True)
        }
        return ongoing(obs, obs, {arm: jnp.zeros((), jnp.float32) for arm in _ARMS})

    def step(self, state: State, action: dict[str, Float[Array, "2"]]) -> State:
        action = check_action_tree(self, action, {arm: (2,) for arm in _ARMS})
        obs, reward = {}, {}
        for arm in _ARMS:
            pos, vel = push(state.pipeline_state[arm]["pos"], action[arm], self.speed)
            obs[arm] = {"pos": pos, "vel": vel}
            reward[arm] = -distance(pos)
        return ongoing(obs, obs, reward)

    @property
    def observation_size(self) -> dict[str, dict[str, int]]:
        return {arm: {"pos": 2, "vel": 2} for arm in _ARMS}

    @property
    def action_size(self) -> dict[str, int]:
        return {arm: 2 for arm in _ARMS}
