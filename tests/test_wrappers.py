"""EpisodeWrapper and RewardScalingWrapper: flags, scaling, forwarding."""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from eqx_ppo.envs import AbstractWrapper, EpisodeWrapper, RewardScalingWrapper
from eqx_ppo.envs._counter import Counter
from eqx_ppo.envs._move_to_center import MoveToCenter
from eqx_ppo.envs._parrot import Parrot
from eqx_ppo.envs._pendulum import Pendulum
from eqx_ppo.envs._recall import Recall
from eqx_ppo.envs._two_arm import TwoArm


def steps(step, state, actions):
    """Apply `step` for each of `actions`, returning every post-step state."""
    out = []
    for action in actions:
        state = step(state, action)
        out.append(state)
    return out


def column(states, get):
    return [float(get(s)) for s in states]


# EpisodeWrapper.


def test_truncates_at_max_len(getkey):
    env = EpisodeWrapper(Parrot(), max_len=3)
    state = env.reset(getkey())
    assert state.info["steps"] == 0 and state.info["steps"].dtype == jnp.int32
    assert state.info["truncation"] == 0.0
    states = steps(env.step, state, [jnp.zeros(3)] * 4)
    assert column(states, lambda s: s.info["steps"]) == [1, 2, 3, 4]
    assert column(states, lambda s: s.done) == [0.0, 0.0, 1.0, 1.0]
    assert column(states, lambda s: s.info["truncation"]) == [0.0, 0.0, 1.0, 1.0]
    assert states[0].info["truncation"].dtype == states[0].done.dtype


def test_termination_is_not_truncation(getkey):
    # Counter(3, 3) terminates on step 3.
    counter = Counter(min_length=3, max_length=3)
    # Limit later than the end: done from the env, no truncation.
    late = EpisodeWrapper(counter, max_len=5)
    states = steps(late.step, late.reset(getkey()), [jnp.zeros(1)] * 3)
    assert column(states, lambda s: s.done) == [0.0, 0.0, 1.0]
    assert column(states, lambda s: s.info["truncation"]) == [0.0, 0.0, 0.0]
    # Both on the same step: termination wins (a terminal state has no value).
    same = EpisodeWrapper(counter, max_len=3)
    states = steps(same.step, same.reset(getkey()), [jnp.zeros(1)] * 3)
    assert column(states, lambda s: s.info["truncation"]) == [0.0, 0.0, 0.0]
    # Limit first: truncated on step 2.
    early = EpisodeWrapper(counter, max_len=2)
    states = steps(early.step, early.reset(getkey()), [jnp.zeros(1)] * 2)
    assert column(states, lambda s: s.done) == [0.0, 1.0]
    assert column(states, lambda s: s.info["truncation"]) == [0.0, 1.0]


def test_inner_truncation_is_kept(getkey):
    env = EpisodeWrapper(EpisodeWrapper(Parrot(), max_len=2), max_len=10)
    states = steps(env.step, env.reset(getkey()), [jnp.zeros(3)] * 2)
    assert column(states, lambda s: s.done) == [0.0, 1.0]
    assert column(states, lambda s: s.info["truncation"]) == [0.0, 1.0]


class _ReportsTruncated(AbstractWrapper):
    """Ends every episode itself after two steps and reports that as a time
    limit in `info["truncated"]` (gymnax's name for it)."""

    env: Any

    def reset(self, key):
        state = self.env.reset(key)
        info = {**state.info, "truncated": jnp.zeros_like(state.done), "t": 0}
        return state.replace(info=info)

    def step(self, state, action):
        next_state = self.env.step(state, action)
        t = state.info["t"] + 1
        end = jnp.asarray(t >= 2, next_state.done.dtype)
        info = {**next_state.info, "truncated": end, "t": t}
        return next_state.replace(done=jnp.maximum(next_state.done, end), info=info)


def test_an_inner_truncation_reported_as_truncated_is_kept(getkey):
    env = EpisodeWrapper(_ReportsTruncated(Parrot()), max_len=10)
    states = steps(env.step, env.reset(getkey()), [jnp.zeros(3)] * 2)
    assert column(states, lambda s: s.done) == [0.0, 1.0]
    assert column(states, lambda s: s.info["truncation"]) == [0.0, 1.0]


def test_reset_passes_the_key_through(getkey):
    key = getkey()
    wrapped = EpisodeWrapper(MoveToCenter(), max_len=5).reset(key)
    np.testing.assert_array_equal(wrapped.obs, MoveToCenter().reset(key).obs)


def test_random_initial_steps_opt_in(getkey):
    env = EpisodeWrapper(Parrot(), max_len=10, random_initial_steps=True)
    starts = jax.vmap(env.reset)(jax.random.split(getkey(), 200)).info["steps"]
    # Uniform over [0, 10 // 2): every value, nothing else.
    assert set(np.unique(starts)) == {0, 1, 2, 3, 4}
    state = env.reset(getkey())
    n_left = 10 - int(state.info["steps"])
    states = steps(env.step, state, [jnp.zeros(3)] * n_left)
    assert column(states, lambda s: s.done)[-2:] == [0.0, 1.0][-n_left:]
    assert states[-1].info["truncation"] == 1.0


