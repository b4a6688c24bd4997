"""PPO learns the probe envs; a recurrent policy solves the memory task.

Every learning test trains several seeds in one vmapped run and asserts on
the median and on a low quantile of the seeds' final deterministic returns,
with thresholds set from the distribution `benchmarks/stability.py` measures
(16 seeds) and a margin, never on one seed's trajectory. The seeds can be
shifted with `EQX_PPO_TEST_SEED_OFFSET` (e.g. 1000) to check that the tests
do not depend on the seeds they happen to use.
"""

import equinox as eqx
import jax
import numpy as np
import pytest

import eqx_ppo
from benchmarks.stability import CASES, collapsed_seeds, curves, two_arm_network
from eqx_ppo import envs, nn
from eqx_ppo.nn._module import StatefulModuleOutput, zero_loss
from eqx_ppo.ppo._rollout import SaveAt, StepCarry, run_episodes
from tests._helpers import SEED_OFFSET


def _train(
    env,
    networks,
    *,
    steps,
    n_seeds=8,
    n_envs=64,
    lr=3e-3,
    eval_len=20,
    seed=0,
    **ppo,
):
    """Final eval results of `n_seeds` seeds trained in one vmapped program."""
    config = eqx_ppo.TrainConfig(
        learner=eqx_ppo.PPO(
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
        seed=seed + SEED_OFFSET,
        n_seeds=n_seeds,
        progress=False,
    )
    return eqx_ppo.train(env, networks, config).eval_history[-1]


def _finals(record, key="eval/episode_reward/mean"):
    return np.asarray(record[key])


def _assert_learned(finals, *, median, low, quantile=25):
    """The seeds' median beats `median` and their `quantile`-th percentile
    beats `low`."""
    m, q = np.median(finals), np.percentile(finals, quantile)
    assert m > median and q > low, f"median {m:.3g}, p{quantile} {q:.3g}: {finals}"


@pytest.mark.slow  # 30-40 s each; the README's example is the default suite's
@pytest.mark.parametrize("reset_mode", ["cached", "initial"])
def test_move_to_center_learns(reset_mode):
    # "initial": each of the 64 envs restarts from one start state for the
    # whole run; evaluation draws fresh ones, so this also tests generalising.
    env = envs.make("move_to_center")
    finals = _finals(
        _train(
            env,
            lambda k: eqx_ppo.make_mlp_actor_critic(2, 2, [32, 32], [32, 32], key=k),
            steps=100_000,
            reset_mode=reset_mode,
        )
    )
    # Optimal -2.0, random about -20; 16 seeds: median -2.15, worst -2.23.
    _assert_learned(finals, median=-2.6, low=-3.0)


@pytest.mark.slow  # 20-35 s; keeps the default suite under 15 min
def test_parrot_learns():
    env = envs.make("parrot")
    obs = env.observation_size
    finals = _finals(
        _train(
            env,
            lambda k: eqx_ppo.make_mlp_actor_critic(obs, obs, [32], [32], key=k),
            steps=150_000,
            eval_len=10,
            gae_lambda=0.0,
            discounting_factor=0.0,
        )
    )
    # Optimal 10; a constant action scores about 4; 16 seeds: 9.78 to 9.86.
    _assert_learned(finals, median=9.0, low=8.0)


def _recall(networks):
    env = envs.make("recall")
    return _finals(
        _train(
            env,
            networks,
            steps=60_000,
            eval_len=5,
            seed=1,
            rollout_length=10,
            lr=1e-2,
        )
    )


@pytest.mark.slow  # 20-35 s; keeps the default suite under 15 min
def test_recurrent_policy_solves_memory_task_feed_forward_cannot():
    lstm = _recall(lambda k: eqx_ppo.make_lstm_actor_critic(2, 1, 16, key=k))
    ff = _recall(lambda k: eqx_ppo.make_mlp_actor_critic(2, 1, [16], [16], key=k))
    # Optimal 5 (cue every step); best feed-forward 1 (only the cued step).
    # 16 LSTM seeds: all 5.0.
    _assert_learned(lstm, median=4.5, low=4.0)
    assert np.max(ff) < 1.8, ff


@pytest.mark.slow  # about 12 s each
@pytest.mark.parametrize("cell", ["gru", "lru", "mingru"])
def test_the_other_memory_cells_solve_the_memory_task(cell):
    finals = _recall(
        lambda k: eqx_ppo.make_recurrent_actor_critic(2, 1, 16, cell=cell, key=k)
    )
    # As the LSTM above. 16 seeds, at seeds 1 and 1001: every seed of every
    # cell 4.98 to 5.0.
    _assert_learned(finals, median=4.5, low=4.0)


@pytest.mark.slow  # 20-35 s; keeps the default suite under 15 min
def test_dict_obs_actions_and_rewards_end_to_end():
    env = envs.make("two_arm")
    record = _train(env, lambda k: two_arm_network(env, k), steps=120_000)
    # Optimal {"arm1": -2.0, "arm2": -0.4}; random about -20 and -10. 16 seeds:
    # total -2.79 to -3.07.
    _assert_learned(
        _finals(record, "eval/episode_reward/arm1/mean"), median=-3.0, low=-3.5
    )
    _assert_learned(
        _finals(record, "eval/episode_reward/arm2/mean"), median=-1.0, low=-1.5
    )


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
    state = eqx_ppo.init(
        env,
        net,
        eqx_ppo.PPO(n_envs=16, rollout_length=30, n_minibatches=1),
        key=jax.random.key(1),
    )
    _, steps = run_episodes(
        env,
        eqx.nn.inference_mode(net),
        StepCarry(state.env_state, state.carry),
        jax.random.key(2),
        length=30,
        reset="cached",
        save=SaveAt(transitions=("reward", "done")),
    )
    assert float(steps.transitions.reward.mean()) == 1.0
    assert int(steps.transitions.done.sum()) > 16


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
            n_seeds=8,
            n_envs=128,
            lr=1e-3,
            eval_len=1000,
        )
    # A random policy balances for about 5-10 steps (return < 20); 1000 is
    # optimal. 32 seeds ended between 110 and 1000, 5 of them below 200.
    _assert_learned(_finals(result), median=150.0, low=60.0)


@pytest.mark.slow  # ~15-20 s; keeps the default suite under 15 min
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
        n_seeds=16,
    )
    # Random play balances ~20 steps; 500 is the cap. At this aggressive step
    # size the seeds still oscillate: over 64 seeds 6 ended below 100 (worst
    # 51) and 16 below 200, so 16 seeds claim only a median and a low bar
    # well clear of random play.
    _assert_learned(_finals(result), median=150.0, low=40.0)


@pytest.mark.slow  # 120-140 s
def test_cartpole_learns_and_stays_learned_at_documented_setting():
    case = CASES["cartpole"]
    _, returns = curves(case, 16, SEED_OFFSET, {})
    # Natively, 32 seeds (0-15, 1000-1015) all ended at 500 and none fell
    # below 200 after reaching 400. With XLA's code generation capped at
    # SSE4.2, 31 of seeds 0-31 ended at 500; the other (seed 1) held 500 for
    # six evaluations, then fell to 39 and 29. Two more fell after one early 500,
    # the evaluation's kind of collapse that `held=2` leaves out. The bound
    # allows three seeds of sixteen.
    _assert_learned(returns[-1], median=450.0, low=400.0)
    collapses = collapsed_seeds(returns, case.reached, case.collapsed, held=2)
    assert collapses <= 3, returns.T
