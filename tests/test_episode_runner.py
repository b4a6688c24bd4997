"""The one episode runner: what it saves is data, its key stream is the
documented one, and its reset modes do what they say."""

import jax
import jax.numpy as jnp
import pytest

import eqx_ppo
from eqx_ppo.ppo._rollout import SaveAt, env_keys, run_episodes, start_episodes

ENV = eqx_ppo.envs.make("move_to_center")
N, T = 3, 25  # episodes of move_to_center last 20 steps


def net(key):
    return eqx_ppo.make_lstm_actor_critic(2, 2, 4, key=key)


def run(reset, save, key=1):
    network = net(jax.random.key(0))
    carry = start_episodes(ENV, network, jax.random.key(2), N)
    return network, run_episodes(
        ENV,
        network,
        carry,
        jax.random.key(key),
        length=T,
        reset=reset,
        save=save,
        starts=carry.env_state if reset == "initial" else None,
    )


def test_only_the_requested_fields_are_kept():
    _, (_, steps) = run("cached", SaveAt(transitions=("reward", "done")))
    assert steps.transitions.reward.shape == (T, N)
    assert steps.transitions.obs is None and steps.transitions.extras is None
    assert steps.env_states is None and steps.activations is None
    with pytest.raises(ValueError, match=r"unknown fields \['rewards'\]"):
        SaveAt(transitions=("rewards",))


def test_step_keys_follow_the_documented_stream():
    _, (_, steps) = run("cached", SaveAt(transitions=("key",)))
    _, keys_key, _ = jax.random.split(jax.random.key(1), 3)
    expected = jax.vmap(lambda k: env_keys(k, N))(jax.random.split(keys_key, T))
    assert jnp.array_equal(
        jax.random.key_data(steps.transitions.key), jax.random.key_data(expected)
    )


def test_without_resets_episodes_end_once_and_carries_run_on():
    network, (last, steps) = run("none", SaveAt(transitions=("done",)))
    done = steps.transitions.done
    first_end = jnp.argmax(done, axis=0)
    # finished[t] is "an episode ended before step t": false up to the first
    # done, true after it.
    t = jnp.arange(T)[:, None]
    assert jnp.array_equal(steps.finished, t > first_end[None, :])
    # No reset: the step counter runs past the episode limit.
    assert jnp.all(last.env_state.info["steps"] > 20)


def test_auto_reset_restarts_finished_envs():
    network, (last, steps) = run("fresh", SaveAt(transitions=("done",)))
    assert steps.transitions.done.sum() >= N  # every env finished once in 25 steps
    assert jnp.all(last.env_state.info["steps"] <= 20)


@pytest.mark.parametrize("reset", ["cached", "fresh", "initial"])
def test_finished_envs_restart_from_the_documented_start_states(reset):
    _, (_, steps) = run(reset, SaveAt(transitions=("obs", "done")))
    cache_key, _, fresh_key = jax.random.split(jax.random.key(1), 3)
    cached = jax.vmap(ENV.reset)(env_keys(cache_key, N)).obs
    initial = jax.vmap(ENV.reset)(env_keys(jax.random.key(2), N)).obs
    fresh_keys = jax.random.split(fresh_key, T)
    done, obs = steps.transitions.done, steps.transitions.obs
    restarts = [(t, i) for t in range(T - 1) for i in range(N) if done[t, i]]
    assert len(restarts) >= N  # every env restarted at least once
    t0 = restarts[0][0]  # the two modes' start states differ there
    assert not jnp.array_equal(
        cached, jax.vmap(ENV.reset)(env_keys(fresh_keys[t0], N)).obs
    )
    assert not jnp.array_equal(cached, initial)
    for t, i in restarts:
        if reset == "cached":
            expected = cached[i]
        elif reset == "initial":
            expected = initial[i]  # the state the env started the call in
        else:
            expected = jax.vmap(ENV.reset)(env_keys(fresh_keys[t], N)).obs[i]
        # The step after a done starts from that start state.
        assert jnp.array_equal(obs[t + 1, i], expected), (reset, t, i)
