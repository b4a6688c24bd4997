"""Brax, MuJoCo Playground and gymnax envs through `make` and the wrappers.

Each test skips when its simulator is not installed.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from eqx_ppo.envs import EpisodeWrapper, GymnaxAdapter, RewardScalingWrapper, make
from eqx_ppo.envs._pendulum import Pendulum

# Warnings the simulators raise on import, outside our control.
pytestmark = [
    pytest.mark.filterwarnings(
        "ignore:JAXopt is no longer maintained:DeprecationWarning"
    ),
    pytest.mark.filterwarnings("ignore:Brax System:UserWarning"),
    pytest.mark.filterwarnings("ignore:Accessing .* from `Data` is deprecated"),
]


def rollout(env, keys, action, n_steps):
    """`n_steps` of `len(keys)` envs under `jit`, `vmap` and `scan`."""

    @jax.jit
    def run(keys):
        def body(state, _):
            state = jax.vmap(env.step)(state, action)
            return state, state

        return jax.lax.scan(body, jax.vmap(env.reset)(keys), None, length=n_steps)

    return run(keys)


# Brax.


@pytest.fixture
def brax_envs():
    brax_envs = pytest.importorskip("brax.envs")
    # Brax itself mixes bools and floats, which the suite's strict promotion
    # forbids.
    with jax.numpy_dtype_promotion("standard"):
        yield brax_envs


def test_brax_inverted_pendulum(brax_envs, getkey):
    env = make("brax:inverted_pendulum", backend="spring")
    assert isinstance(env, EpisodeWrapper) and env.max_len == 1000
    assert isinstance(env.env, brax_envs.Env)
    # Read off a traced reset (Brax's own runs one eagerly).
    assert (env.observation_size, env.action_size, env.n_actions) == (4, 1, None)
    assert env.dt == pytest.approx(0.02)
    assert hasattr(env, "render") and hasattr(env, "sys")

    short = make("brax:inverted_pendulum", backend="spring", episode_length=3)
    scaled = RewardScalingWrapper(short, 0.5)
    first, states = rollout(scaled, jax.random.split(getkey(), 2), jnp.zeros((2, 1)), 4)
    assert isinstance(first, brax_envs.State)
    assert first.obs.shape == (2, 4)
    # Upright and unpushed, the pole survives 3 steps: a time-limit end.
    np.testing.assert_array_equal(states.done[:, 0], [0.0, 0.0, 1.0, 1.0])
    np.testing.assert_array_equal(states.info["truncation"][:, 0], [0, 0, 1, 1])
    np.testing.assert_array_equal(states.info["steps"][:, 0], [1, 2, 3, 4])
    # Brax pays 1 per step alive; scaled by 0.5.
    np.testing.assert_array_equal(states.reward, 0.5)


def test_brax_training_wrappers_are_refused_by_name(brax_envs):
    from brax.envs.wrappers import training

    import eqx_ppo

    net = eqx_ppo.make_mlp_actor_critic(4, 1, [4], [4], key=jax.random.key(0))
    config = eqx_ppo.PPO(n_envs=2, n_minibatches=1)
    pendulum = brax_envs.get_environment("inverted_pendulum", backend="spring")
    batched = training.wrap(pendulum, episode_length=10)  # vmapped, auto-reset
    auto_reset = brax_envs.create("inverted_pendulum", backend="spring")
    for env, wrapper in (
        (batched, "AutoResetWrapper"),
        (auto_reset, "AutoResetWrapper"),
    ):
        with pytest.raises(
            TypeError,
            match=rf"(?s)env=...: the env is wrapped in {wrapper}"
            r".*raised in eqx_ppo\.init",
        ):
            eqx_ppo.init(env, net, config, key=jax.random.key(1))
    with pytest.raises(TypeError, match="wrapped in VmapWrapper, which batches"):
        eqx_ppo.init(training.VmapWrapper(pendulum), net, config, key=jax.random.key(1))
    # Without its auto-reset, `create` gives an env the library steps itself.
    single = brax_envs.create("inverted_pendulum", backend="spring", auto_reset=False)
    eqx_ppo.init(single, net, config, key=jax.random.key(1))


def test_brax_unknown_name(brax_envs):
    with pytest.raises(ValueError, match="brax has no env 'xyz'. It has: ant, "):
        make("brax:xyz")
    with pytest.raises(
        ValueError,
        match=r"brax has no env 'pendulum'\. Did you mean 'inverted_pendulum'\? "
        r"It has: ant, .*, inverted_pendulum, ",
    ):
        make("brax:pendulum")


# MuJoCo Playground.


def test_playground_point_mass(playground, getkey):
    registry = playground.registry
    env = make("playground:PointMass", impl="jax")
    assert isinstance(env, EpisodeWrapper)
    assert env.max_len == registry.get_default_config("PointMass").episode_length
    assert (env.observation_size, env.action_size, env.dt) == (4, 2, 0.02)
    assert hasattr(env, "render")

    short = RewardScalingWrapper(
        make("playground:PointMass", impl="jax", episode_length=2), 2.0
    )
    first, states = rollout(short, jax.random.split(getkey(), 2), jnp.zeros((2, 2)), 2)
    assert first.obs.shape == (2, 4)
    np.testing.assert_array_equal(states.done, [[0.0, 0.0], [1.0, 1.0]])
    np.testing.assert_array_equal(states.info["truncation"], [[0, 0], [1, 1]])
    assert jnp.all(states.reward >= 0.0) and jnp.all(states.reward <= 2.0)
    with pytest.raises(ValueError, match="no env 'Nope'"):
        make("playground:Nope")


@pytest.fixture
def playground():
    playground = pytest.importorskip("mujoco_playground")
    with jax.numpy_dtype_promotion("standard"):
        yield playground


# gymnax.


@pytest.fixture
def gymnax():
    return pytest.importorskip("gymnax")


def test_gymnax_cartpole_discrete(gymnax, getkey):
    env = make("gymnax:CartPole-v1")
    assert isinstance(env, GymnaxAdapter)
    assert (env.observation_size, env.action_size, env.n_actions) == (4, 2, 2)
    assert EpisodeWrapper(env, 10).n_actions == 2
    # Always pushing right topples the pole: a termination, not a truncation.
    _, states = rollout(env, jax.random.split(getkey(), 3), jnp.ones(3, jnp.int32), 40)
    first_done = jnp.argmax(states.done, axis=0)
    assert jnp.all(states.done.max(0) == 1.0)
    assert jnp.all((first_done > 3) & (first_done < 30))
    np.testing.assert_array_equal(states.info["truncation"], 0.0)
    np.testing.assert_array_equal(states.reward[0], 1.0)
    with pytest.raises(ValueError, match=r"integer scalar action in \[0, 2\)"):
        env.step(env.reset(getkey()), jnp.ones(1))


def test_gymnax_time_limit_is_truncation(gymnax, getkey):
    env = make("gymnax:Pendulum-v1")
    assert (env.n_actions, env.action_size, env.observation_size) == (None, 1, 3)
    assert env.dt == pytest.approx(0.05)
    _, states = rollout(env, jax.random.split(getkey(), 2), jnp.zeros((2, 1)), 200)
    expected = np.zeros((200, 2))
    expected[-1] = 1.0
    np.testing.assert_array_equal(states.done, expected)
    np.testing.assert_array_equal(states.info["truncation"], expected)


def test_gymnax_key_is_carried(gymnax, getkey):
    env = make("gymnax:CartPole-v1")
    state = env.reset(getkey())
    a = env.step(state, jnp.array(0, jnp.int32))
    b = env.step(state, jnp.array(0, jnp.int32))
    np.testing.assert_array_equal(a.obs, b.obs)
    assert not jnp.array_equal(
        jax.random.key_data(a.pipeline_state["key"]),
        jax.random.key_data(state.pipeline_state["key"]),
    )


def test_gymnax_pendulum_matches_builtin(gymnax, getkey):
    """Same physics as our Pendulum, with actions rescaled from [-1, 1] to [-2, 2]."""
    ours, theirs = Pendulum(), make("gymnax:Pendulum-v1")
    key = getkey()
    a, b = ours.reset(key), theirs.reset(key)
    b = b.replace(
        pipeline_state={
            **b.pipeline_state,
            "env_state": b.pipeline_state["env_state"].replace(
                theta=a.pipeline_state["theta"], theta_dot=a.pipeline_state["theta_dot"]
            ),
        }
    )
    actions = jax.random.uniform(getkey(), (30, 1), minval=-1.0, maxval=1.0)

    @jax.jit
    def both(a, b):
        def body(carry, action):
            a, b = carry
            a, b = ours.step(a, action), theirs.step(b, action)
            return (a, b), (a.obs, b.obs, a.reward, b.reward)

        return jax.lax.scan(body, (a, b), actions)[1]

    obs_a, obs_b, reward_a, reward_b = both(a, b)
    np.testing.assert_allclose(obs_a, obs_b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(reward_a, reward_b, rtol=1e-5, atol=1e-5)


def test_gymnax_unknown_name(gymnax):
    with pytest.raises(ValueError, match="gymnax has no env 'Nope-v0'. It has: "):
        make("gymnax:Nope-v0")
    with pytest.raises(
        ValueError,
        match=r"make\('gymnax:Cartpole'\): gymnax has no env 'Cartpole'\. Did you "
        r"mean 'CartPole-v1'\? It has: Acrobot-v1, .*, CartPole-v1, ",
    ):
        make("gymnax:Cartpole")


def _gymnax_params(name, **fields):
    import gymnax

    return gymnax.make(name)[1].replace(**fields)


@pytest.mark.parametrize(
    "env_params, error, message",
    [
        ("abc", TypeError, r"expected the env's own \S+cartpole\.EnvParams, got str"),
        (
            lambda: _gymnax_params("Pendulum-v1"),
            TypeError,
            r"expected the env's own \S+cartpole\.EnvParams, got "
            r"\S+pendulum\.EnvParams",
        ),
        ({"gravity": "high"}, ValueError, r"gravity='high' is not of type float"),
        ({"max_steps_in_episode": 0}, ValueError, r"\w+=0 is not a whole number >= 1"),
        ({"max_steps_in_episode": -5}, ValueError, r"\w+=-5 is not a whole number"),
        ({"max_steps_in_episode": 2.5}, ValueError, r"\w+=2\.5 is not of type int"),
        (
            {"max_steps_in_episode": 0, "masscart": None},
            ValueError,
            r"max_steps_in_episode=0 is not a whole number >= 1; masscart=None is "
            r"not of type float",
        ),
    ],
    ids=["str", "other-env", "str-field", "zero", "negative", "fraction", "two"],
)
def test_gymnax_env_params_are_checked_at_construction(
    gymnax, env_params, error, message
):
    # Before, each trained (0 and -5 with zero losses, 2.5 as 2) or failed
    # at the first step inside gymnax with an error naming no parameter.
    env_params = env_params() if callable(env_params) else env_params
    with pytest.raises(
        error,
        match=rf"GymnaxAdapter\(CartPole-v1, env_params=\.\.\.\): {message}.*Fix: ",
    ):
        make("gymnax:CartPole-v1", env_params=env_params)


def test_gymnax_counts_must_be_whole_and_positive_whatever_their_type(gymnax):
    for value in (-1, 0):
        with pytest.raises(ValueError, match=rf"memory_length={value} is not a whole"):
            make("gymnax:MemoryChain-bsuite", env_params={"memory_length": value})
    # BernoulliBandit declares its limit a float.
    with pytest.raises(ValueError, match=r"max_steps_in_episode=2\.5 is not a whole"):
        make("gymnax:BernoulliBandit-misc", env_params={"max_steps_in_episode": 2.5})
    assert make("gymnax:BernoulliBandit-misc").max_len == 100


def test_gymnax_env_params_of_other_numeric_types_are_accepted(gymnax, getkey):
    # An int for a float, NumPy and JAX scalars, and traced values under vmap.
    for value in (10, np.float32(10.0), jnp.float32(10.0)):
        env = make("gymnax:CartPole-v1", env_params={"gravity": value})
        assert float(env.env_params.gravity) == 10.0
    inner, params = gymnax.make("CartPole-v1")
    gravity = jax.vmap(
        lambda g: GymnaxAdapter(inner, params.replace(gravity=g)).env_params.gravity
    )(jnp.array([9.0, 10.0]))
    np.testing.assert_array_equal(gravity, [9.0, 10.0])
    with jax.numpy_dtype_promotion("standard"):  # some envs' constructors mix
        for name in gymnax.registered_envs:  # every env's own defaults pass
            if name != "MNISTBandit-bsuite":  # downloads MNIST
                make(f"gymnax:{name}")


@pytest.mark.parametrize(
    "flag", ["rescale_actions", "flatten_obs", "truncation_from_info"]
)
def test_gymnax_adapter_switches_must_be_bools(gymnax, flag):
    env, _ = gymnax.make("CartPole-v1")
    with pytest.raises(TypeError, match=flag):
        GymnaxAdapter(env, **{flag: "no"})


def test_gymnax_adapter_needs_a_gymnax_env(gymnax):
    # The declared protocol names the parameter: reset_env and step_env.
    with pytest.raises(TypeError, match=r"(?s)parameter '?env.*_GymnaxEnv"):
        GymnaxAdapter(make("move_to_center"))


def test_gymnax_env_params_set_parameters_and_max_len(gymnax, getkey):
    chain = make("gymnax:MemoryChain-bsuite", env_params={"memory_length": 10})
    assert chain.env_params.memory_length == 10
    assert make("gymnax:CartPole-v1").max_len == 500
    assert RewardScalingWrapper(make("gymnax:CartPole-v1"), 2.0).max_len == 500
    _, params = gymnax.make("Pendulum-v1")
    short = make(
        "gymnax:Pendulum-v1", env_params=params.replace(max_steps_in_episode=7)
    )
    assert short.max_len == 7
    _, states = rollout(short, jax.random.split(getkey(), 2), jnp.zeros((2, 1)), 7)
    np.testing.assert_array_equal(states.info["truncation"][-1], 1.0)
    with pytest.raises(ValueError, match=r"\['memory'\] are not parameters of"):
        make("gymnax:MemoryChain-bsuite", env_params={"memory": 10})


class _StableGymnaxAPI:
    """A gymnax env as the stable-gymnax API serves it: no `is_truncated`; the
    time limit is reported in `step_env`'s info."""

    def __init__(self, env):
        self._env = env

    def __getattr__(self, name):
        if name == "is_truncated":
            raise AttributeError(name)
        return getattr(self._env, name)

    def step_env(self, key, state, action, params):
        obs, state, reward, done, info = self._env.step_env(key, state, action, params)
        return obs, state, reward, done, {"truncated": state.time >= 5}


