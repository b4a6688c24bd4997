"""The stability guards: gradient clipping by default, the target-KL early stop,
value-loss clipping, and non-finite values that stop training by name."""

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import eqx_ppo
from eqx_ppo import envs, nn
from eqx_ppo.nn._module import StatefulModuleOutput, zero_loss
from eqx_ppo.ppo._guard import _problem
from eqx_ppo.ppo._loss import value_loss


def _count(state, kind) -> np.ndarray:
    """The step count of the optimiser's `kind` state: Adam's counts the updates
    applied, the learning-rate schedule's the updates the run has taken."""
    is_kind = lambda x: isinstance(x, kind)  # noqa: E731
    (found,) = [
        x for x in jax.tree.leaves(state.opt_state, is_leaf=is_kind) if is_kind(x)
    ]
    return np.asarray(found.count)


def _adam_count(state) -> np.ndarray:
    return _count(state, optax.ScaleByAdamState)


def _config(**kw):
    base = dict(n_envs=16, rollout_length=10, n_minibatches=4, n_epochs=4)
    return eqx_ppo.PPO(**{**base, **kw})


def _net(key):
    return eqx_ppo.make_mlp_actor_critic(2, 2, [16], [16], key=key)


ENV = envs.make("move_to_center")


def _step(config):
    key = jax.random.key(0)
    state = eqx_ppo.init(ENV, _net(key), config, key=key)
    return eqx.filter_jit(eqx_ppo.step)(ENV, config, state)


def test_defaults_clip_gradients_and_check_finite():
    config = eqx_ppo.PPO()
    assert config.gradient_clipping == 0.5
    assert config.check_finite
    assert config.target_kl is None and config.value_clip_range is None


@pytest.mark.slow  # ~15-20 s; keeps the default suite under 15 min
def test_target_kl_stops_the_epoch_loop_and_vmaps_without_recompiling():
    # 16 updates per iteration. A tiny target lets only the first through: its
    # minibatch is scored by the unchanged policy (KL ~ 0), every later one by
    # an updated policy.
    state, metrics = _step(_config(target_kl=1e-7))
    assert _adam_count(state) == 1
    assert _count(state, optax.ScaleByScheduleState) == 16
    np.testing.assert_allclose(metrics["losses/kl_stopped"], 15 / 16)
    state, metrics = _step(_config(target_kl=1e3))
    assert _adam_count(state) == 16
    assert float(metrics["losses/kl_stopped"]) == 0.0
    state, _ = _step(_config())
    assert _adam_count(state) == 16

    # A traced coefficient: one program serves every value, also under vmap.
    def one(target_kl):
        return _step(_config(target_kl=target_kl))[0]

    states = eqx.filter_vmap(one)(jnp.array([1e-7, 1e3]))
    np.testing.assert_array_equal(_adam_count(states), [1, 16])


def test_skipped_updates_still_advance_the_learning_rate_schedule():
    # One iteration of 4 updates (2 epochs x 2 minibatches); the tiny target
    # stops it early, yet the schedule reaches its end, as it would without
    # the early stop.
    config = eqx_ppo.PPO(
        n_envs=4,
        rollout_length=4,
        total_steps=16,
        n_minibatches=2,
        n_epochs=2,
        learning_rate=1e-2,
        lr_schedule="linear",
        target_kl=1e-7,
    )
    state, metrics = _step(config)
    assert 0 < float(metrics["losses/kl_stopped"]) < 1
    assert _adam_count(state) < 4
    assert _count(state, optax.ScaleByScheduleState) == config.n_updates == 4


