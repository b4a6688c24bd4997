"""PPO learns the probe envs; a recurrent policy solves the memory task.

Seeded, with thresholds well above what a broken learner reaches.
"""

import equinox as eqx
import jax
import numpy as np
import pytest

import eqx_ppo
from eqx_ppo import envs, nn
from eqx_ppo.nn._module import StatefulModuleOutput, zero_loss
from eqx_ppo.ppo import rollout
from eqx_ppo.ppo._rollout import StepCarry


def _train(env, networks, *, steps, n_envs=64, lr=3e-3, eval_len=20, seed=0, **ppo):
    config = eqx_ppo.TrainConfig(
        ppo=eqx_ppo.PPOConfig(
            n_envs=n_envs,
            rollout_length=ppo.pop("rollout_length", 20),
            total_steps=steps,
            learning_rate=lr,
            n_minibatches=4,
            **ppo,
        ),
        eval=eqx_ppo.EvalConfig(
            every_steps=steps,
            n_envs=64,
            max_episode_length=eval_len,
            logging_percentiles=None,
        ),
        seed=seed,
        progress=False,
    )
    return eqx_ppo.train_ppo(env, networks, config)


def _final(result):
    return result.eval_history[-1]["eval/episode_reward/mean"]


def test_move_to_center_learns():
    env = envs.make("move_to_center")
    result = _train(
        env,
        lambda k: eqx_ppo.make_mlp_actor_critic(2, 2, [32, 32], [32, 32], key=k),
        steps=100_000,
    )
    # Optimal -2.0, random about -20.
    assert _final(result) > -3.0, _final(result)


def test_parrot_learns():
    env = envs.make("parrot")
    obs = env.observation_size
    result = _train(
        env,
        lambda k: eqx_ppo.make_mlp_actor_critic(obs, obs, [32], [32], key=k),
        steps=150_000,
        eval_len=10,
        gae_lambda=0.0,
        discounting_factor=0.0,
    )
    # Optimal 10; a constant action scores about 4.
    assert _final(result) > 8.0, _final(result)


def _recall(networks, seed):
    env = envs.make("recall")
    return _final(
        _train(
            env,
            networks,
            steps=60_000,
            eval_len=5,
            seed=seed,
            rollout_length=10,
            lr=1e-2,
        )
    )


def test_recurrent_policy_solves_memory_task_feed_forward_cannot():
    lstm = _recall(lambda k: eqx_ppo.make_lstm_actor_critic(2, 1, 16, key=k), seed=1)
    ff = _recall(
        lambda k: eqx_ppo.make_mlp_actor_critic(2, 1, [16], [16], key=k), seed=1
    )
    # Optimal 5 (cue every step); best feed-forward 1 (only the cued step).
    assert lstm > 4.0, lstm
    assert ff < 1.8, ff


def test_dict_obs_actions_and_rewards_end_to_end():
    env = envs.make("two_arm")

    def networks(key):
        k = iter(jax.random.split(key, 4))
        return nn.Sequential(
            [
                nn.Flattener(),
                nn.Normalizer(8),
                nn.PPOAdapter(
                    action=nn.Sequential(
                        [
                            nn.Dense(8, 32, key=next(k), activation="swish"),
                            nn.Dense(32, 8, key=next(k)),
                            nn.Splitter(arm1=4, arm2=4),
                            nn.Map(
                                arm1=nn.NormalTanhSampler(1e-2, min_std=0.1),
                                arm2=nn.NormalTanhSampler(1e-2, min_std=0.1),
                            ),
                        ]
                    ),
                    # One value head per reward key.
                    value=nn.Sequential(
                        [
                            nn.Dense(8, 32, key=next(k), activation="swish"),
                            nn.Dense(32, 2, key=next(k)),
                            nn.Splitter(arm1=1, arm2=1),
                        ]
                    ),
                ),
            ]
        )

    result = _train(env, networks, steps=120_000)
    per_key = result.eval_history[-1]
    # Optimal {"arm1": -2.0, "arm2": -0.4}; random about -20 and -10.
    assert per_key["eval/episode_reward/arm1/mean"] > -3.5, per_key
    assert per_key["eval/episode_reward/arm2/mean"] > -1.5, per_key


