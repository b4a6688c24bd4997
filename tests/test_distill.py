"""Distillation: the student learns the teacher's actions; the teacher never changes."""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqx_ppo
import eqx_ppo.nn as nn
from eqx_ppo import Distillation
from eqx_ppo.envs import State
from eqx_ppo.ppo import EvalConfig
from tests._helpers import rtol


class ConstantEnv(eqx.Module):
    """Always observes `[1, -0.5]`; episodes never end."""

    observation_size: int = 2
    action_size: int = 2

    def reset(self, key):
        del key
        return State((), jnp.array([1.0, -0.5]), jnp.zeros(()), jnp.zeros(()))

    def step(self, state, action):
        del action
        return state


def mlp(key, *, normalize_obs=False, hidden=(16,), action_size=2):
    return eqx_ppo.make_mlp_actor_critic(
        2, action_size, hidden, hidden, key=key, normalize_obs=normalize_obs
    )


def config(teacher, **kw):
    base = dict(
        n_envs=8,
        rollout_length=8,
        total_steps=8 * 8 * 40,
        n_epochs=2,
        n_minibatches=2,
        learning_rate=3e-3,
    )
    base.update(kw)
    return eqx_ppo.TrainConfig(
        learner=Distillation(teacher, **base),
        eval=EvalConfig(enabled=False),
        progress=False,
        seed=4,
    )


def deterministic_actions(network, obs):
    """Inference-mode actions of a feed-forward network on a batch of obs."""
    net = eqx.nn.inference_mode(network)
    state = net.initialize_state(obs.shape[0])
    return nn.apply_batched(net, state, obs).output.actions


def rollout_actions(env, teacher, student, key, *, n_envs=32, length=12):
    """Deterministic actions `[T, N, A]` of both networks on teacher-driven episodes.

    Both step on the same observations with their own carries, so a recurrent
    student must carry what the teacher carries.
    """
    teacher, student = eqx.nn.inference_mode(teacher), eqx.nn.inference_mode(student)
    env_state = jax.vmap(env.reset)(jax.random.split(key, n_envs))

    def step(carry, _):
        env_state, t_state, s_state = carry
        t_out = nn.apply_batched(teacher, t_state, env_state.obs)
        s_out = nn.apply_batched(student, s_state, env_state.obs)
        next_env = jax.vmap(env.step)(env_state, t_out.output.actions)
        return (next_env, t_out.next_state, s_out.next_state), (
            t_out.output.actions,
            s_out.output.actions,
        )

    init = (
        env_state,
        teacher.initialize_state(n_envs),
        student.initialize_state(n_envs),
    )
    _, actions = jax.lax.scan(step, init, None, length=length)
    return actions


def action_gap(env, teacher, student, key, **kw):
    """Mean |student - teacher| deterministic action over teacher-driven episodes."""
    t, s = rollout_actions(env, teacher, student, key, **kw)
    return float(jnp.mean(jnp.abs(t - s)))


def arrays(tree):
    return jax.tree.leaves(eqx.filter(tree, eqx.is_array))


def test_loss_is_nll_of_teachers_raw_action(getkey):
    # On a constant observation the student's Gaussian (mu, sigma) and the
    # teacher's pre-tanh mean m are fixed, so the logged NLL must be
    #   -sum_i [log N(m_i; mu_i, sigma_i) - log(1 - tanh(m_i)^2)].
    # With learning_rate=0 every minibatch sees the same parameters.
    env = ConstantEnv()
    teacher, student = mlp(getkey()), mlp(getkey())
    learner = config(teacher, learning_rate=0.0).learner
    state = eqx_ppo.init(env, student, learner, key=getkey())
    new, metrics = eqx.filter_jit(eqx_ppo.step)(env, learner, state)

    obs = jnp.array([[1.0, -0.5]])
    t_metrics = nn.apply_batched(
        eqx.nn.inference_mode(teacher), teacher.initialize_state(1), obs
    ).metrics
    s_metrics = nn.apply_batched(
        student, student.initialize_state(1), obs, key=getkey()
    ).metrics
    # Sequential([PPOAdapter(action=Sequential([Dense, Dense, sampler]), ...)])
    m = np.asarray(t_metrics[0]["action"][2]["mu"][0], np.float64)
    mu = np.asarray(s_metrics[0]["action"][2]["mu"][0], np.float64)
    sigma = np.asarray(s_metrics[0]["action"][2]["sigma"][0], np.float64)
    log_normal = (
        -0.5 * ((m - mu) / sigma) ** 2 - np.log(sigma) - 0.5 * math.log(2 * math.pi)
    )
    log_det = np.log(1.0 - np.tanh(m) ** 2)
    expected = -np.sum(log_normal - log_det)
    np.testing.assert_allclose(
        float(metrics["losses/distillation_nll/mean"]), expected, rtol=rtol(1e-5)
    )
    assert float(metrics["losses/distillation_nll/std"]) < 1e-5
    for a, b in zip(arrays(new.network), arrays(student), strict=True):
        np.testing.assert_array_equal(a, b)


