"""popgym-arcade's pixel envs through `make("popgym_arcade:<name>")`.

The env tests skip when popgym-arcade is not installed; the error `make`
raises without it is tested everywhere. MineSweeperEasy is the env under
test: it compiles in seconds and its short episodes end both ways. Moving
the cursor (actions 0-3) never ends one, so it ends at the 32-step limit (a
truncation); revealing (action 4) the same cell over and over ends it early
(a termination): on a mine, or once the cell has been revisited 8 times.
"""

import builtins

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqx_ppo
from eqx_ppo.envs import GymnaxAdapter, make
from eqx_ppo.nn import CategoricalSampler, Dense, Flattener, PPOAdapter, Sequential

NAME = "popgym_arcade:MineSweeperEasy"
OBS_SHAPE = (128, 128, 3)
N_ACTIONS = 5
LIMIT = 32  # board_size**2 * 2 steps


@pytest.fixture(scope="module")
def env():
    pytest.importorskip("popgym_arcade")
    return make(NAME)


def rollout(env, keys, actions):
    """`len(actions)` steps of `len(keys)` envs under `jit`, `vmap` and `scan`."""

    @jax.jit
    def run(keys):
        def body(state, action):
            state = jax.vmap(env.step)(state, action)
            return state, state

        return jax.lax.scan(body, jax.vmap(env.reset)(keys), actions)

    return run(keys)


def test_missing_package_names_the_extra(monkeypatch):
    real_import = builtins.__import__

    def no_popgym_arcade(name, *args, **kwargs):
        if name.partition(".")[0] == "popgym_arcade":
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_popgym_arcade)
    with pytest.raises(ImportError, match=r"pip install 'eqx_ppo\[popgym-arcade\]'"):
        make("popgym_arcade:MineSweeperEasy")


def test_make_keeps_image_observations(env, getkey):
    assert isinstance(env, GymnaxAdapter)
    assert env.observation_size == OBS_SHAPE
    assert (env.n_actions, env.action_size, env.max_len) == (N_ACTIONS, N_ACTIONS, 32)
    # Shapes by tracing alone; `rollout` below runs the env.
    state = jax.eval_shape(env.reset, getkey())
    assert (state.obs.shape, state.obs.dtype) == (OBS_SHAPE, jnp.float32)
    state = jax.eval_shape(env.step, state, jnp.array(0, jnp.int32))
    assert (state.obs.shape, state.obs.dtype) == (OBS_SHAPE, jnp.float32)
    assert state.reward.shape == state.done.shape == ()
    with pytest.raises(ValueError, match=r"integer scalar action in \[0, 5\)"):
        jax.eval_shape(env.step, state, jnp.zeros(N_ACTIONS))


def test_unknown_name():
    pytest.importorskip("popgym_arcade")
    with pytest.raises(ValueError, match="popgym-arcade has no env 'Nope'"):
        make("popgym_arcade:Nope")


def test_time_limit_is_truncation_and_losing_is_not(env, getkey):
    # Envs 0, 2 and 3 only move: 32 steps, then the limit. Env 1 reveals the
    # same cell: a mine, or the 8th revisit (step 10), ends it first.
    n_steps = LIMIT + 4
    actions = jnp.tile(jnp.array([0, 4, 1, 2], jnp.int32), (n_steps, 1))
    first, states = rollout(env, jax.random.split(getkey(), 4), actions)
    assert first.obs.shape == (4, *OBS_SHAPE)
    assert states.obs.shape == (n_steps, 4, *OBS_SHAPE)
    # Pixels keep their 0-255 values.
    assert 0.0 <= float(states.obs.min()) and float(states.obs.max()) <= 255.0
    assert float(first.obs.max()) > 1.0

    ends = np.asarray(jnp.argmax(states.done, axis=0))
    assert ends[0] == ends[2] == ends[3] == LIMIT - 1
    assert ends[1] < 12
    np.testing.assert_array_equal(states.done[: LIMIT - 1, 0], 0.0)
    np.testing.assert_array_equal(states.info["truncation"][LIMIT - 1, [0, 2, 3]], 1.0)
    np.testing.assert_array_equal(states.info["truncation"][: ends[1] + 1, 1], 0.0)


def _random_policy(key):
    """A linear policy on the raw pixels, enough to drive the env."""
    action_key, value_key = jax.random.split(key)
    features = int(np.prod(OBS_SHAPE))
    return Sequential(
        [
            Flattener(),
            PPOAdapter(
                action=Sequential(
                    [
                        Dense(features, N_ACTIONS, key=action_key),
                        CategoricalSampler(0.01, N_ACTIONS),
                    ]
                ),
                value=Dense(features, 1, key=value_key),
            ),
        ]
    )


def test_a_tiny_training_run_with_evaluation(env, getkey):
    config = eqx_ppo.TrainConfig(
        learner=eqx_ppo.PPO(
            n_envs=4, rollout_length=8, total_steps=64, n_minibatches=2, n_epochs=1
        ),
        eval=eqx_ppo.EvalConfig(
            every_steps=64, n_envs=2, max_episode_length=LIMIT, logging_percentiles=None
        ),
        progress=False,
    )
    result = eqx_ppo.train(env, _random_policy, config, key=getkey())
    assert result.total_steps == 64
    assert all(np.isfinite(v) for v in result.final_metrics.values())
    evaluation = result.eval_history[-1]
    assert 1.0 <= evaluation["eval/lifespan/mean"] <= LIMIT
    assert np.isfinite(evaluation["eval/episode_reward/mean"])