def test_under_jit_vmap_scan(getkey):
    env = EpisodeWrapper(MoveToCenter(), max_len=4)

    @jax.jit
    def rollout(keys):
        def body(state, _):
            state = jax.vmap(env.step)(state, jnp.zeros((2, 2)))
            return state, (state.done, state.info["truncation"])

        return jax.lax.scan(body, jax.vmap(env.reset)(keys), None, length=5)[1]

    done, truncation = rollout(jax.random.split(getkey(), 2))
    expected = np.array([[0.0, 0.0, 0.0, 1.0, 1.0]] * 2).T
    np.testing.assert_array_equal(done, expected)
    np.testing.assert_array_equal(truncation, expected)


@pytest.mark.parametrize(
    "max_len, error, match",
    [
        (0, ValueError, r"EpisodeWrapper\(max_len=0\): must be >= 1. Fix"),
        (-3, ValueError, r"EpisodeWrapper\(max_len=-3\): must be >= 1. Fix"),
        # Refused by the declared type (a bool is not a count).
        (True, TypeError, r"max_len"),
        (2.5, TypeError, r"max_len"),
    ],
)
def test_bad_max_len(max_len, error, match):
    with pytest.raises(error, match=match):
        EpisodeWrapper(Parrot(), max_len)


def test_max_len_may_be_a_numpy_integer():
    assert EpisodeWrapper(Parrot(), np.int64(7)).max_len == 7


def test_random_initial_steps_must_be_a_bool():
    with pytest.raises(TypeError, match=r"random_initial_steps"):
        EpisodeWrapper(Parrot(), 5, random_initial_steps="no")


# RewardScalingWrapper.


def test_scales_scalar_rewards(getkey):
    base = MoveToCenter()
    env = RewardScalingWrapper(base, 0.5)
    key = getkey()
    state = env.reset(key)
    base_state = base.reset(key)
    scaled = env.step(state, jnp.array([1.0, 0.0]))
    plain = base.step(base_state, jnp.array([1.0, 0.0]))
    np.testing.assert_allclose(scaled.reward, 0.5 * plain.reward)
    assert scaled.reward.dtype == jnp.float32


def test_scales_dict_rewards(getkey):
    key = getkey()
    action = {"arm1": jnp.zeros(2), "arm2": jnp.zeros(2)}
    base = TwoArm()
    plain = base.step(base.reset(key), action)
    # Start radii 1 and 0.5 and a zero action: rewards -1 and -0.5.
    np.testing.assert_allclose(plain.reward["arm1"], -1.0, rtol=1e-6)
    per_key = RewardScalingWrapper(base, {"arm1": 2.0, "arm2": -1.0})
    out = per_key.step(per_key.reset(key), action)
    np.testing.assert_allclose(out.reward["arm1"], -2.0, rtol=1e-6)
    np.testing.assert_allclose(out.reward["arm2"], 0.5, rtol=1e-6)
    every = RewardScalingWrapper(base, 3)
    out = every.step(every.reset(key), action)
    np.testing.assert_allclose(out.reward["arm1"], -3.0, rtol=1e-6)
    np.testing.assert_allclose(out.reward["arm2"], -1.5, rtol=1e-6)
    out = jax.jit(jax.vmap(per_key.step))(
        jax.vmap(per_key.reset)(jax.random.split(key, 2)),
        jax.tree.map(lambda a: jnp.stack([a, a]), action),
    )
    assert out.reward["arm2"].shape == (2,)


def test_bad_scale(getkey):
    with pytest.raises(TypeError, match="scale"):
        RewardScalingWrapper(MoveToCenter(), "big")
    for scale in (
        0.0,
        float("nan"),
        {"arm1": 0.0, "arm2": 0},
        {"arm1": 1.0, "arm2": float("inf")},
    ):
        with pytest.raises(
            ValueError, match=r"every factor must be finite and at least one non-zero"
        ):
            RewardScalingWrapper(TwoArm(), scale)
    RewardScalingWrapper(TwoArm(), {"arm1": 1.0, "arm2": 0.0})  # ignore one key
    wrong_keys = RewardScalingWrapper(TwoArm(), {"left": 1.0, "right": 1.0})
    with pytest.raises(ValueError, match="one factor per reward key"):
        wrong_keys.reset(getkey())


# Forwarding.