def test_teacher_untouched_student_trained_and_statistics_updated(getkey):
    env = eqx_ppo.envs.make("move_to_center")
    teacher = mlp(getkey(), normalize_obs=True)
    before = jax.tree.map(lambda x: np.array(x) if eqx.is_array(x) else x, teacher)
    cfg = config(teacher, total_steps=8 * 8 * 2)
    student = mlp(getkey(), normalize_obs=True)
    result = eqx_ppo.train(env, student, cfg)
    assert bool(eqx.tree_equal(teacher, before))
    trained = result.training_state.network
    assert not np.array_equal(
        trained.layers[1].action.layers[0].kernel,
        student.layers[1].action.layers[0].kernel,
    )
    # The student's normaliser saw both rollouts (2 * n_envs * T samples);
    # the teacher's, never updated, still has its initial count.
    assert float(trained.layers[0].statistics.count) == pytest.approx(
        float(student.layers[0].statistics.count) + 2 * 8 * 8
    )
    assert float(teacher.layers[0].statistics.count) == float(
        before.layers[0].statistics.count
    )
    assert result.total_steps == 2 * 64


def test_student_converges_to_teacher(getkey):
    # The student has a normaliser and a different width: only sampler extras
    # are exchanged, so its structure may differ from the teacher's.
    env = eqx_ppo.envs.make("move_to_center")
    teacher = mlp(getkey(), hidden=(16,))
    student = mlp(getkey(), hidden=(32,), normalize_obs=True)
    probe_key = getkey()
    gap_before = action_gap(env, teacher, student, probe_key)
    logs = []
    # 120 iterations: at 40, 4 of 12 seeds still had gap_after > 0.25 * gap_before.
    result = eqx_ppo.train(
        env,
        student,
        config(teacher, total_steps=8 * 8 * 120),
        log_fn=lambda m, s: logs.append(m),
    )
    gap_after = action_gap(env, teacher, result.training_state.network, probe_key)
    assert gap_before > 0.2
    assert gap_after < 0.25 * gap_before
    nll = [m["losses/distillation_nll/mean"] for m in logs]
    assert nll[-1] < nll[0] - 1.0


def test_recurrent_teacher_into_recurrent_student(getkey):
    # Recall shows a cue only at t=0; later observations are the same in every
    # env, so any spread of the teacher's actions across envs at t >= 1 comes
    # from what its LSTM carries. The student must learn to carry it too.
    env = eqx_ppo.envs.make("recall")

    def lstm(key, size, scale):
        return eqx_ppo.make_lstm_actor_critic(
            2, 1, size, key=key, normalize_obs=False, initializer_scale=scale
        )

    # Larger initial weights make the random teacher lean on its memory.
    teacher = lstm(getkey(), 8, 3.0)
    student = lstm(getkey(), 16, 1.0)
    probe_key = getkey()
    before_t, before_s = rollout_actions(env, teacher, student, probe_key, length=5)
    result = eqx_ppo.train(
        env, student, config(teacher, rollout_length=10, total_steps=8 * 10 * 60)
    )
    after_t, after_s = rollout_actions(
        env, teacher, result.training_state.network, probe_key, length=5
    )
    np.testing.assert_array_equal(after_t, before_t)
    memory_signal = float(jnp.mean(jnp.std(before_t[1:], axis=1)))
    gap_before = float(jnp.mean(jnp.abs(before_t[1:] - before_s[1:])))
    gap_after = float(jnp.mean(jnp.abs(after_t[1:] - after_s[1:])))
    assert memory_signal > 0.02
    assert gap_after < 0.25 * min(gap_before, memory_signal)


def test_structure_mismatch_is_a_clear_error(getkey):
    env = eqx_ppo.envs.make("move_to_center")
    teacher = mlp(getkey())
    learner = config(teacher).learner
    with pytest.raises(ValueError, match="actions differ"):
        eqx_ppo.init(env, mlp(getkey(), action_size=3), learner, key=getkey())

    k1, k2 = jax.random.split(getkey())
    gaussian = nn.PPOAdapter(
        action=nn.Sequential([nn.Dense(2, 4, key=k1), eqx_ppo.NormalSampler(0.0)]),
        value=nn.Dense(2, 1, key=k2),
    )
    with pytest.raises(ValueError, match="samplers differ"):
        eqx_ppo.init(env, gaussian, learner, key=getkey())

    with pytest.raises(TypeError, match="PPONetworkOutput"):
        eqx_ppo.init(env, nn.Dense(2, 4, key=k1), learner, key=getkey())


