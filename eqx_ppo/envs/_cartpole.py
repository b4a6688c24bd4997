"""CartPole: gym's CartPole-v1 dynamics with a continuous force, optionally
without velocities."""

from collections.abc import Sequence
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PRNGKeyArray

from .._typecheck import Number, check_range, checked
from ._draw import Canvas, frames
from ._env import AbstractEnv, check_action
from ._state import State

_GRAVITY = 9.8
_CART_MASS = 1.0
_POLE_MASS = 0.1
_HALF_LENGTH = 0.5
_TAU = 0.02
_X_LIMIT = 2.4
_THETA_LIMIT = 12 * 2 * np.pi / 360


@checked
class CartPole(AbstractEnv):
    """Balance a pole on a cart: gym's CartPole-v1 with a continuous force,
    `max_force` for action `1`; `hide_velocity` drops `x_dot` and `theta_dot`
    from the observation. Dynamics, reward and termination: see the
    environments guide."""

    hide_velocity: bool = eqx.field(static=True, default=False)
    max_force: Number = eqx.field(static=True, default=10.0)
    action_size: ClassVar[int] = 1

    def __check_init__(self):
        check_range("CartPole(max_force=", self.max_force, 0, open_low=True)

    def _state(self, physics: Float[Array, "4"], reward, done) -> State:
        obs = physics[jnp.array([0, 2])] if self.hide_velocity else physics
        return State(pipeline_state=physics, obs=obs, reward=reward, done=done)

    def reset(self, key: PRNGKeyArray) -> State:
        physics = jax.random.uniform(key, (4,), jnp.float32, -0.05, 0.05)
        zero = jnp.zeros((), jnp.float32)
        return self._state(physics, zero, zero)

    def step(self, state: State, action: Float[Array, " action"]) -> State:
        action = check_action(self, action, (1,))
        x, x_dot, theta, theta_dot = state.pipeline_state
        force = self.max_force * jnp.clip(action[0], -1.0, 1.0)
        total_mass = _CART_MASS + _POLE_MASS
        pole_moment = _POLE_MASS * _HALF_LENGTH
        cos, sin = jnp.cos(theta), jnp.sin(theta)
        temp = (force + pole_moment * theta_dot**2 * sin) / total_mass
        theta_acc = (_GRAVITY * sin - cos * temp) / (
            _HALF_LENGTH * (4.0 / 3.0 - _POLE_MASS * cos**2 / total_mass)
        )
        x_acc = temp - pole_moment * theta_acc * cos / total_mass
        physics = jnp.stack(
            [
                x + _TAU * x_dot,
                x_dot + _TAU * x_acc,
                theta + _TAU * theta_dot,
                theta_dot + _TAU * theta_acc,
            ]
        )
        fallen = (jnp.abs(physics[0]) > _X_LIMIT) | (jnp.abs(physics[2]) > _THETA_LIMIT)
        return self._state(
            physics, jnp.ones((), jnp.float32), fallen.astype(jnp.float32)
        )

    @property
    def observation_size(self) -> int:
        return 2 if self.hide_velocity else 4

    @property
    def dt(self) -> float:
        return _TAU

    def render(
        self, trajectory: Sequence[Any], height: int = 128, width: int = 128
    ) -> list[np.ndarray]:
        """One `[height, width, 3]` `uint8` frame per state (or pipeline state)."""
        return frames(trajectory, height, width, _X_LIMIT + 0.3, _draw)


def _draw(canvas: Canvas, physics: Any) -> None:
    x, theta = float(physics[0]), float(physics[2])
    cart = np.array([x, 0.0])
    tip = cart + 2 * _HALF_LENGTH * np.array([np.sin(theta), np.cos(theta)])
    rail = np.array([_X_LIMIT, 0.0])
    canvas.segment(-rail, rail, 0.02, (160, 160, 160))
    canvas.disk(cart, 0.15, (40, 40, 40))
    canvas.segment(cart, tip, 0.06, (200, 80, 40))
