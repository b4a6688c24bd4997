"""The built-in envs: exact dynamics, documented optimal returns, protocol."""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from eqx_ppo.envs import AbstractEnv, State, make, registered_names
from eqx_ppo.envs._cartpole import CartPole
from eqx_ppo.envs._counter import Counter
from eqx_ppo.envs._dict_env import DictObsAct
from eqx_ppo.envs._move_to_center import MoveToCenter
from eqx_ppo.envs._parrot import Parrot
from eqx_ppo.envs._pendulum import Pendulum
from eqx_ppo.envs._recall import Recall
from eqx_ppo.envs._two_arm import TwoArm
from tests._helpers import assert_ulp_close, rtol
from tests.test_popgym_envs import POPGYM_NAMES


def run(env, policy, key, n_steps):
    """Roll one env `n_steps` from reset, no auto-reset; `policy(obs, t)`.

    Returns the stacked post-step states (rewards, dones, infos `[n_steps]`).
    """

    def body(state, t):
        next_state = env.step(state, policy(state.obs, t))
        return next_state, next_state

    _, states = jax.lax.scan(body, env.reset(key), jnp.arange(n_steps))
    return states


@eqx.filter_jit
def run_many(env, policy, keys, n_steps):
    """`run` for each key; the states get a leading `[len(keys)]` axis."""
    return jax.vmap(lambda k: run(env, policy, k, n_steps))(keys)


def aval(x):
    return (jnp.shape(x), jnp.result_type(x), getattr(x, "weak_type", None))


def zero_action(env):
    n_actions = getattr(env, "n_actions", None)
    if n_actions is not None:  # discrete: choice 0 of each sub-action
        return jnp.zeros(jnp.shape(n_actions), jnp.int32)
    return jax.tree.map(lambda n: jnp.zeros(n, jnp.float32), env.action_size)


def obs_shapes(size):
    return jax.tree.map(lambda n: (n,), size)


# Protocol, for every registered env.


@pytest.mark.parametrize("name", registered_names())
def test_reset_and_step_states_match(name, getkey):
    env = make(name)
    keys = jax.random.split(getkey(), 3)
    states = jax.jit(jax.vmap(env.reset))(keys)
    actions = jax.tree.map(
        lambda a: jnp.broadcast_to(a, (3, *a.shape)), zero_action(env)
    )
    stepped = jax.jit(jax.vmap(env.step))(states, actions)
    # The library swaps reset states into stepped ones with `where`: same
    # structure, shapes, dtypes and weak types.
    assert jax.tree.structure(states) == jax.tree.structure(stepped)
    assert jax.tree.map(aval, states) == jax.tree.map(aval, stepped)
    assert jax.tree.map(lambda x: x.shape[1:], stepped.obs) == obs_shapes(
        env.observation_size
    )
    assert stepped.done.dtype == jnp.float32
    assert jax.tree.map(lambda r: (r.shape, r.dtype), stepped.reward) == jax.tree.map(
        lambda _: ((3,), jnp.float32), stepped.reward
    )


@pytest.mark.parametrize("name", registered_names())
def test_vmap_equals_loop_and_same_key_same_state(name, getkey):
    env = make(name)
    keys = jax.random.split(getkey(), 2)
    batched = jax.vmap(env.reset)(keys)
    singles = jax.tree.map(lambda *s: jnp.stack(s), *(env.reset(k) for k in keys))
    # Batched ops may round differently; keys and integers must be identical.
    assert_ulp_close(batched, singles)


SELF_ENDING = ("recall", *POPGYM_NAMES)


@pytest.mark.parametrize("name", registered_names())
def test_no_episode_outlasts_max_len(name, getkey):
    # `max_len` is how long evaluation and recording run (the CLI's default):
    # every episode has ended by then, whether a time limit or the env ends it.
    env = make(name)
    keys = jax.random.split(getkey(), 8)
    states = run_many(env, lambda obs, t: zero_action(env), keys, env.max_len)
    done = np.asarray(states.done > 0)
    assert done.any(axis=1).all()
    if name in SELF_ENDING:  # every episode lasts exactly `length` steps
        np.testing.assert_array_equal(done.argmax(axis=1), env.max_len - 1)