def test_counter_carry_resets_with_env():
    """A hand-built counting policy scores the optimum only if its carry resets
    exactly when the env does."""
    env = envs.make("counter")

    class Count(nn.AbstractStatefulModule):
        def initial_state(self):
            return jax.numpy.zeros((1,))

        def __call__(self, state, x, extras=None, *, key=None):
            count = state + 1.0
            return StatefulModuleOutput(count, count / 10.0, zero_loss(), {})

    net = nn.Sequential(
        [
            Count(),
            nn.PPOAdapter(
                # An unsquashed sampler, so the deterministic action is the count.
                action=nn.Sequential(
                    [nn.Scale(10.0), _ConcatZeroStd(), nn.NormalSampler(0.0)]
                ),
                value=nn.Sequential([nn.Scale(0.0)]),
            ),
        ]
    )
    metrics = eqx.filter_jit(eqx_ppo.eval_rollout)(
        env,
        eqx.nn.inference_mode(net),
        jax.random.key(0),
        n_envs=32,
        max_episode_length=12,
        logging_percentiles=None,
    )
    np.testing.assert_allclose(
        metrics["eval/episode_reward/mean"], metrics["eval/lifespan/mean"], rtol=1e-6
    )
    # And through training-time auto-reset: every step of every episode scores.
    state = eqx_ppo.ppo_init(
        env,
        net,
        eqx_ppo.PPOConfig(n_envs=16, rollout_length=30, n_minibatches=1),
        key=jax.random.key(1),
    )
    _, data = rollout(
        env,
        eqx.nn.inference_mode(net),
        StepCarry(state.env_state, state.net_state),
        jax.random.key(2),
        length=30,
        reset_mode="cached",
        keep_terminal_obs=False,
    )
    assert float(data.reward.mean()) == 1.0
    assert int(data.done.sum()) > 16


class _ConcatZeroStd(nn.AbstractStatefulModule):
    def __call__(self, state, x, extras=None, *, key=None):
        return StatefulModuleOutput(
            (), jax.numpy.concatenate([x, x * 0.0 - 10.0]), zero_loss(), {}
        )


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:JAXopt is no longer maintained:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:Brax System:UserWarning")
@pytest.mark.filterwarnings("ignore:Accessing .* from `Data` is deprecated")
def test_brax_inverted_pendulum_learns():
    pytest.importorskip("brax")
    env = envs.make("brax:inverted_pendulum", backend="spring")
    # Brax's own code needs standard dtype promotion (the suite enables strict).
    with jax.numpy_dtype_promotion("standard"):
        result = _train(
            env,
            lambda k: eqx_ppo.make_mlp_actor_critic(
                env.observation_size,
                env.action_size,
                [32, 32, 32, 32],
                [32, 32, 32, 32],
                key=k,
            ),
            steps=300_000,
            n_envs=128,
            lr=1e-3,
            eval_len=1000,
        )
    # A random policy balances for about 5-10 steps (return < 20); 1000 is optimal.
    assert _final(result) > 200.0, _final(result)


@pytest.mark.filterwarnings("ignore:JAXopt is no longer maintained:DeprecationWarning")
def test_gymnax_cartpole_discrete_actions_learn():
    pytest.importorskip("gymnax")
    env = envs.make("gymnax:CartPole-v1")
    result = _train(
        env,
        lambda k: eqx_ppo.make_mlp_actor_critic(
            env.observation_size,
            env.n_actions,
            [32, 32],
            [32, 32],
            key=k,
            discrete=True,
        ),
        steps=100_000,
        rollout_length=32,
        eval_len=500,
    )
    # Random play balances ~20 steps; 500 is the cap.
    assert _final(result) > 300.0, _final(result)
