"""Pendulum: the classic swing-up (gym's Pendulum-v1), optionally without velocity."""

import math
from collections.abc import Sequence
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PRNGKeyArray

from .._typecheck import Number, checked
from ._draw import Canvas, frames
from ._env import AbstractEnv, check_action, check_positive
from ._state import State, ongoing


def _angle_normalize(theta: Float[Array, ""]) -> Float[Array, ""]:
    return (theta + jnp.pi) % (2 * jnp.pi) - jnp.pi


@checked
class Pendulum(AbstractEnv):
    """Swing a pendulum up and balance it, with gym's Pendulum-v1 dynamics.

    The angle `theta` is 0 upright. Per step of `dt = 0.05` s, with torque
    `u = max_torque * clip(action, -1, 1)`:
    `theta_dot += (3 g / (2 l) sin(theta) + 3 u / (m l^2)) dt`, clipped to
    `[-max_speed, max_speed]`, then `theta += theta_dot dt`
    (`g = 10, m = l = 1, max_torque = 2, max_speed = 8`). The torque alone
    cannot lift the pendulum, so it must swing.

    - **Observation**: `[cos(theta), sin(theta), theta_dot]`, or only
      `[cos(theta), sin(theta)]` with `hide_velocity=True`.
    - **Action**: `Float[Array, "1"]` in `[-1, 1]`, scaled to the torque.
    - **Reward**: `-(angle^2 + 0.1 theta_dot^2 + 0.001 u^2)` of the state
      *before* the step (`angle` wrapped to `[-pi, pi)`), exactly as in gym.
    - **Episode end**: never by itself; `make("pendulum")` and
      `make("pendulum_no_velocity")` truncate at 200 steps (gym's limit).
    - **Start**: `theta ~ U(-pi, pi)`, `theta_dot ~ U(-1, 1)`.
    - **Optimal return**: at most 0, reached only from an upright start at
      rest; the best known policies average about -140 per 200-step episode
      from random starts, zero torque about -1200.
    - **Without velocity** (a memory task): a recurrent policy can recover
      `theta_dot` from two consecutive angles; a feed-forward one cannot pump
      energy reliably.

    **Arguments:**

    - `hide_velocity`: drop `theta_dot` from the observation.
    - `max_torque`: the torque of action `1`.
    """

    hide_velocity: bool = eqx.field(static=True, default=False)
    max_torque: Number = eqx.field(static=True, default=2.0)
    max_speed: Number = eqx.field(static=True, default=8.0)
    gravity: Number = eqx.field(static=True, default=10.0)
    mass: Number = eqx.field(static=True, default=1.0)
    length: Number = eqx.field(static=True, default=1.0)
    step_dt: Number = eqx.field(static=True, default=0.05)
    action_size: ClassVar[int] = 1

    def __check_init__(self):
        check_positive(self, "max_torque", "max_speed", "mass", "length", "step_dt")
        if not (self.gravity >= 0 and math.isfinite(self.gravity)):
            raise ValueError(
                f"`Pendulum(gravity={self.gravity!r})`: must be finite and >= 0."
            )

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
        cost = _angle_normalize(theta) ** 2 + 0.1 * theta_dot**2 + 0.001 * u**2
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

        def draw(physics: Any) -> np.ndarray:
            theta = float(physics["theta"])
            tip = self.length * np.array([np.sin(theta), np.cos(theta)])
            canvas = Canvas(height, width, extent=1.3 * self.length)
            canvas.segment(np.zeros(2), tip, 0.12 * self.length, (200, 80, 40))
            canvas.disk(np.zeros(2), 0.06 * self.length, (40, 40, 40))
            return canvas.image

        return frames(trajectory, draw)