def test_gymnax_adapter_reads_truncation_from_info_without_is_truncated(gymnax, getkey):
    inner, params = gymnax.make("Pendulum-v1")
    env = GymnaxAdapter(_StableGymnaxAPI(inner), params)
    assert not hasattr(env.env, "is_truncated")
    _, states = rollout(env, jax.random.split(getkey(), 2), jnp.zeros((2, 1)), 6)
    expected = np.zeros((6, 2))
    expected[4:] = 1.0  # time reaches 5 at the fifth step
    np.testing.assert_array_equal(states.info["truncation"], expected)


class _GymnaxBefore1API(_StableGymnaxAPI):
    """A gymnax env as gymnax 0.0.9 serves it: no `is_truncated`, the time limit
    inside `done` and flagged nowhere, discrete actions of dtype `jnp.int_`."""

    def step_env(self, key, state, action, params):
        assert action.dtype == jnp.int32  # int64 without x64 would warn
        obs, state, reward, done, info = self._env.step_env(key, state, action, params)
        done = done | (state.time >= params.max_steps_in_episode)
        return obs, state, reward, done, {"discount": 1.0 - done}

    def action_space(self, params):
        space = self._env.action_space(params)
        space.dtype = np.int64
        return space


def test_gymnax_before_1_has_its_time_limit_read_off_the_state(gymnax, getkey):
    inner, params = gymnax.make("CartPole-v1")
    env = GymnaxAdapter(
        _GymnaxBefore1API(inner), params.replace(max_steps_in_episode=5)
    )
    # Pushing one way keeps the pole up for more than 5 steps.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, states = rollout(env, jax.random.split(getkey(), 2), jnp.ones(2, int), 6)
    expected = np.zeros((6, 2))
    expected[4:] = 1.0  # time reaches 5 at the fifth step
    np.testing.assert_array_equal(states.done, expected)
    np.testing.assert_array_equal(states.info["truncation"], expected)


