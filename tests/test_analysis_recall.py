"""eqx_ppo.analysis on a trained LSTM policy for `recall`: the memory is found
by lesions and decoded by a probe, on four seeds trained in one vmapped run."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqx_ppo
from eqx_ppo import analysis
from tests._helpers import SEED_OFFSET

N_SEEDS = 4
LSTM = 16


def actor_lstm(net):
    return net.layers[1].action.layers[0]


@pytest.fixture(scope="module")
def trained():
    env = eqx_ppo.envs.make("recall")  # cue at t = 0 only; 5 steps
    config = eqx_ppo.TrainConfig(
        ppo=eqx_ppo.PPOConfig(
            n_envs=64,
            rollout_length=10,
            total_steps=60_000,
            learning_rate=1e-2,
            n_minibatches=4,
        ),
        eval=eqx_ppo.EvalConfig(every_steps=60_000, max_episode_length=5),
        n_seeds=N_SEEDS,
        seed=SEED_OFFSET,
        progress=False,
    )
    result = eqx_ppo.train_ppo(
        env,
        lambda key: eqx_ppo.make_lstm_actor_critic(2, 1, LSTM, key=key),
        config,
    )
    return env, result.training_state.network


def test_lesions_find_the_memory_of_a_trained_recall_policy(trained):
    env, networks = trained
    key = jax.random.key(SEED_OFFSET + 1)

    def mean_return(net):
        metrics = eqx_ppo.eval_rollout(
            env, eqx.nn.inference_mode(net), key, n_envs=256, max_episode_length=5
        )
        return metrics["eval/episode_reward/mean"]

    everything = jnp.ones(LSTM, bool)
    per_seed = eqx.filter_vmap(
        lambda net: (
            mean_return(net),
            mean_return(analysis.ablate(net, actor_lstm, everything, site="carry")),
            analysis.unit_importance(
                env,
                net,
                actor_lstm,
                n_envs=256,
                max_episode_length=5,
                key=key,
                site="carry",
            ),
        )
    )
    intact, amnesic, importance = per_seed(networks)
    assert np.all(intact > 4.5)  # solved: the optimum is 5
    # Without its memory the policy earns what a feed-forward one can: the
    # first step (the cue is in view), about 1.
    assert np.all((0.5 < amnesic) & (amnesic < 1.5)), amnesic
    least = jnp.argmin(jnp.abs(importance), axis=1)
    for seed in range(N_SEEDS):
        net = eqx_ppo.select_seed(networks, seed)
        lesioned = analysis.ablate(
            net, actor_lstm, least[seed : seed + 1], site="carry"
        )
        assert abs(mean_return(lesioned) - intact[seed]) < 0.1


def test_a_probe_reads_the_cue_from_the_memory_not_the_observation(trained):
    env, networks = trained
    hidden_accuracy, observation_accuracy = [], []
    for seed in range(N_SEEDS):
        net = eqx_ppo.select_seed(networks, seed)
        acts, dones = eqx_ppo.record_activations_rollout(
            env, net, n_envs=1024, max_episode_length=5, key=jax.random.key(seed)
        )
        assert not np.any(dones)  # every episode lasts the 5 steps
        # The normalised observation at t = 0 shows the cue: two values.
        shown = acts[0][0, :, 0]
        cue = shown > jnp.mean(shown)
        recall = 4  # the last step, four steps after the cue
        hidden_accuracy.append(
            analysis.linear_probe(
                acts[1]["action"][0][recall], cue, key=jax.random.key(9)
            )
        )
        observation_accuracy.append(
            analysis.linear_probe(acts[0][recall], cue, key=jax.random.key(9))
        )
    assert np.median(hidden_accuracy) >= 0.95, hidden_accuracy
    # 256 held-out episodes: chance is 0.5 +- 0.031.
    assert np.all(np.abs(np.array(observation_accuracy) - 0.5) < 0.15)