def test_value_loss_by_hand():
    v = jnp.array([1.0, 2.0, 0.0])
    old = jnp.array([0.0, 2.5, 0.0])
    t = jnp.array([3.0, 2.0, -1.0])
    # Unclipped: 0.5 * mean([4, 0, 1]).
    np.testing.assert_allclose(value_loss(v, old, t, None), 5 / 6)
    # Clipped at 0.2: V_clip = [0.2, 2.3, 0.0]; squared errors [7.84, 0.09, 1],
    # the max with the unclipped [4, 0, 1] is [7.84, 0.09, 1].
    np.testing.assert_allclose(
        value_loss(v, old, t, jnp.array(0.2)), 0.5 * (7.84 + 0.09 + 1.0) / 3, rtol=1e-6
    )
    # A huge range changes nothing.
    np.testing.assert_allclose(value_loss(v, old, t, jnp.array(1e6)), 5 / 6)


def test_value_clip_range_reaches_the_loss():
    state_a, a = _step(_config(value_clip_range=1e6, n_epochs=1))
    state_b, b = _step(_config(value_clip_range=1e-6, n_epochs=1))
    # The first update of both sees unchanged values (identical losses up to
    # rounding); later ones see values that moved, and a near-zero clip range
    # scores them against the rollout's values instead.
    assert not np.allclose(a["losses/critic/mean"], b["losses/critic/mean"])


class _NaNEnv(eqx.Module):
    """move_to_center, with a non-finite observation or reward in one env."""

    what: str = eqx.field(static=True)
    bad_x: float = eqx.field(static=True, default=0.0)

    def reset(self, key):
        return ENV.reset(key)

    def step(self, state, action):
        out = ENV.step(state, action)
        bad = out.obs[0] > self.bad_x
        if self.what == "obs":
            return out.replace(obs=jnp.where(bad, jnp.inf, out.obs))
        return out.replace(reward=jnp.where(bad, jnp.nan, out.reward))

    observation_size = 2
    action_size = 2


def _train(env, network, n_seeds=1, **ppo):
    """Train 3 iterations, checkpointing after each; the steps checkpointed."""
    config = eqx_ppo.TrainConfig(
        learner=_config(total_steps=16 * 10 * 3, **ppo),
        eval=eqx_ppo.EvalConfig(enabled=False),
        n_seeds=n_seeds,
        checkpoint_every_steps=160,
        progress=False,
    )
    saved = []
    try:
        eqx_ppo.train(
            env, network, config, checkpoint_fn=lambda s, step: saved.append(step)
        )
    except FloatingPointError as e:
        # Only the initial state was checkpointed, before the bad iteration.
        assert saved == [0], saved
        raise e
    return saved


def test_nonfinite_observation_names_the_env_and_stops_before_checkpointing():
    with pytest.raises(
        FloatingPointError,
        match=r"Non-finite observation from env \d+, returned by env\.step at "
        r"iteration 1;.*Check the env",
    ):
        _train(_NaNEnv("obs", bad_x=0.5), _net)


def test_nonfinite_reward_names_the_env_and_seed():
    with pytest.raises(
        FloatingPointError,
        match=r"Non-finite reward from env \d+, returned by env\.step \(seed index "
        r"\d\) at iteration 1",
    ):
        _train(_NaNEnv("reward", bad_x=0.5), _net, n_seeds=2)


class _Kink(nn.AbstractStatefulModule):
    """Adds `0 * sqrt(|w - 1|)`: finite outputs, a NaN gradient at `w = 1`."""

    w: jax.Array

    def __call__(self, state, x, extras=None, *, key=None):
        return StatefulModuleOutput(
            (), x + 0.0 * jnp.sqrt(jnp.abs(self.w - 1.0)), zero_loss(), {}
        )


def _kinked(key):
    net = _net(key)
    value = net.layers[1].value
    return eqx.tree_at(
        lambda n: n.layers[1].value,
        net,
        nn.Sequential([*value.layers, _Kink(jnp.ones(()))]),
    )


def test_nonfinite_parameters_with_a_finite_loss_are_named():
    with pytest.raises(
        FloatingPointError,
        match=r"Non-finite optimiser update \(parameters or Adam state\) at "
        r"iteration 1;.*optimiser step",
    ):
        _train(ENV, _kinked, n_epochs=1, n_minibatches=1)


