"""A single-env deterministic rollout kept step by step, for rendering."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import PRNGKeyArray

from ..nn._module import AbstractStatefulModule, reset_where


@eqx.filter_jit
def _scan_episode(env, network, length: int, key: PRNGKeyArray):
    reset_key, net_key = jax.random.split(key)

    def step(carry, k):
        env_state, net_state, total, steps, ended = carry
        k, next_reset_key = jax.random.split(k)
        out = network(net_state, env_state.obs, key=k)
        next_env = env.step(env_state, out.output.actions)
        done = jnp.asarray(next_env.done).astype(bool)
        alive = ~ended
        total = total + jnp.where(alive, sum(jax.tree.leaves(next_env.reward)), 0.0)
        steps = steps + alive.astype(jnp.int32)
        # Episodes continue past `done` in the video: env and carry reset
        # together, exactly as in training.
        next_env = jax.tree.map(
            lambda a, b: jnp.where(done, a, b), env.reset(next_reset_key), next_env
        )
        net_state = reset_where(network, done, out.next_state)
        return (next_env, net_state, total, steps, ended | done), env_state

    init = (
        env.reset(reset_key),
        network.initial_state(),
        jnp.zeros((), jnp.float32),
        jnp.zeros((), jnp.int32),
        jnp.zeros((), bool),
    )
    (_, _, total, steps, _), states = jax.lax.scan(
        step, init, jax.random.split(net_key, length)
    )
    return states, total, steps


def rollout_for_video(
    env: Any, network: AbstractStatefulModule, length: int, key: PRNGKeyArray
) -> tuple[list[Any], Any, Any]:
    """Run `length` steps in inference mode; return what `env.render` takes.

    Playground envs (states with a `data` field) get the list of env states;
    Brax and built-in envs get the list of `pipeline_state`s. Also returns the
    first episode's return and length.
    """
    states, total, steps = _scan_episode(
        env, eqx.nn.inference_mode(network), length, key
    )
    trajectory = states if hasattr(states, "data") else states.pipeline_state
    frames_input = [
        jax.tree.map(lambda x, i=i: x[i], trajectory) for i in range(length)
    ]
    return frames_input, total, steps