def test_forwards_sizes_dt_render_and_attributes():
    env = RewardScalingWrapper(EpisodeWrapper(Pendulum(hide_velocity=True), 200), 0.1)
    assert env.observation_size == 2
    assert env.action_size == 1
    assert env.n_actions is None
    assert env.dt == 0.05
    assert env.hide_velocity and env.max_torque == 2.0
    assert env.max_len == 200
    assert isinstance(env.unwrapped, Pendulum)
    assert env.render.__self__ is env.unwrapped
    two_arm = EpisodeWrapper(TwoArm(), 5)
    assert two_arm.action_size == {"arm1": 2, "arm2": 2}
    # Envs that cannot render stay without `render` when wrapped.
    assert not hasattr(EpisodeWrapper(Recall(), 5), "render")
    with pytest.raises(AttributeError):
        EpisodeWrapper(Recall(), 5).no_such_attribute  # noqa: B018
    with pytest.raises(TypeError, match="abstract"):
        AbstractWrapper()  # pyright: ignore


# Wrapping a foreign env: a plain class with its own state class, as Brax and
# Playground envs are. The wrappers only use `.info`, `.done`, `.reward` and
# `.replace`.


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ForeignState:
    data: Any
    obs: Any
    reward: Any
    done: Any
    metrics: dict
    info: dict

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)


class ForeignEnv:
    """Terminates when the position passes 2; reward = position."""

    dt = 0.01
    observation_size = 1
    action_size = 1
    extra = "forwarded"

    def reset(self, key):
        del key
        zero = jnp.zeros((), jnp.float32)
        return ForeignState(zero, jnp.zeros(1), zero, zero, {}, {"time_out": zero})

    def step(self, state, action):
        x = state.data + action[0]
        return state.replace(
            data=x,
            obs=x[None],
            reward=x,
            done=(x > 2.0).astype(jnp.float32),
        )


def test_wraps_foreign_envs(getkey):
    env = RewardScalingWrapper(EpisodeWrapper(ForeignEnv(), max_len=4), 10.0)
    # Another foreign env's own `observation_size` is forwarded as it is.
    assert (env.dt, env.extra, env.observation_size) == (0.01, "forwarded", 1)
    state = jax.jit(env.reset)(getkey())
    assert isinstance(state, ForeignState)
    assert set(state.info) == {"time_out", "steps", "truncation"}
    step = jax.jit(env.step)
    ones = [jnp.ones(1)] * 3
    states = steps(step, state, ones)
    # Positions 1, 2, 3: terminates on step 3 (x > 2), before the limit of 4.
    assert column(states, lambda s: s.reward) == [10.0, 20.0, 30.0]
    assert column(states, lambda s: s.done) == [0.0, 0.0, 1.0]
    assert column(states, lambda s: s.info["truncation"]) == [0.0, 0.0, 0.0]
    slow = [jnp.full(1, 0.1)] * 4
    states = steps(step, state, slow)
    assert column(states, lambda s: s.info["truncation"]) == [0.0, 0.0, 0.0, 1.0]


class _BraxLike(ForeignEnv):
    """As Brax's envs: `observation_size` runs a reset (the obs is `obs_shape`).
    Its module says Brax, as the wrappers look for Brax's and Playground's rule
    by the module of the class that defines `observation_size`."""

    __module__ = "brax.envs.like"

    def __init__(self, obs_shape, resets):
        self.obs_shape, self.resets = obs_shape, resets

    @property
    def observation_size(self):
        obs = self.reset(jax.random.PRNGKey(0)).obs
        return obs.shape[-1] if isinstance(obs, jax.Array) else {"x": obs["x"].shape}

    def reset(self, key):
        self.resets.append(jnp.shape(key))
        state = super().reset(key)
        obs = jnp.zeros(self.obs_shape)
        return state.replace(obs=obs if self.obs_shape else {"x": jnp.zeros((3, 2))})


def test_a_foreign_env_without_observation_size_lacks_it_wrapped_too():
    class Bare:
        reset, step = ForeignEnv.reset, ForeignEnv.step

    env = EpisodeWrapper(Bare(), 5)
    assert getattr(env, "observation_size", None) is None  # an AttributeError
    with pytest.raises(AttributeError, match="observation_size"):
        _ = env.observation_size


def test_a_foreign_envs_observation_size_is_read_off_the_runs_reset():
    """Brax and Playground envs run or trace a reset for `observation_size`;
    through a wrapper it is read off the reset a run traces anyway (so a
    network factory that reads it adds no trace), by their rule."""
    import eqx_ppo
    from eqx_ppo import nn

    resets = []
    assert EpisodeWrapper(_BraxLike((3,), resets), 5).observation_size == 3
    dict_env = RewardScalingWrapper(EpisodeWrapper(_BraxLike((), resets), 5), 2.0)
    assert dict_env.observation_size == {"x": (3, 2)}
    assert resets == [(), ()]  # traced for one env with a typed key, not run

    resets.clear()
    env = EpisodeWrapper(_BraxLike((1,), resets), 5)
    config = eqx_ppo.TrainConfig(
        learner=eqx_ppo.PPO(n_envs=4, rollout_length=4, total_steps=32),
        progress=False,
    )

    def factory(key):
        return nn.make_mlp_actor_critic(
            env.observation_size, env.action_size, [4], [4], key=key
        )

    assert eqx_ppo.train(env, factory, config).total_steps == 32
    assert resets == [()]  # the factory's read and the run share one trace