def test_nonfinite_loss_is_named():
    # Several updates: the first makes the parameters NaN, the next loss is NaN.
    with pytest.raises(
        FloatingPointError, match=r"Non-finite loss at iteration 1;.*diverged"
    ):
        _train(ENV, _kinked)


def _fix(what, learner):
    """The fix `_problem` gives for a non-finite loss or update with finite,
    moderate inputs."""
    flags = {
        "debug/obs_env": -1,
        "debug/obs_from_reset": False,
        "debug/reward_env": -1,
        "debug/obs_max": 1.0,
        "debug/reward_max": 1.0,
        "debug/finite_loss": what != "loss",
        "debug/finite_update": False,
    }
    return _problem(flags, learner)[1]


def test_the_nonfinite_fix_speaks_of_the_learners_own_settings():
    ppo = _fix("loss", eqx_ppo.PPO())
    assert ppo.endswith("keep `gradient_clipping` on, or set `target_kl`.")
    # Distillation has no target_kl, and no gradient clipping by default.
    teacher = eqx_ppo.make_mlp_actor_critic(2, 2, [4], [4], key=jax.random.key(0))
    distill = _fix("loss", eqx_ppo.Distillation(teacher))
    assert distill.endswith("lower `learning_rate`, set `gradient_clipping`.")
    unclipped = eqx_ppo.PPO(gradient_clipping=None)
    assert "set `gradient_clipping`." in _fix("parameters", unclipped)


def test_finite_run_logs_no_check_flags():
    logged = []
    config = eqx_ppo.TrainConfig(
        learner=_config(total_steps=320),
        eval=eqx_ppo.EvalConfig(enabled=False),
        progress=False,
    )
    eqx_ppo.train(ENV, _net, config, log_fn=lambda m, step: logged.append(m))
    assert len(logged) == 2 and "losses/actor/mean" in logged[0]
    assert not [k for m in logged for k in m if k.startswith("debug/")]


def test_check_finite_false_trains_on():
    saved = _train(_NaNEnv("reward", bad_x=0.5), _net, check_finite=False)
    assert saved == [0, 160, 320, 480]


class _Poisoned(eqx.Module):
    """move_to_center whose step `at_step` (counted by the env itself), or whose
    reset, returns a NaN (or `value`) observation in env 0's first entry."""

    at_step: int = eqx.field(static=True, default=-1)
    in_reset: bool = eqx.field(static=True, default=False)
    value: float = eqx.field(static=True, default=float("nan"))

    def reset(self, key):
        state = ENV.reset(key)
        state = state.replace(info={**state.info, "t": jnp.zeros((), jnp.int32)})
        if self.in_reset:
            return state.replace(obs=state.obs.at[0].set(self.value))
        return state

    def step(self, state, action):
        out = ENV.step(state, action)
        t = state.info["t"] + 1
        out = out.replace(info={**out.info, "t": t})
        return out.replace(
            obs=jnp.where(t == self.at_step, out.obs.at[0].set(self.value), out.obs)
        )

    observation_size = 2
    action_size = 2


def _tiny_run(env, tmp_path=None, **kw):
    """8 envs x 4 steps per iteration; the issue's reproduction. Returns the
    saved steps."""
    saved = []
    config = eqx_ppo.TrainConfig(
        learner=eqx_ppo.PPO(
            n_envs=8,
            rollout_length=4,
            total_steps=320,
            n_minibatches=2,
            n_epochs=1,
            **kw,
        ),
        eval=eqx_ppo.EvalConfig(enabled=False),
        checkpoint_every_steps=32,
        progress=False,
    )

    def checkpoint(state, step):
        assert all(
            np.isfinite(np.asarray(x)).all()
            for x in jax.tree.leaves(eqx.filter(state, eqx.is_inexact_array))
        ), f"non-finite state checkpointed at step {step}"
        saved.append(step)

    eqx_ppo.train(env, _net, config, checkpoint_fn=checkpoint)
    return saved


