"""Pendulum: the classic swing-up (gym's Pendulum-v1), optionally without velocity."""

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
from ._state import State, ongoing


@checked
class Pendulum(AbstractEnv):
    """Swing a pendulum up and balance it: gym's Pendulum-v1, `max_torque` for
    action `1`; `hide_velocity` drops `theta_dot` from the observation. The
    physics and reward: see the environments guide."""

    hide_velocity: bool = eqx.field(static=True, default=False)
    max_torque: Number = eqx.field(static=True, default=2.0)
    max_speed: Number = eqx.field(static=True, default=8.0)
    gravity: Number = eqx.field(static=True, default=10.0)
    mass: Number = eqx.field(static=True, default=1.0)
    length: Number = eqx.field(static=True, default=1.0)
    step_dt: Number = eqx.field(static=True, default=0.05)
    action_size: ClassVar[int] = 1

    def __check_init__(self):
        for name in ("max_torque", "max_speed", "mass", "length", "step_dt"):
            check_range(f"Pendulum({name}=", getattr(self, name), 0, open_low=True)
        check_range("Pendulum(gravity=", self.gravity, 0)

    def _state(
        self, theta: Float[Array, ""], theta_dot: Float[Array, ""], reward
    ) -> State:
        parts = [jnp.cos(theta), jnp.sin(theta)]
        if not self.hide_velocity:
            parts.append(theta_dot)
        physics = {"theta": theta, "theta_dot": theta_dot}
        return ongoing(physics, jnp.stack(parts), reward)

    def reset(self, key: PRNGKeyArray) -> State:
        high = jnp.array([jnp.pi, 1.0], jnp.float32)
        theta, theta_dot = jax.random.uniform(key, (2,), jnp.float32, -high, high)
        return self._state(theta, theta_dot, jnp.zeros((), jnp.float32))

    def step(self, state: State, action: Float[Array, " action"]) -> State:
        action = check_action(self, action, (1,))
        theta = state.pipeline_state["theta"]
        theta_dot = state.pipeline_state["theta_dot"]
        u = self.max_torque * jnp.clip(action[0], -1.0, 1.0)
        angle = (theta + jnp.pi) % (2 * jnp.pi) - jnp.pi  # wrapped to [-pi, pi)
        cost = angle**2 + 0.1 * theta_dot**2 + 0.001 * u**2
        accel = (
            3 * self.gravity / (2 * self.length) * jnp.sin(theta)
            + 3.0 / (self.mass * self.length**2) * u
        )
        theta_dot = jnp.clip(
            theta_dot + accel * self.step_dt, -self.max_speed, self.max_speed
        )
        theta = theta + theta_dot * self.step_dt
        return self._state(theta, theta_dot, -cost)

    @property
    def observation_size(self) -> int:
        return 2 if self.hide_velocity else 3

    @property
    def dt(self) -> float:
        return self.step_dt

    def render(
        self, trajectory: Sequence[Any], height: int = 128, width: int = 128
    ) -> list[np.ndarray]:
        """One `[height, width, 3]` `uint8` frame per state (or pipeline state)."""
        return frames(trajectory, height, width, 1.3 * self.length, self._draw)

    def _draw(self, canvas: Canvas, physics: Any) -> None:
        theta = float(physics["theta"])
        tip = self.length * np.array([np.sin(theta), np.cos(theta)])
        canvas.segment(np.zeros(2), tip, 0.12 * self.length, (200, 80, 40))
        canvas.disk(np.zeros(2), 0.06 * self.length, (40, 40, 40))