@pytest.mark.parametrize("n_logits", [3, 5])
def test_student_must_have_the_teachers_number_of_actions(getkey, n_logits):
    def discrete(key, n_actions=4):
        return eqx_ppo.make_mlp_actor_critic(
            5, n_actions, [8], [8], discrete=True, key=key
        )

    env = eqx_ppo.envs.make("repeat_first")  # n_actions=4
    with pytest.raises(
        ValueError,
        match=r"(?s)samplers differ.*teacher samplers \(kind, replay extras\): "
        r"\[\('CategoricalSampler\(n_actions=4\)'.*student samplers \(kind, replay "
        rf"extras\): \[\('CategoricalSampler\(n_actions={n_logits}\)'",
    ):
        eqx_ppo.train(
            env,
            lambda key: discrete(key, n_logits),
            config(
                discrete(getkey()),
                n_envs=2,
                rollout_length=4,
                total_steps=8,
                n_minibatches=1,
            ),
        )


def test_config_errors(getkey):
    teacher = mlp(getkey())
    with pytest.raises(ValueError, match="divisible by n_minibatches"):
        Distillation(teacher, n_envs=10, n_minibatches=4)
    with pytest.raises(ValueError, match="learning_rate"):
        Distillation(teacher, learning_rate=-1.0)
    with pytest.raises(TypeError, match="lr_schedule"):
        Distillation(teacher, lr_schedule="step")
    with pytest.raises(TypeError, match="positional argument"):
        Distillation(teacher, 64)
    assert Distillation(teacher, n_envs=64).n_envs == 64
    assert Distillation(teacher).gradient_clipping is None


@pytest.mark.parametrize("learner", ["PPO", "Distillation"])
def test_iteration_settings_are_checked_alike(getkey, learner):
    teacher = mlp(getkey())
    build = (
        eqx_ppo.PPO if learner == "PPO" else lambda **kw: Distillation(teacher, **kw)
    )
    with pytest.raises(TypeError, match="n_envs"):
        build(n_envs=True)
    with pytest.raises(ValueError, match=rf"{learner}\(n_envs=10.*e\.g\. n_envs=8"):
        build(n_envs=10, n_minibatches=4)
    with pytest.raises(ValueError, match=rf"{learner}\(weight_decay=-1.0\): must be"):
        build(weight_decay=-1.0)
    with pytest.raises(TypeError, match="reset_mode"):
        build(reset_mode="never")


def test_a_multi_seed_or_non_finite_teacher_is_named(getkey):
    env = eqx_ppo.envs.make("move_to_center")
    two_seeds = eqx.filter_vmap(mlp)(jax.random.split(getkey(), 2))
    with pytest.raises(
        (ValueError, TypeError), match=r"`teacher` has a leading axis of 2"
    ):
        eqx_ppo.train(env, mlp, config(two_seeds))
    with pytest.raises(
        (ValueError, TypeError), match=r"`networks` has a leading axis of 2"
    ):
        eqx_ppo.train(env, two_seeds, config(mlp(getkey())))

    teacher = mlp(getkey())
    kernel = lambda t: t.layers[0].action.layers[-2].kernel  # noqa: E731
    diverged = eqx.tree_at(kernel, teacher, kernel(teacher).at[0, 0].set(jnp.nan))
    with pytest.raises(
        ValueError, match=r"Distillation\(teacher=...\): .*NaN or inf \(teacher"
    ):
        config(diverged)


@pytest.mark.parametrize("who", ["teacher", "student"])
def test_an_observation_mismatch_names_the_network(getkey, who):
    env = eqx_ppo.envs.make("move_to_center")  # observations of size 2
    networks = {"teacher": mlp(getkey()), "student": mlp(getkey())}
    networks[who] = eqx_ppo.make_mlp_actor_critic(3, 2, [8], [8], key=getkey())
    with pytest.raises(ValueError, match=rf"Distillation: the {who} cannot take"):
        eqx_ppo.init(
            env, networks["student"], config(networks["teacher"]).learner, key=getkey()
        )


def test_step_names_a_state_of_another_teacher(getkey):
    env = eqx_ppo.envs.make("move_to_center")
    lstm = eqx_ppo.make_lstm_actor_critic(2, 2, 8, key=getkey())

    def learner(teacher):
        return config(teacher, n_envs=4, n_minibatches=1).learner

    state = eqx_ppo.init(env, mlp(getkey()), learner(lstm), key=getkey())
    with pytest.raises(ValueError, match=r"step\(state=...\): .*another distillation"):
        eqx_ppo.step(env, learner(mlp(getkey())), state)
    wider = eqx_ppo.make_lstm_actor_critic(2, 2, 16, key=getkey())
    with pytest.raises(ValueError, match="another network or learner"):
        eqx_ppo.step(env, learner(wider), state)
    ppo_state = eqx_ppo.init(
        env, mlp(getkey()), eqx_ppo.PPO(n_envs=4, n_minibatches=1), key=getkey()
    )
    with pytest.raises(ValueError, match="built with another learner"):
        eqx_ppo.step(env, learner(lstm), ppo_state)
    # The state's own teacher passes, also inside a vmap over seeds.
    states = eqx.filter_vmap(lambda k: eqx_ppo.init(env, mlp(k), learner(lstm), key=k))(
        jax.random.split(getkey(), 2)
    )
    eqx.filter_vmap(lambda s: eqx_ppo.step(env, learner(lstm), s))(states)