@pytest.mark.parametrize("name", registered_names())
def test_step_compiles_once(name, getkey):
    env = make(name)
    step = jax.jit(eqx.debug.assert_max_traces(env.step, max_traces=1))
    # Envs are hashable, so their bound methods can be jitted directly.
    state = jax.jit(env.reset)(getkey())
    for _ in range(3):
        state = step(state, zero_action(env))


def test_registry():
    assert registered_names() == (
        "cartpole",
        "cartpole_no_velocity",
        "count_recall",
        "count_recall_hard",
        "counter",
        "dict_obs_act",
        "move_to_center",
        "parrot",
        "pendulum",
        "pendulum_no_velocity",
        "recall",
        "repeat_first",
        "repeat_first_hard",
        "repeat_previous",
        "repeat_previous_hard",
        "two_arm",
    )
    assert isinstance(make("recall"), Recall)
    assert make("move_to_center").max_len == 20
    assert make("move_to_center", episode_length=7).max_len == 7
    assert isinstance(make("move_to_center", episode_length=None), MoveToCenter)
    assert make("pendulum_no_velocity").env.hide_velocity
    assert make("parrot", obs_size=5).observation_size == 5
    assert make("counter", episode_length=4).max_len == 4
    with pytest.raises(ValueError, match="unknown env.*move_to_center"):
        make("move_to_centre")
    with pytest.raises(ValueError, match="unknown prefix 'mjx'"):
        make("mjx:Humanoid")
    with pytest.raises(
        ValueError,
        match=r"make\('move_to_center', episode_length=0\): must be >= 1. Fix",
    ):
        make("move_to_center", episode_length=0)


@pytest.mark.parametrize(
    "prefix, extra",
    [
        ("brax", "brax"),
        ("playground", "playground"),
        ("gymnax", "gymnax"),
        ("popgym_arcade", "popgym-arcade"),
    ],
)
def test_a_missing_simulator_names_its_extra(prefix, extra, monkeypatch):
    import importlib

    def missing(name):
        raise ModuleNotFoundError(f"No module named {name!r}")

    monkeypatch.setattr(importlib, "import_module", missing)
    with pytest.raises(ImportError, match=rf"pip install 'eqx_ppo\[{extra}\]'"):
        make(f"{prefix}:Anything")


def test_is_abstract():
    with pytest.raises(TypeError, match="abstract"):
        AbstractEnv()  # pyright: ignore
    assert MoveToCenter().n_actions is None
    assert MoveToCenter().dt == 1.0
    env = Recall()
    assert env.unwrapped is env


# Counter.


def test_counter_rewards_the_step_number(getkey):
    env = Counter(min_length=3, max_length=3)
    state = env.reset(getkey())
    np.testing.assert_array_equal(state.obs, [0.0])
    rewards, dones = [], []
    # Guesses for steps 1, 2, 3: right, off by 0.4 (still right), off by 0.6.
    for guess in (1.0, 2.4, 3.6):
        state = env.step(state, jnp.array([guess]))
        rewards.append(float(state.reward))
        dones.append(float(state.done))
    assert rewards == [1.0, 1.0, 0.0]
    assert dones == [0.0, 0.0, 1.0]


def test_counter_counting_policy_is_optimal(getkey):
    env = Counter()
    keys = jax.random.split(getkey(), 256)
    count = lambda obs, t: (t + 1).astype(jnp.float32)[None]  # noqa: E731
    states = run_many(env, count, keys, 9)
    lengths = jax.vmap(lambda k: env.reset(k).pipeline_state["length"])(keys)
    first_done = jnp.argmax(states.done, axis=1) + 1
    # Reward 1 on each of the episode's L steps, so the return up to done is L.
    in_episode = jnp.arange(1, 10) <= first_done[:, None]
    returns = jnp.sum(jnp.where(in_episode, states.reward, 0.0), 1)
    np.testing.assert_array_equal(first_done, lengths)
    np.testing.assert_array_equal(returns, lengths.astype(jnp.float32))
    assert set(np.unique(lengths)) == set(range(3, 10))
    # A counter that starts one step late scores nothing.
    late = lambda obs, t: t.astype(jnp.float32)[None]  # noqa: E731
    assert jnp.all(run(env, late, keys[0], 9).reward == 0.0)