def test_playground_on_cpu_defaults_to_the_jax_backend(playground, monkeypatch):
    # Stand-ins for the registry: what `make` asks for, without loading MuJoCo.
    asked = []
    registry = playground.registry
    monkeypatch.setattr(
        registry, "load", lambda name, config_overrides: asked.append(config_overrides)
    )
    assert jax.default_backend() == "cpu"
    with pytest.warns(UserWarning, match="on CPU, using the JAX \\(MJX\\) backend"):
        make("playground:PointMass", episode_length=None)
    make("playground:PointMass", impl="warp", episode_length=None)
    assert asked == [{"impl": "jax"}, {"impl": "warp"}]


def test_playground_backend_is_pinned_for_a_saved_run(playground, monkeypatch):
    from eqx_ppo.envs._registry import pinned_kwargs

    # On CPU `make` picks MJX; a run records it, so a GPU machine (Warp by
    # default) rebuilds the env whose states the checkpoint holds.
    assert pinned_kwargs("playground:CartpoleBalance", {}) == {"impl": "jax"}
    given = {"impl": "warp", "vision": False}
    assert pinned_kwargs("playground:CartpoleBalance", given) == given
    assert pinned_kwargs("brax:ant", {"backend": "mjx"}) == {"backend": "mjx"}
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    default = playground.registry.get_default_config("CartpoleBalance").impl
    assert pinned_kwargs("playground:CartpoleBalance", {}) == {"impl": default}


def test_playground_action_repeat_that_is_not_applied_is_said(playground, monkeypatch):
    monkeypatch.setattr(
        playground.registry, "load", lambda name, config_overrides: object()
    )
    with pytest.warns(UserWarning, match=r"action_repeat=3 is not applied"):
        make(
            "playground:CartpoleBalance",
            impl="jax",
            action_repeat=3,
            episode_length=None,
        )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make("playground:CartpoleBalance", impl="jax", episode_length=None)
