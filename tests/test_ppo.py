"""The PPO engine: rollout, auto-reset, replay, pure step, config, driver."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqx_ppo.nn as nn
from eqx_ppo import LoggingLevel, envs, gae, make_mlp_actor_critic
from eqx_ppo.envs import State
from eqx_ppo.nn._module import StatefulModuleOutput, zero_loss
from eqx_ppo.ppo import (
    PPO,
    EvalConfig,
    TrainConfig,
    init,
    replay,
    step,
    train,
)
from eqx_ppo.ppo._loss import ppo_loss
from eqx_ppo.ppo._rollout import SaveAt, StepCarry, Transition, run_episodes
from tests._helpers import assert_ulp_close


class RandomEndEnv(eqx.Module):
    """1-D obs; episodes end at random (p=0.25 per step), some by truncation.

    reward = -|action - obs|; the obs is the step count within the episode, so
    a carry that is reset out of step with the env shows up in the counts.
    """

    observation_size: int = 1
    action_size: int = 1

    def reset(self, key):
        return State(
            (key, jnp.zeros((), jnp.int32)),
            jnp.zeros((1,)),
            jnp.zeros(()),
            jnp.zeros(()),
            {"t": jnp.zeros(())},
            {"truncation": jnp.zeros(())},
        )

    def step(self, state, action):
        key, t = state.pipeline_state
        key, end_key, trunc_key = jax.random.split(key, 3)
        t = t + 1
        done = jax.random.bernoulli(end_key, 0.25)
        truncation = done & jax.random.bernoulli(trunc_key, 0.5)
        obs = t.astype(jnp.float32)[None]
        return State(
            (key, t),
            obs,
            -jnp.abs(action[0] - state.obs[0]),
            done.astype(jnp.float32),
            {"t": t.astype(jnp.float32)},
            {"truncation": truncation.astype(jnp.float32)},
        )


class NoisyCounter(nn.AbstractStatefulModule):
    """Carry = steps since reset; output = [x, count, noise]."""

    def initial_state(self):
        return jnp.zeros((), jnp.float32)

    def __call__(self, state, x, extras=None, *, key=None):
        noise = jax.random.normal(key, (1,))
        out = jnp.concatenate([x, state[None], noise])
        return StatefulModuleOutput(state + 1.0, out, zero_loss(), {"count": state})


def make_net(key, *, stateful=True):
    k1, k2 = jax.random.split(key)
    trunk = [NoisyCounter()] if stateful else []
    size = 3 if stateful else 1
    return nn.Sequential(
        trunk
        + [
            nn.PPOAdapter(
                action=nn.Sequential(
                    [
                        nn.Dense(size, 2, key=k1),
                        nn.NormalTanhSampler(entropy_weight=0.01),
                    ]
                ),
                value=nn.Dense(size, 1, key=k2),
            )
        ]
    )


def small_config(**kw):
    base = dict(
        n_envs=8,
        rollout_length=12,
        total_steps=8 * 12 * 3,
        n_minibatches=2,
        n_epochs=2,
        learning_rate=1e-3,
    )
    base.update(kw)
    return PPO(**base)


def _rollout(net, config, key):
    state = init(RandomEndEnv(), net, config, key=key)
    carry, steps = run_episodes(
        RandomEndEnv(),
        net,
        StepCarry(state.env_state, state.carry),
        key,
        length=config.rollout_length,
        reset=config.reset_mode,
        save=SaveAt(transitions=Transition._fields),
        starts=state.start_states,
    )
    return state, carry, steps.transitions


@pytest.mark.parametrize("reset_mode", ["cached", "fresh", "initial"])
def test_carry_resets_exactly_with_env(getkey, reset_mode):
    config = small_config(reset_mode=reset_mode)
    net = make_net(getkey())
    _, _, data = _rollout(net, config, getkey())
    # The env's obs is its step count; the counter layer's carry must match it
    # at every step of every env, across many episode boundaries.
    count = data.net_metrics[0]["count"]
    np.testing.assert_array_equal(np.asarray(count), np.asarray(data.obs[..., 0]))
    assert int(data.done.sum()) > 5
    assert bool(jnp.all(data.truncated <= data.done))


def test_terminal_obs_is_pre_reset(getkey):
    config = small_config()
    _, _, data = _rollout(make_net(getkey()), config, getkey())
    # Terminal obs is the count reached (>=1) even on done steps, where the
    # next obs the network sees is the reset 0.
    assert bool(jnp.all(data.terminal_obs[..., 0] >= 1))
    after_done = data.obs[1:][data.done[:-1]]
    assert bool(jnp.all(after_done == 0))


@pytest.mark.parametrize("stateful", [True, False])
def test_replay_reproduces_rollout(getkey, stateful):
    config = small_config()
    net = make_net(getkey(), stateful=stateful)
    state, carry, data = _rollout(net, config, getkey())
    rep = replay(
        net,
        state.carry,
        data,
        carry.env_state.obs,
        bootstrap_truncation=False,
    )
    # Same keys, carries and parameters, but the replay runs the stateless
    # layers once over all T * M steps and the rollout once per step: other
    # op shapes, so equal up to float rounding, not bit for bit.
    assert_ulp_close(rep.output, data.output)


def test_replay_of_env_subset_equals_slice_of_full_replay(getkey):
    config = small_config()
    net = make_net(getkey())
    state, carry, data = _rollout(net, config, getkey())
    full = replay(
        net,
        state.carry,
        data,
        carry.env_state.obs,
        bootstrap_truncation=True,
    )
    idx = jnp.array([5, 2, 7])
    sliced = jax.tree.map(lambda x: x[:, idx], data)
    sub = replay(
        net,
        jax.tree.map(lambda x: x[idx], state.carry),
        sliced,
        carry.env_state.obs[idx],
        bootstrap_truncation=True,
    )
    # Same noise and carries; only matmul batch sizes differ (float rounding).
    assert_ulp_close(
        (sub.output, sub.next_values),
        jax.tree.map(lambda x: x[:, idx], (full.output, full.next_values)),
    )


def test_bootstrap_uses_terminal_value(getkey):
    config = small_config()
    net = make_net(getkey())
    state, carry, data = _rollout(net, config, getkey())
    drop = replay(
        net,
        state.carry,
        data,
        carry.env_state.obs,
        bootstrap_truncation=False,
    )
    boot = replay(
        net,
        state.carry,
        data,
        carry.env_state.obs,
        bootstrap_truncation=True,
    )
    # With a carry, `boot` scans the whole network step by step (for the
    # terminal values) and `drop` replays it layer by layer: other programs.
    same, truncated = ~data.truncated, data.truncated
    assert_ulp_close(drop.next_values[same], boot.next_values[same])
    with pytest.raises(AssertionError):
        assert_ulp_close(drop.next_values[truncated], boot.next_values[truncated])


def test_critic_r2_is_the_explained_variance_whatever_the_value_clip(getkey):
    level = LoggingLevel.LOSSES | LoggingLevel.CRITIC_EXTRA
    config = small_config(logging_level=level)
    net = make_net(getkey())
    state, carry, data = _rollout(net, config, getkey())
    # Rollout values 1 off, so a value clip changes the critic loss.
    data = data._replace(
        output=data.output._replace(value_estimates=data.output.value_estimates + 1.0)
    )
    rep = replay(
        net, state.carry, data, carry.env_state.obs, bootstrap_truncation=False
    )
    values = np.asarray(rep.output.value_estimates, np.float64)
    advantages = gae(
        data.reward,
        rep.output.value_estimates,
        rep.next_values,
        data.done,
        data.truncated,
        gamma=config.discounting_factor,
        lambda_=config.gae_lambda,
    )
    targets = values + np.asarray(advantages, np.float64)
    expected = 1.0 - np.mean((values - targets) ** 2) / np.var(targets)

    unclipped, clipped = (
        ppo_loss(
            net,
            state.carry,
            data,
            carry.env_state.obs,
            small_config(logging_level=level, value_clip_range=clip),
        )[1]
        for clip in (None, 0.1)
    )
    assert float(unclipped["losses/critic"]) < float(clipped["losses/critic"])
    for metrics in (unclipped, clipped):
        np.testing.assert_allclose(metrics["losses/critic_R^2"], expected, rtol=1e-5)


def test_step_compiles_once_and_coefficients_do_not_retrace(getkey):
    env = RandomEndEnv()
    net = make_net(getkey())

    @eqx.filter_jit
    @eqx.debug.assert_max_traces(max_traces=1)
    def once(config, state):
        return step(env, config, state)

    config = small_config()
    state = init(env, net, config, key=getkey())
    state, m1 = once(config, state)
    state, m2 = once(small_config(learning_rate=3e-4, clip_range=0.1), state)
    assert int(state.iteration) == 2
    assert int(state.steps) == 2 * config.steps_per_iteration
    assert np.isfinite(float(m2["losses/actor/mean"]))


@pytest.mark.parametrize("reset_mode", ["cached", "initial"])
def test_initial_reset_mode_keeps_the_start_states_and_compiles_no_reset(
    getkey, reset_mode
):
    """`reset_mode="initial"` (Brax's auto-reset) restarts envs from the states
    `init` drew, kept in the state, so the step's program holds no
    `env.reset` (no call of the jitted reset): what makes it compile faster."""
    env, config = RandomEndEnv(), small_config(reset_mode=reset_mode)
    state = init(env, make_net(getkey()), config, key=getkey())
    assert (state.start_states is None) == (reset_mode == "cached")
    program = eqx.filter_make_jaxpr(lambda s: step(env, config, s))(state)[0]
    assert str(program).count("name=reset_one\n") == (reset_mode == "cached")
    new, _ = eqx.filter_jit(step)(env, config, state)
    if reset_mode == "initial":
        assert eqx.tree_equal(new.start_states, state.env_state)


@pytest.mark.parametrize(
    "built, stepped", [("cached", "initial"), ("initial", "fresh")]
)
def test_a_state_stepped_with_another_reset_mode_is_refused(getkey, built, stepped):
    env, net = RandomEndEnv(), make_net(getkey())
    state = init(env, net, small_config(reset_mode=built), key=getkey())
    with pytest.raises(ValueError, match=f"reset_mode='{stepped}'.*built for"):
        step(env, small_config(reset_mode=stepped), state)


def test_vmap_over_learning_rate_equals_separate_runs(getkey):
    env = RandomEndEnv()
    net = make_net(getkey())
    key = getkey()
    lrs = jnp.array([1e-3, 1e-2])

    def run(lr):
        config = small_config(learning_rate=lr)
        state = init(env, net, config, key=key)
        return step(env, config, state)[0].network

    batched = eqx.filter_jit(eqx.filter_vmap(run))(lrs)
    for i, lr in enumerate(lrs):
        single = eqx.filter_jit(run)(lr)
        for a, b in zip(
            jax.tree.leaves(eqx.filter(batched, eqx.is_array)),
            jax.tree.leaves(eqx.filter(single, eqx.is_array)),
            strict=True,
        ):
            np.testing.assert_allclose(a[i], b, rtol=1e-5, atol=1e-6)


def test_statistics_are_not_trained_but_updated(getkey):
    env = RandomEndEnv()
    k1, k2 = jax.random.split(getkey())
    net = nn.Sequential([nn.Normalizer(1), make_net(k1, stateful=False)])
    config = small_config()
    state = init(env, net, config, key=k2)
    new, _ = eqx.filter_jit(step)(env, config, state)
    # The optimiser state covers only trainable leaves: no statistics in it.
    # Adam runs on all parameters flattened into one vector: mu and nu hold
    # exactly the trainable entries.
    n_params = sum(x.size for x in jax.tree.leaves(eqx.filter(net, nn.trainable(net))))
    n_arrays = sum(x.size for x in jax.tree.leaves(eqx.filter(net, eqx.is_array)))
    adam = next(s for s in state.opt_state if hasattr(s, "mu"))
    assert adam.mu.shape == adam.nu.shape == (n_params,)
    assert n_params < n_arrays  # the normaliser's statistics are left out
    # Statistics changed only through update_statistics: the normaliser now
    # holds the rollout's observation count (n_envs * rollout_length samples).
    assert float(state.network.layers[0].statistics.count) == 0.0
    assert float(new.network.layers[0].statistics.count) == config.steps_per_iteration


@pytest.mark.slow  # ~15-20 s; keeps the default suite under 15 min
def test_train_multi_seed_equals_single_runs(getkey):
    config = TrainConfig(
        learner=small_config(),
        eval=EvalConfig(every_steps=10**6, n_envs=4, max_episode_length=8),
        seed=3,
        n_seeds=2,
        progress=False,
    )
    multi = train(RandomEndEnv(), make_net, config)
    assert multi.total_steps == 3 * 96
    assert len(multi.eval_history[-1]["eval/episode_reward/mean"]) == 2
    for i in range(2):
        single = train(
            RandomEndEnv(),
            make_net,
            TrainConfig(
                learner=config.learner, eval=config.eval, seed=3 + i, progress=False
            ),
        )
        for a, b in zip(
            jax.tree.leaves(eqx.filter(multi.training_state.network, eqx.is_array)),
            jax.tree.leaves(eqx.filter(single.training_state.network, eqx.is_array)),
            strict=True,
        ):
            np.testing.assert_allclose(a[i], b, rtol=1e-5, atol=1e-6)
        assert multi.eval_history[-1]["eval/episode_reward/mean"][i] == pytest.approx(
            single.eval_history[-1]["eval/episode_reward/mean"], rel=1e-5, abs=1e-5
        )


def test_driver_calls_events_at_their_cadence(getkey):
    logged, saved = [], []
    config = TrainConfig(
        learner=small_config(total_steps=96 * 7),
        eval=EvalConfig(every_steps=96 * 3, n_envs=4, max_episode_length=8),
        checkpoint_every_steps=96 * 2,
        progress=False,
    )
    result = train(
        RandomEndEnv(),
        make_net,
        config,
        log_fn=lambda m, s: logged.append(s),
        checkpoint_fn=lambda st, s: saved.append(s),
    )
    assert logged == [0] + [96 * i for i in range(1, 8)]
    assert saved == [0, 192, 384, 576, 672]
    assert [e["step"] for e in result.eval_history] == [0, 288, 576, 672]
    assert result.total_iterations == 7


def test_config_errors():
    with pytest.raises(ValueError, match="n_envs must be divisible by n_minibatches"):
        PPO(n_envs=10, n_minibatches=4)
    with pytest.raises(ValueError, match="discounting_factor"):
        PPO(discounting_factor=1.5)
    # Under the test suite's runtime type checker the Literal hint fires first.
    with pytest.raises((ValueError, TypeError), match="truncation"):
        PPO(truncation="ignore")
    with pytest.raises(ValueError, match="n_envs"):
        PPO(n_envs=0)


def test_a_state_the_step_cannot_take_is_named(getkey):
    env = envs.make("move_to_center")
    config = small_config(n_envs=4)
    jitted = eqx.filter_jit(step)

    def fresh(key, config=config):
        return init(
            env, make_mlp_actor_critic(2, 2, [4], [4], key=key), config, key=key
        )

    state = fresh(getkey())
    # Three seeds, and as many seeds as envs (once a key-split error).
    for n_seeds in (3, 4):
        stacked = eqx.filter_vmap(fresh)(jax.random.split(getkey(), n_seeds))
        with pytest.raises(ValueError, match=rf"of {n_seeds} seeds.*select_seed"):
            jitted(env, config, stacked)
    with pytest.raises(TypeError, match=r"parameter .?state"):
        jitted(env, config, jitted(env, config, state))
    for other in (
        small_config(n_envs=4, gradient_clipping=None),
        small_config(n_envs=4, weight_decay=0.1),
    ):
        with pytest.raises(ValueError, match="optimiser state is not the one"):
            jitted(env, other, state)
    # The state's own config passes, as does one that only logs differently.
    jitted(env, small_config(n_envs=4, logging_level=LoggingLevel.NONE), state)


def test_value_structure_mismatch_is_reported(getkey):
    class DictRewardEnv(RandomEndEnv):
        def step(self, state, action):
            s = super().step(state, action)
            return s.replace(reward={"a": s.reward, "b": s.reward})

        def reset(self, key):
            s = super().reset(key)
            return s.replace(reward={"a": s.reward, "b": s.reward})

    with pytest.raises(ValueError, match="one value head per reward key"):
        init(DictRewardEnv(), make_net(getkey()), small_config(), key=getkey())
        eqx.filter_jit(step)(
            DictRewardEnv(),
            small_config(),
            init(DictRewardEnv(), make_net(getkey()), small_config(), key=getkey()),
        )


def test_non_finite_loss_stops_training_naming_the_iteration(getkey):
    class NaNEnv(RandomEndEnv):
        def step(self, state, action):
            s = super().step(state, action)
            return s.replace(reward=s.reward * jnp.nan)

    saved = []
    config = TrainConfig(
        learner=small_config(check_finite=True),
        eval=EvalConfig(enabled=False),
        progress=False,
    )
    with pytest.raises(FloatingPointError, match="iteration 1"):
        train(NaNEnv(), make_net, config, checkpoint_fn=lambda s, t: saved.append(t))
    assert saved == [0]


@pytest.mark.parametrize("action_size", [1, 3])
def test_action_size_mismatch_is_reported_at_trace_time(getkey, action_size):
    env = envs.make("move_to_center")
    net = make_mlp_actor_critic(2, action_size, [8], [8], key=getkey())
    config = small_config(n_envs=4, n_minibatches=1)
    state = init(env, net, config, key=getkey())
    with pytest.raises(ValueError, match="env.action_size: 2") as info:
        eqx.filter_jit(step)(env, config, state)
    assert f"({action_size},)" in str(info.value)


def test_dict_actions_pass_the_action_check(getkey):
    env = envs.make("dict_obs_act")
    net = make_mlp_actor_critic(
        env.observation_size, env.action_size, [8], [8], key=getkey()
    )
    config = small_config(n_envs=4, n_minibatches=1)
    state, _ = eqx.filter_jit(step)(env, config, init(env, net, config, key=getkey()))
    assert int(state.iteration) == 1


def test_a_scan_of_step_vmaps_over_the_learning_rate(getkey):
    env = RandomEndEnv()
    net = make_net(getkey())
    key = getkey()

    def whole_run(lr):
        config = small_config(learning_rate=lr)
        dynamic, static = eqx.partition(init(env, net, config, key=key), eqx.is_array)

        def body(d, _):
            new, metrics = step(env, config, eqx.combine(d, static))
            return eqx.filter(new, eqx.is_array), metrics

        dynamic, metrics = jax.lax.scan(body, dynamic, length=2)
        return eqx.combine(dynamic, static), metrics

    lrs = jnp.array([1e-3, 1e-2])
    states, metrics = eqx.filter_jit(eqx.filter_vmap(whole_run))(lrs)
    assert metrics["losses/actor/mean"].shape == (2, 2)
    config = small_config(learning_rate=lrs[1])
    state = init(env, net, config, key=key)
    jitted = eqx.filter_jit(step)
    for _ in range(2):
        state, last = jitted(env, config, state)
    np.testing.assert_allclose(
        metrics["losses/actor/mean"][1, -1],
        last["losses/actor/mean"],
        rtol=1e-5,
        atol=1e-7,
    )
    for a, b in zip(
        jax.tree.leaves(eqx.filter(states.network, eqx.is_array)),
        jax.tree.leaves(eqx.filter(state.network, eqx.is_array)),
        strict=True,
    ):
        np.testing.assert_allclose(a[1], b, rtol=1e-5, atol=1e-6)


def test_layerwise_replay_equals_a_stepwise_scan(getkey):
    # A recurrent net with a stochastic layer (keys) inside a recurrent port and
    # carries in both ports: the replay runs the stateless layers over all
    # steps at once and scans only the LSTMs; a plain scan of the whole network
    # over time, resetting on done, is the reference.
    from eqx_ppo.ppo._rollout import apply_network, reset_carry

    k = jax.random.split(getkey(), 8)
    actor = nn.Sequential(
        [
            nn.LSTM(3, 8, key=k[0]),
            nn.VariationalBottleneck(8, 4, key=k[1], kl_weight=0.1),
            nn.Dense(4, 4, key=k[2]),
            nn.NormalTanhSampler(0.01),
        ]
    )
    critic = nn.Sequential(
        [nn.Dense(3, 8, key=k[3]), nn.LSTM(8, 8, key=k[4]), nn.Dense(8, 1, key=k[5])]
    )
    net = nn.Sequential([nn.Normalizer(3), nn.PPOAdapter(action=actor, value=critic)])
    length, n = 7, 5
    obs = jax.random.normal(k[6], (length, n, 3))
    done = jax.random.bernoulli(k[7], 0.3, (length, n))
    keys = jax.random.split(getkey(), (length, n))
    state0 = jax.tree.map(
        lambda x: x + 0.1, net.initialize_state(n)
    )  # a non-initial carry

    def scan(extras):
        def step(carry, xs):
            o, e, kk, d = xs
            out = apply_network(net, carry, o, e, kk)
            next_carry = reset_carry(net, d, out.next_state)
            return next_carry, (out.output, out.regularization_loss, out.extras)

        return jax.lax.scan(step, state0, (obs, extras, keys, done))

    _, (_, _, extras) = scan(None)
    ref_last, (ref_out, ref_reg, _) = scan(extras)
    last, out, reg = eqx.filter_jit(net.replay)(state0, obs, extras, keys, done)
    assert_ulp_close((out, reg, last), (ref_out, ref_reg, ref_last))
    assert float(jnp.std(reg)) > 0  # the KL term varies per step and env
