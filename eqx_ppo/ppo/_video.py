"""A single-env deterministic episode kept step by step, for rendering."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import PRNGKeyArray

from ..nn._module import AbstractStatefulModule
from ._rollout import SaveAt, run_fresh_episodes


@eqx.filter_jit
def _episode(env, network, length: int, key: PRNGKeyArray):
    # Episodes continue past `done` in the video: env and carry reset
    # together, exactly as in training.
    steps = run_fresh_episodes(
        env,
        network,
        key,
        n_envs=1,
        length=length,
        reset="fresh",
        save=SaveAt(transitions=("reward",), env_states=True),
    )
    alive = ~steps.finished[:, 0]
    reward = sum(jax.tree.leaves(steps.transitions.reward))[:, 0]
    total = jnp.sum(jnp.where(alive, reward, 0.0))
    states = jax.tree.map(lambda x: x[:, 0], steps.env_states)
    return states, total, jnp.sum(alive.astype(jnp.int32))


def rollout_for_video(
    env: Any, network: AbstractStatefulModule, length: int, key: PRNGKeyArray
) -> tuple[list[Any], Any, Any]:
    """Run `length` steps of one env in inference mode; return what
    `env.render` takes, and the first episode's return and length.

    Playground envs (states with a `data` field) get the list of env states;
    Brax and built-in envs get the list of `pipeline_state`s. `key` is used
    as in [`eqx_ppo.ppo.run_fresh_episodes`][].
    """
    states, total, steps = _episode(env, eqx.nn.inference_mode(network), length, key)
    trajectory = states if hasattr(states, "data") else states.pipeline_state
    frames_input = [
        jax.tree.map(lambda x, i=i: x[i], trajectory) for i in range(length)
    ]
    return frames_input, total, steps
