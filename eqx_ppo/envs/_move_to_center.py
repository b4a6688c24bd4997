"""MoveToCenter: push a point in the plane to the origin."""

from collections.abc import Sequence
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PRNGKeyArray

from .._typecheck import check_range
from ._draw import Canvas, frames
from ._env import AbstractEnv, check_action
from ._state import State, ongoing


def push(
    pos: Float[Array, "2"], action: Float[Array, "2"], speed: float
) -> tuple[Float[Array, "2"], Float[Array, "2"]]:
    """The new position and the displacement: `pos` moved by `speed * action`,
    the action's norm capped at 1 (the best speed is the same in every direction)."""
    norm = jnp.sqrt(jnp.sum(action**2))
    displacement = speed * action / jnp.maximum(norm, 1.0)
    return pos + displacement, displacement


def start_on_circle(key: PRNGKeyArray, radius: float) -> Float[Array, "2"]:
    """A point at a uniformly random angle on the circle of `radius`."""
    angle = jax.random.uniform(key, (), jnp.float32, 0.0, 2 * jnp.pi)
    return radius * jnp.stack([jnp.cos(angle), jnp.sin(angle)])


def distance(pos: Float[Array, "2"]) -> Float[Array, ""]:
    return jnp.sqrt(jnp.sum(pos**2))


class AbstractCenterTask(AbstractEnv):
    """MoveToCenter's task; the subclasses choose how it is observed and pushed."""

    start_radius: float = eqx.field(static=True, default=1.0)
    speed: float = eqx.field(static=True, default=0.2)

    def __check_init__(self):
        cls = type(self).__name__
        for name in ("start_radius", "speed"):
            check_range(f"{cls}({name}=", getattr(self, name), 0, open_low=True)


class MoveToCenter(AbstractCenterTask):
    """Push a point that starts `start_radius` from the origin, by at most
    `speed` a step, to the origin and hold it there. Reward: minus the distance
    after the move (see the environments guide)."""

    observation_size: ClassVar[int] = 2
    action_size: ClassVar[int] = 2

    def _state(self, pos: Float[Array, "2"], reward: Float[Array, ""]) -> State:
        return ongoing(pos, pos, reward, metrics={"distance": distance(pos)})

    def reset(self, key: PRNGKeyArray) -> State:
        pos = start_on_circle(key, self.start_radius)
        return self._state(pos, jnp.zeros((), jnp.float32))

    def step(self, state: State, action: Float[Array, " action"]) -> State:
        action = check_action(self, action, (2,))
        pos, _ = push(state.pipeline_state, action, self.speed)
        return self._state(pos, -distance(pos))

    def render(
        self, trajectory: Sequence[Any], height: int = 128, width: int = 128
    ) -> list[np.ndarray]:
        """One `[height, width, 3]` `uint8` frame per state (or pipeline state)."""
        return frames(trajectory, height, width, 1.5 * self.start_radius, self._draw)

    def _draw(self, canvas: Canvas, pos: Any) -> None:
        canvas.disk(np.zeros(2), 0.05 * self.start_radius, (160, 160, 160))
        canvas.disk(np.asarray(pos), 0.08 * self.start_radius, (200, 40, 40))