# Parrot.


def test_parrot_reward(getkey):
    env = Parrot(obs_size=3, reward_falloff=0.5)
    state = env.reset(getkey())
    assert jnp.all(jnp.abs(state.obs) < 1.0)
    # |d|^2 = 0.25, 2 falloff^2 = 0.5: reward exp(-0.5).
    off = env.step(state, state.obs + jnp.array([0.5, 0.0, 0.0]))
    np.testing.assert_allclose(off.reward, math.exp(-0.5), rtol=rtol(1e-6))
    echo = env.step(state, state.obs)
    assert echo.reward == 1.0
    # Both answers see the same next observation, and it is a fresh one.
    np.testing.assert_array_equal(off.obs, echo.obs)
    assert not jnp.allclose(echo.obs, state.obs)


def test_parrot_echo_policy_is_optimal(getkey):
    env = make("parrot")
    states = run(env, lambda obs, t: obs, getkey(), 10)
    np.testing.assert_allclose(jnp.sum(states.reward), 10.0)
    np.testing.assert_array_equal(states.done, [0.0] * 9 + [1.0])


# MoveToCenter, DictObsAct, TwoArm.


def greedy(obs, speed=0.2):
    """Head straight for the origin at full speed, stopping on it."""
    return -obs / jnp.maximum(jnp.sqrt(jnp.sum(obs**2)), speed)


def test_move_to_center_dynamics():
    env = MoveToCenter()
    state = env.reset(jax.random.key(0)).replace(pipeline_state=jnp.array([1.0, 0.0]))
    # Push left at full speed: 0.2 per step; reward = -distance = -0.8.
    left = env.step(state, jnp.array([-1.0, 0.0]))
    np.testing.assert_allclose(left.obs, [0.8, 0.0])
    np.testing.assert_allclose(left.reward, -0.8)
    np.testing.assert_allclose(left.metrics["distance"], 0.8)
    # A corner action has norm sqrt(2), capped at 1: moves 0.2/sqrt(2) per axis.
    corner = env.step(state, jnp.array([-1.0, 1.0]))
    np.testing.assert_allclose(corner.obs, [1 - 0.2 / 2**0.5, 0.2 / 2**0.5])
    # Half an action moves half as far.
    half = env.step(state, jnp.array([0.5, 0.0]))
    np.testing.assert_allclose(half.obs, [1.1, 0.0])


def test_move_to_center_optimal_return(getkey):
    env = make("move_to_center")
    keys = jax.random.split(getkey(), 64)
    states = run_many(env, lambda o, t: greedy(o), keys, 20)
    start = jax.vmap(env.reset)(keys).obs
    np.testing.assert_allclose(jnp.linalg.norm(start, axis=1), 1.0, rtol=1e-6)
    # -(0.8 + 0.6 + 0.4 + 0.2) = -2.0 whatever the start angle.
    np.testing.assert_allclose(jnp.sum(states.reward, 1), -2.0, atol=1e-5)
    np.testing.assert_array_equal(states.info["truncation"][:, -1], 1.0)

    # The documented random-policy level: far below the optimum.
    def random_episode(k):
        noise = jax.random.uniform(k, (20, 2), minval=-1.0, maxval=1.0)
        return run(env, lambda o, t: noise[t], k, 20)

    rand = jax.jit(jax.vmap(random_episode))(keys)
    assert -25.0 < jnp.mean(jnp.sum(rand.reward, 1)) < -15.0


def test_dict_obs_act(getkey):
    env = DictObsAct()
    assert env.observation_size == {"pos": 2, "vel": 2}
    assert env.action_size == {"force": 2}
    state = env.reset(getkey()).replace(
        pipeline_state={"pos": jnp.array([0.0, 1.0]), "vel": jnp.zeros(2)}
    )
    next_state = env.step(state, {"force": jnp.array([0.0, -0.5])})
    np.testing.assert_allclose(next_state.obs["pos"], [0.0, 0.9])
    np.testing.assert_allclose(next_state.obs["vel"], [0.0, -0.1])
    np.testing.assert_allclose(next_state.reward, -0.9)
    states = run(
        make("dict_obs_act"), lambda o, t: {"force": greedy(o["pos"])}, getkey(), 20
    )
    np.testing.assert_allclose(jnp.sum(states.reward), -2.0, atol=1e-5)
    with pytest.raises(ValueError, match="DictObsAct.step.*'force'"):
        env.step(state, {"push": jnp.zeros(2)})