@pytest.mark.parametrize("at_step", [15, 16])
def test_a_nan_observation_is_named_also_on_the_rollouts_last_step(at_step):
    # Step 16 is the last of iteration 4, the observation the value bootstraps
    # from: it used to be blamed on the optimiser. (Episodes end at step 20.)
    with pytest.raises(
        FloatingPointError,
        match=r"Non-finite observation from env 0, returned by env\.step at "
        r"iteration 4;",
    ):
        _tiny_run(_Poisoned(at_step=at_step))


def test_a_nan_observation_from_reset_is_named_and_never_checkpointed():
    with pytest.raises(
        FloatingPointError,
        match=r"Non-finite observation from env\.reset at the start of the run "
        r"\(env 0\); training stopped before anything was checkpointed",
    ):
        _tiny_run(_Poisoned(in_reset=True))


def test_huge_finite_observations_are_named_as_an_overflow():
    with pytest.raises(
        FloatingPointError,
        match=r"Non-finite (loss|optimiser update).*observations are finite but "
        r"reach 1e\+25.*scale the env's observations down",
    ):
        _tiny_run(_Poisoned(at_step=3, value=1e25))


def test_a_huge_reward_scaling_is_named_as_an_overflow():
    with pytest.raises(
        FloatingPointError,
        match=r"rewards times reward_scaling reach .*e\+\d\d.*lower `reward_scaling`",
    ):
        _tiny_run(ENV, reward_scaling=1e30)


def test_an_overflowing_adam_state_stops_training():
    # No clipping and a huge rate: the parameters or Adam's second moments
    # overflow, and the Adam state is checked with the parameters.
    with pytest.raises(FloatingPointError, match=r"Non-finite (loss|optimiser update)"):
        _tiny_run(ENV, learning_rate=1e8, gradient_clipping=None)


def test_an_eval_env_returning_nan_stops_training():
    config = eqx_ppo.TrainConfig(
        learner=eqx_ppo.PPO(
            n_envs=8, rollout_length=4, total_steps=64, n_minibatches=2
        ),
        eval=eqx_ppo.EvalConfig(every_steps=32, n_envs=4, max_episode_length=5),
        progress=False,
    )
    with pytest.raises(
        FloatingPointError,
        match=r"Non-finite evaluation metrics.*eval env returned NaN",
    ):
        eqx_ppo.train(ENV, _net, config, eval_env=_NaNEnv("reward", bad_x=-2.0))


def test_resuming_a_decaying_schedule_with_another_total_is_refused():
    learner = eqx_ppo.PPO(
        n_envs=8,
        rollout_length=4,
        total_steps=64,
        n_minibatches=2,
        lr_schedule="linear",
    )
    config = eqx_ppo.TrainConfig(
        learner=learner, eval=eqx_ppo.EvalConfig(enabled=False), progress=False
    )
    state = eqx_ppo.train(ENV, _net, config).training_state
    longer = eqx_ppo.TrainConfig(
        learner=dataclasses.replace(learner, total_steps=128),
        eval=config.eval,
        progress=False,
    )
    with pytest.raises(
        ValueError, match=r"linear learning-rate schedule runs over 16 updates.*over 32"
    ):
        eqx_ppo.train(ENV, _net, longer, initial_state=state)


@pytest.mark.parametrize("seed", [2**32, -1])
def test_a_seed_beyond_32_bits_is_refused(seed):
    # jax.random.key(2**32) is jax.random.key(0): the runs were identical.
    with pytest.raises(ValueError, match=r"TrainConfig\(seed="):
        eqx_ppo.TrainConfig(seed=seed)
    with pytest.raises(ValueError, match=r"TrainConfig\(seed="):
        eqx_ppo.TrainConfig(seed=2**32 - 2, n_seeds=3)
