"""`PPO(reward_scaling=...)` scales rewards in the loss: the same updates
as scaling them in the env, evaluation in env units, and no recompiling."""

import dataclasses

import equinox as eqx
import jax
import pytest

import eqx_ppo
from eqx_ppo import envs
from tests._helpers import assert_ulp_close

ENV = envs.make("move_to_center")


def networks(key):
    return eqx_ppo.make_mlp_actor_critic(2, 2, (8,), (8,), key=key)


def config(**ppo):
    return eqx_ppo.TrainConfig(
        learner=eqx_ppo.PPO(
            n_envs=8, rollout_length=5, total_steps=120, n_minibatches=2, **ppo
        ),
        eval=eqx_ppo.EvalConfig(every_steps=120, n_envs=4, max_episode_length=20),
        progress=False,
    )


@pytest.mark.slow  # ~15-20 s; keeps the default suite under 15 min
def test_config_scaling_equals_env_scaling_and_evaluates_in_env_units():
    in_loss = eqx_ppo.train(ENV, networks, config(reward_scaling=10.0))
    in_env = eqx_ppo.train(
        envs.RewardScalingWrapper(ENV, 10.0), networks, config(), eval_env=ENV
    )
    # The loss sees the same float32 rewards either way.
    assert_ulp_close(
        eqx.filter(in_loss.training_state.network, eqx.is_array),
        eqx.filter(in_env.training_state.network, eqx.is_array),
    )
    # Both evaluate on the unscaled env: returns in env units (about -20 on
    # move_to_center; scaled they would be about -200).
    for a, b in zip(in_loss.eval_history, in_env.eval_history, strict=True):
        ret = a["eval/episode_reward/mean"]
        assert ret == pytest.approx(b["eval/episode_reward/mean"], rel=1e-5)
        assert -60 < ret < 0


def test_sweeping_reward_scaling_does_not_recompile():
    traces = []
    ppo = config().learner
    state = eqx_ppo.init(ENV, networks(jax.random.key(0)), ppo, key=jax.random.key(1))

    @eqx.filter_jit
    def step(c, s):
        traces.append(1)
        return eqx_ppo.step(ENV, c, s)

    for scale in (1.0, 10.0, 0.1):
        step(dataclasses.replace(ppo, reward_scaling=scale), state)
    assert len(traces) == 1