def test_two_arm_dict_rewards(getkey):
    env = make("two_arm")
    assert env.action_size == {"arm1": 2, "arm2": 2}
    assert env.observation_size == {
        "arm1": {"pos": 2, "vel": 2},
        "arm2": {"pos": 2, "vel": 2},
    }
    start = env.reset(getkey()).obs
    np.testing.assert_allclose(jnp.linalg.norm(start["arm1"]["pos"]), 1.0, rtol=1e-6)
    np.testing.assert_allclose(jnp.linalg.norm(start["arm2"]["pos"]), 0.5, rtol=1e-6)
    states = run(
        env,
        lambda o, t: {arm: greedy(o[arm]["pos"]) for arm in ("arm1", "arm2")},
        getkey(),
        20,
    )
    returns = jax.tree.map(jnp.sum, states.reward)
    # arm1: -(0.8 + 0.6 + 0.4 + 0.2); arm2: -(0.3 + 0.1).
    np.testing.assert_allclose(returns["arm1"], -2.0, atol=1e-5)
    np.testing.assert_allclose(returns["arm2"], -0.4, atol=1e-5)
    # The arms are driven independently: only arm2 moves here.
    state = TwoArm().reset(getkey())
    moved = TwoArm().step(state, {"arm1": jnp.zeros(2), "arm2": jnp.array([1.0, 0.0])})
    np.testing.assert_array_equal(moved.obs["arm1"]["pos"], state.obs["arm1"]["pos"])
    np.testing.assert_allclose(
        moved.obs["arm2"]["pos"] - state.obs["arm2"]["pos"], [0.2, 0.0], atol=1e-6
    )


# Recall.


def test_recall_dynamics():
    env = Recall(length=5)
    state = env.reset(jax.random.key(0))
    cue = state.pipeline_state["cue"]
    np.testing.assert_array_equal(state.obs, [cue, 0.0])
    state = env.step(state, jnp.array([0.5]))
    np.testing.assert_allclose(state.reward, 0.5 * cue)
    np.testing.assert_allclose(state.obs, [0.0, 0.2])
    # Actions are clipped to [-1, 1].
    state = env.step(state, jnp.array([-3.0]))
    np.testing.assert_allclose(state.reward, -cue)
    np.testing.assert_allclose(state.obs, [0.0, 0.4])


def test_recall_optimal_and_feed_forward_returns(getkey):
    env = make("recall")
    keys = jax.random.split(getkey(), 200)
    cues = jax.vmap(env.reset)(keys).pipeline_state["cue"]
    assert 50 < jnp.sum(cues > 0) < 150

    def returns(policy):
        states = run_many(env, policy, keys, 5)
        np.testing.assert_array_equal(states.done[:, -1], 1.0)
        np.testing.assert_array_equal(states.done[:, :-1], 0.0)
        return jnp.sum(states.reward, 1)

    # Memory: act with the cue every step (the policy reads the true cue).
    def remembering_episode(k):
        cue = env.reset(k).pipeline_state["cue"]
        return jnp.sum(run(env, lambda o, t: cue[None], k, 5).reward)

    remember = jax.jit(jax.vmap(remembering_episode))(keys)
    np.testing.assert_array_equal(remember, 5.0)
    # The best feed-forward policy: copy the shown cue, else anything; here 0.
    np.testing.assert_array_equal(returns(lambda o, t: o[:1]), 1.0)
    # Any feed-forward action after the first step cancels out over the cues:
    # a constant +1 earns 5c, i.e. 0 on average over equally likely cues.
    const = returns(lambda o, t: jnp.ones(1))
    np.testing.assert_array_equal(const, 5.0 * cues)


# Pendulum.


