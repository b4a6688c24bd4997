"""The environment state the library expects (Brax / MuJoCo Playground protocol)."""

import dataclasses
from typing import Any

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Float, PyTree


class State(eqx.Module):
    """One env's state, field-compatible with `brax.envs.State` (see the
    environments guide for the protocol).

    **Fields:**

    - `pipeline_state`: whatever the env needs to step.
    - `obs`: the observation pytree.
    - `reward`: a scalar, or a dict of scalars for multi-head rewards.
    - `done`: `1.0` when this step ended the episode (termination or truncation).
    - `metrics`: per-step scalars, logged under `env/...`.
    - `info`: bookkeeping; `info["truncation"]` marks time-limit ends.
    """

    pipeline_state: Any
    obs: PyTree[Array]
    reward: PyTree[Float[Array, ""]]
    done: Float[Array, ""]
    metrics: dict[str, Any] = eqx.field(default_factory=dict)
    info: dict[str, Any] = eqx.field(default_factory=dict)

    def replace(self, **changes: Any) -> "State":
        """A copy with `changes` applied (the Brax `State.replace` API)."""
        return dataclasses.replace(self, **changes)


def ongoing(
    pipeline_state: Any,
    obs: PyTree[Array],
    reward: PyTree[Float[Array, ""]],
    metrics: dict[str, Any] | None = None,
) -> State:
    """The state of a step that does not end the episode: `done` is `0.0`."""
    return State(
        pipeline_state=pipeline_state,
        obs=obs,
        reward=reward,
        done=jnp.zeros((), jnp.float32),
        metrics={} if metrics is None else metrics,
    )