def energy_controller(obs):
    """Pump energy to the upright level (E = 15), balance near the top."""
    c, s, w = obs
    energy = 0.5 * w**2 + 15.0 * c  # dE/dt = 3 u w under these dynamics
    pump = jnp.where(w >= 0, 1.0, -1.0) * jnp.where(energy < 15.0, 1.0, -1.0)
    balance = -(10.0 * jnp.arctan2(s, c) + 2.0 * w) / 2.0
    return jnp.clip(jnp.where(c > 0.9, balance, pump), -1.0, 1.0)[None]


def test_pendulum_one_step():
    env = Pendulum()
    state = env.reset(jax.random.key(0)).replace(
        pipeline_state={"theta": jnp.array(jnp.pi / 2), "theta_dot": jnp.array(0.0)}
    )
    # u = 2 * 0.5 = 1; cost = (pi/2)^2 + 0.1 * 0^2 + 0.001 * 1^2.
    # theta_dot' = 0 + (15 sin(pi/2) + 3 * 1) * 0.05 = 0.9; theta' = pi/2 + 0.045.
    out = env.step(state, jnp.array([0.5]))
    np.testing.assert_allclose(out.reward, -((np.pi / 2) ** 2 + 0.001), rtol=1e-6)
    theta = np.pi / 2 + 0.045
    np.testing.assert_allclose(out.obs, [np.cos(theta), np.sin(theta), 0.9], rtol=1e-5)
    # The angle in the cost wraps: theta = 2 pi + 1 costs 1^2. The speed
    # 7.9 + (15 sin(1) + 6) * 0.05 = 8.83 clips at 8.
    fast = state.replace(
        pipeline_state={"theta": jnp.array(2 * np.pi + 1), "theta_dot": jnp.array(7.9)}
    )
    out = env.step(fast, jnp.array([1.0]))
    np.testing.assert_allclose(out.reward, -(1.0 + 0.1 * 7.9**2 + 0.004), rtol=1e-5)
    np.testing.assert_allclose(out.pipeline_state["theta_dot"], 8.0)
    assert env.dt == 0.05


def test_pendulum_returns(getkey):
    env = make("pendulum")
    keys = jax.random.split(getkey(), 128)
    controlled = run_many(env, lambda o, t: energy_controller(o), keys, 200)
    np.testing.assert_array_equal(controlled.done[:, -1], 1.0)
    np.testing.assert_array_equal(controlled.info["truncation"][:, -1], 1.0)
    mean = jnp.mean(jnp.sum(controlled.reward, 1))
    assert -165.0 < mean < -125.0, mean
    idle = run_many(env, lambda o, t: jnp.zeros(1), keys, 200)
    assert -1350.0 < jnp.mean(jnp.sum(idle.reward, 1)) < -1050.0


def test_pendulum_hidden_velocity(getkey):
    key = getkey()
    full, hidden = make("pendulum"), make("pendulum_no_velocity")
    assert (full.observation_size, hidden.observation_size) == (3, 2)
    actions = jax.random.uniform(getkey(), (20, 1), minval=-1, maxval=1)
    a = run(full, lambda o, t: actions[t], key, 20)
    b = run(hidden, lambda o, t: actions[t], key, 20)
    # Same physics and rewards; only theta_dot is missing from the observation.
    # The two scans compile to different programs: equal up to rounding.
    assert_ulp_close((a.reward, a.obs[:, :2]), (b.reward, b.obs))


# Render.


def test_render_frames(getkey):
    env = make("move_to_center")
    state = env.reset(getkey()).replace(pipeline_state=jnp.array([0.0, 1.0]))
    frames = env.render([state, state.pipeline_state], height=40, width=60)
    assert len(frames) == 2
    assert frames[0].shape == (40, 60, 3) and frames[0].dtype == np.uint8
    np.testing.assert_array_equal(frames[0], frames[1])
    # The world square [-1.5, 1.5]^2 spans the 40 rows: (0, 1) is at row ~6.7,
    # column 30, and is drawn red.
    assert tuple(frames[0][7, 30]) == (200, 40, 40)
    assert tuple(frames[0][33, 30]) == (255, 255, 255)
    with pytest.raises(ValueError, match=r"render\(width=0\): must be >= 1"):
        env.render([state], height=40, width=0)

    pendulum = Pendulum()
    upright = pendulum.reset(getkey()).replace(
        pipeline_state={"theta": jnp.array(0.0), "theta_dot": jnp.array(0.0)}
    )
    (frame,) = pendulum.render([upright], height=32, width=32)
    # Upright: the rod covers the column above the pivot, not below.
    assert tuple(frame[6, 16]) == (200, 80, 40)
    assert tuple(frame[26, 16]) == (255, 255, 255)
    assert not hasattr(Recall(), "render")


# Bad input.


@pytest.mark.parametrize(
    "env, action, match",
    [
        (MoveToCenter(), jnp.zeros(3), r"MoveToCenter.step.*shape \(2,\).*\(3,\)"),
        (Counter(), jnp.zeros(2), r"Counter.step.*action_size=1"),
        (Parrot(obs_size=4), jnp.zeros(3), r"Parrot.step.*\(4,\)"),
        (Recall(), jnp.zeros(2), r"Recall.step"),
        (Pendulum(), jnp.zeros(2), r"Pendulum.step"),
    ],
)
def test_wrong_action_shape(env, action, match):
    with pytest.raises(ValueError, match=match):
        env.step(env.reset(jax.random.key(0)), action)


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match="speed=0.0"):
        MoveToCenter(speed=0.0)
    with pytest.raises(ValueError, match="arm2_radius=-1.0"):
        TwoArm(arm2_radius=-1.0)
    with pytest.raises(ValueError, match=r"Counter\(max_length=4\): must be >= 5. Fix"):
        Counter(min_length=5, max_length=4)
    with pytest.raises(ValueError, match=r"Recall\(length=1\): must be >= 2. Fix"):
        Recall(length=1)
    with pytest.raises(ValueError, match="obs_size"):
        Parrot(obs_size=0)


@pytest.mark.parametrize(
    "make, error, message",
    [
        (
            lambda: CartPole(max_force=-1.0),
            ValueError,
            r"CartPole\(max_force=-1\.0\): must be finite and > 0",
        ),
        (lambda: CartPole(max_force=float("nan")), ValueError, r"max_force=nan"),
        # A truthy string would have hidden the velocities.
        (
            lambda: CartPole(hide_velocity="no"),
            TypeError,
            r"parameter hide_velocity='no' violates type hint <class 'bool'>",
        ),
        (
            lambda: Pendulum(step_dt=0.0),
            ValueError,
            r"Pendulum\(step_dt=0\.0\): must be finite and > 0",
        ),
        (
            lambda: Pendulum(mass=-1.0, length=0.0),
            ValueError,
            r"Pendulum\(mass=-1\.0\)",
        ),
        (
            lambda: Pendulum(gravity=float("nan")),
            ValueError,
            r"Pendulum\(gravity=nan\): must be finite and >= 0",
        ),
        (
            lambda: Pendulum(hide_velocity=1),
            TypeError,
            r"parameter hide_velocity=1 violates type hint <class 'bool'>",
        ),
    ],
)
def test_physics_envs_check_their_parameters(unchecked, make, error, message):
    with pytest.raises(error, match=message):
        make()


def test_state_is_brax_compatible(getkey):
    state = MoveToCenter().reset(getkey())
    assert isinstance(state, State)
    assert set(State.__dataclass_fields__) == {
        "pipeline_state",
        "obs",
        "reward",
        "done",
        "metrics",
        "info",
    }


def test_the_playground_extra_stays_below_its_pytorch_rewrite():
    # `playground` 1.0 on PyPI is a PyTorch rewrite, not MuJoCo Playground.
    import pathlib
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads(
        (pathlib.Path(__file__).parent.parent / "pyproject.toml").read_text()
    )["project"]
    pins = [
        Requirement(r)
        for extra in project["optional-dependencies"].values()
        for r in extra
        if Requirement(r).name == "playground"
    ]
    assert pins and all(not p.specifier.contains("1.0") for p in pins)
    assert all(p.specifier.contains("0.0.5") for p in pins)
