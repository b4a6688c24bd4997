"""Silently-wrong inputs fail early, with a message naming the argument, what
was expected, what was seen and the fix."""

import dataclasses
import functools
import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxtyping import Array

import eqx_ppo
from eqx_ppo import envs, make_mlp_actor_critic, nn, record_activations_rollout
from eqx_ppo.distill import (
    DistillationConfig,
    DistillationTrainConfig,
    distill_init,
    train_distillation,
)
from eqx_ppo.ppo import (
    PPO,
    EvalConfig,
    TrainConfig,
    eval_rollout,
    init,
    init_state,
    ppo_run,
    step,
    train,
)
from eqx_ppo.ppo._validate import check_initial_state

ENV = envs.make("move_to_center")
CONFIG = PPO(n_envs=4, rollout_length=4, total_steps=32, n_minibatches=1)
TRAIN = TrainConfig(learner=CONFIG, progress=False)


def mlp(key, hidden=(8,)):
    return make_mlp_actor_critic(2, 2, list(hidden), list(hidden), key=key)


COEFFICIENTS = [
    "learning_rate",
    "clip_range",
    "discounting_factor",
    "gae_lambda",
    "critic_loss_weight",
]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("name", COEFFICIENTS + ["gradient_clipping"])
def test_non_finite_coefficients_are_rejected(name, value):
    with pytest.raises(
        ValueError, match=rf"PPOConfig\({name}={value}\): must be finite, got {value}"
    ):
        PPO(**{name: value})


@pytest.mark.parametrize(
    "name, value, bound",
    [
        ("learning_rate", -0.001, ">= 0.0"),
        ("clip_range", -0.1, ">= 0.0"),
        ("discounting_factor", 1.01, ">= 0.0 and <= 1.0"),
        ("gae_lambda", -0.1, ">= 0.0 and <= 1.0"),
        ("critic_loss_weight", -0.5, ">= 0.0"),
        ("target_kl", -0.02, ">= 0.0"),
        ("value_clip_range", -0.2, ">= 0.0"),
        ("reward_scaling", -0.3, "> 0.0"),
    ],
)
def test_coefficients_out_of_range_are_shown_as_written(name, value, bound):
    # Stored as float32; the message shows -0.1, not -0.10000000149011612.
    with pytest.raises(ValueError) as error:
        PPO(**{name: value})
    assert str(error.value) == f"PPO({name}={value}): must be {bound}."


@pytest.mark.parametrize(
    "config", [PPOConfig, DistillationConfig], ids=lambda c: c.__name__
)
def test_a_zero_clip_norm_is_rejected(config):
    # optax.clip_by_global_norm(0) scales every gradient to zero.
    with pytest.raises(
        ValueError,
        match=rf"{config.__name__}\(gradient_clipping=0\.0\): must be > 0 or None",
    ):
        config(gradient_clipping=0.0)
    config(gradient_clipping=None, weight_decay=0.0)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("gradient_clipping", "0.5"),
        ("gradient_clipping", True),
        ("weight_decay", "0.5"),
    ],
)
def test_optimizer_settings_that_are_not_numbers_are_named(unchecked, name, value):
    with pytest.raises(
        TypeError,
        match=rf"PPOConfig\({name}={value!r}\): expected a number or None, got "
        rf"{type(value).__name__}\. Fix",
    ):
        PPO(**{name: value})


@pytest.mark.parametrize("config", [PPOConfig, EvalConfig], ids=lambda c: c.__name__)
def test_logging_percentiles_take_a_list_or_tuple_and_name_anything_else(
    unchecked, config
):
    assert config(logging_percentiles=[5, 95]).logging_percentiles == (5, 95)
    with pytest.raises(
        ValueError,
        match=rf"{config.__name__}\(logging_percentiles=50\): expected a tuple of "
        r"numbers in \[0, 100\] or None, got int",
    ):
        config(logging_percentiles=50)


@pytest.mark.parametrize("value", [0.0, -1.0])
def test_reward_scaling_must_be_positive(value):
    with pytest.raises(
        ValueError, match=rf"PPOConfig\(reward_scaling={value}\): must be > 0\.0\."
    ):
        PPO(reward_scaling=value)


def test_non_finite_distillation_learning_rate_is_rejected():
    with pytest.raises(
        ValueError, match=r"DistillationConfig\(learning_rate=nan\): must be finite"
    ):
        DistillationConfig(learning_rate=float("nan"))


@pytest.mark.parametrize(
    "config", [PPOConfig, EvalConfig, DistillationConfig], ids=lambda c: c.__name__
)
@pytest.mark.parametrize(
    "percentiles, seen", [((50, 150), "150"), ((-5, 50), "-5"), ((50, True), "True")]
)
def test_percentiles_must_be_in_0_100(config, percentiles, seen):
    name = config.__name__
    with pytest.raises(
        ValueError,
        match=rf"{name}\(logging_percentiles=.*\): percentiles must be numbers in "
        rf"\[0, 100\], got {seen}\. Fix: ",
    ):
        config(logging_percentiles=percentiles)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (
            {"ppo": {"n_envs": 8}},
            r"TrainConfig\(learner=\{'n_envs': 8\}\): expected PPOConfig, got dict\. "
            r"Fix: TrainConfig\(learner=PPOConfig\(\*\*d\)\) for a dict `d`",
        ),
        (
            {"eval": {"n_envs": 8}},
            r"TrainConfig\(eval=.*expected EvalConfig.*EvalConfig\(\*\*d\)",
        ),
        (
            {"video": True},
            r"TrainConfig\(video=True\): expected VideoConfig, got bool\. "
            r"Fix: pass a VideoConfig",
        ),
    ],
)
def test_sub_configs_must_be_configs(unchecked, kwargs, match):
    with pytest.raises(TypeError, match=match):
        TrainConfig(**kwargs)


def test_distillation_sub_configs_must_be_configs(unchecked):
    with pytest.raises(
        TypeError, match=r"DistillationTrainConfig\(distillation=.*\(\*\*d\)"
    ):
        DistillationTrainConfig(distillation={"n_envs": 8})


@pytest.mark.parametrize(
    "name, call",
    [
        ("log_fn", r"log_fn\(metrics, step\)"),
        ("video_fn", r"video_fn\(video_data\)"),
        ("checkpoint_fn", r"checkpoint_fn\(training_state, step\)"),
    ],
)
def test_callbacks_are_checked_before_training(unchecked, name, call):
    built = []

    def networks(key):
        built.append(key)
        return mlp(key)

    with pytest.raises(
        TypeError,
        match=rf"train\({name}='log'\): expected a function or None, got str\. "
        rf"Fix: pass a function called as `{call}`",
    ):
        train(ENV, networks, TRAIN, **{name: "log"})
    assert built == []  # nothing was initialised, traced or run


@pytest.mark.parametrize(
    "kwargs, seen",
    [
        ({"n_envs": 0}, "got 0"),
        ({"n_envs": True}, "got bool"),
        ({"max_episode_length": -1}, "got -1"),
        ({"every_steps": 1.5}, "got float"),
    ],
)
def test_eval_sizes_must_be_positive_ints(unchecked, kwargs, seen):
    [(name, value)] = kwargs.items()
    with pytest.raises(
        ValueError,
        match=rf"EvalConfig\({name}={value!r}\): {name} must be a positive int, "
        rf"{seen}\. Fix: pass an int >= 1",
    ):
        EvalConfig(**kwargs)


@pytest.mark.parametrize(
    "kwargs", [{"n_seeds": 2.0}, {"checkpoint_every_steps": 0}, {"log_every_steps": 0}]
)
def test_train_sizes_must_be_positive_ints(unchecked, kwargs):
    (name,) = kwargs
    with pytest.raises(ValueError, match=rf"TrainConfig\({name}=.*positive int"):
        TrainConfig(**kwargs)


@pytest.fixture(scope="module")
def state():
    return init_state(ENV, mlp, TRAIN)


@pytest.mark.parametrize(
    "networks, config, match",
    [
        (
            functools.partial(mlp, hidden=(16,)),
            TRAIN,
            r"initial_state\.network\S*kernel is float32\[2, 8\], but a fresh state "
            r"has float32\[2, 16\]\. Fix: pass the network and config",
        ),
        (
            functools.partial(mlp, hidden=(8, 8)),
            TRAIN,
            r"the state's structure differs from a fresh state's .*its leaf \d+ is "
            r"initial_state\.network\S*, a fresh state's is initial_state\.network",
        ),
        (
            mlp,
            TrainConfig(learner=PPO(n_envs=8, n_minibatches=1), progress=False),
            r"the state's env_state and carries hold 4 envs, but the config's "
            r"n_envs is 8\. Fix: resume with n_envs=4",
        ),
        (
            mlp,
            TrainConfig(learner=CONFIG, n_seeds=2, progress=False),
            r"the state has no seed axis .*but config\.n_seeds=2 expects a seed "
            r"axis of 2\. Fix: set n_seeds",
        ),
    ],
    ids=["leaf-shape", "structure", "n_envs", "n_seeds"],
)
def test_initial_state_must_match_networks_and_config(state, networks, config, match):
    with pytest.raises(ValueError, match=rf"train\(initial_state=\.\.\.\): {match}"):
        train(ENV, networks, config, initial_state=state)


def test_initial_state_seed_axis_must_match(state):
    two_seeds = jax.tree.map(
        lambda x: jnp.stack([x, x]) if eqx.is_array(x) else x, state
    )
    with pytest.raises(
        ValueError, match=r"has a seed axis of 2 .*n_seeds=1 expects no seed axis"
    ):
        train(ENV, mlp, TRAIN, initial_state=two_seeds)


def test_matching_initial_state_passes_the_check(state):
    fresh = lambda: init_state(ENV, mlp, TRAIN)  # noqa: E731
    check_initial_state("train", state, fresh)
    legacy = eqx.tree_at(lambda s: s.key, state, jax.random.key_data(state.key))
    check_initial_state("train", legacy, fresh)


def test_training_from_a_state_leaves_the_callers_state_usable():
    """The compiled chunks donate their input; `train` hands them a copy
    of `initial_state`, so one loaded state can start several runs."""
    state = init_state(ENV, mlp, TRAIN)
    first = train(ENV, mlp, TRAIN, initial_state=state)
    arrays = [x for x in jax.tree.leaves(state) if isinstance(x, jax.Array)]
    assert arrays and not any(x.is_deleted() for x in arrays)
    second = train(ENV, mlp, TRAIN, initial_state=state)
    for a, b in zip(
        jax.tree.leaves(eqx.filter(first.training_state, eqx.is_array)),
        jax.tree.leaves(eqx.filter(second.training_state, eqx.is_array)),
        strict=True,
    ):
        if jnp.issubdtype(a.dtype, jax.dtypes.prng_key):
            a, b = jax.random.key_data(a), jax.random.key_data(b)
        np.testing.assert_array_equal(a, b)


def test_a_state_trained_past_total_steps_is_refused():
    trained = train(ENV, mlp, TRAIN).training_state  # 32 env steps
    shorter = dataclasses.replace(
        TRAIN, learner=dataclasses.replace(CONFIG, total_steps=16)
    )
    with pytest.raises(
        ValueError,
        match=r"train\(initial_state=...\): the state has trained 32 env "
        r"steps, more than total_steps=16\. Fix: .*total_steps >= 32",
    ):
        train(ENV, mlp, shorter, initial_state=trained)
    finished = train(ENV, mlp, TRAIN, initial_state=trained)
    assert finished.total_steps == 32 and finished.final_metrics == {}


def test_a_state_kept_from_checkpoint_fn_is_refused_by_name():
    kept = []
    train(
        ENV,
        mlp,
        dataclasses.replace(TRAIN, checkpoint_every_steps=16),
        checkpoint_fn=lambda state, step: kept.append(state),
    )
    with pytest.raises(
        ValueError,
        match=r"train\(initial_state=...\): initial_state\.\S+ has been "
        r"deleted.*jax\.device_get",
    ):
        train(ENV, mlp, TRAIN, initial_state=kept[0])


class StepState(eqx.Module):
    """A minimal Brax-protocol state (the library's `State` would fail the
    suite's type checker on a bad reward before the library could)."""

    obs: Array
    reward: Array
    done: Array
    metrics: dict = eqx.field(default_factory=dict)
    info: dict = eqx.field(default_factory=dict)


class ShapeEnv(eqx.Module):
    """Per-env obs `(2,)` from `reset`; `step` returns the given shapes."""

    step_obs: tuple[int, ...] = eqx.field(static=True, default=(2,))
    reward: tuple[int, ...] = eqx.field(static=True, default=())
    done: tuple[int, ...] = eqx.field(static=True, default=())
    step_info: tuple[str, ...] = eqx.field(static=True, default=())
    observation_size: int = eqx.field(static=True, default=2)
    action_size: int = eqx.field(static=True, default=2)

    def reset(self, key):
        return StepState(jnp.zeros(2), jnp.zeros(self.reward), jnp.zeros(self.done))

    def step(self, state, action):
        return StepState(
            jnp.zeros(self.step_obs),
            jnp.zeros(self.reward),
            jnp.zeros(self.done),
            info={name: jnp.zeros(()) for name in self.step_info},
        )


ENV_ERRORS = [
    (
        ShapeEnv(step_obs=(3,)),
        r"env\.step returned obs of per-env shape \(3,\) and dtype float32, but the "
        r"state it was given \(from env\.reset\) has shape \(2,\) and dtype float32\. "
        r"Fix: make env\.step return obs",
    ),
    (
        ShapeEnv(reward=(1,)),
        r"env\.step returned reward of per-env shape \(1,\); expected \(\) \(one "
        r"scalar per env\)\. Fix: return a scalar reward per env",
    ),
    (
        ShapeEnv(done=(1,)),
        r"env\.step returned done of per-env shape \(1,\); expected \(\)",
    ),
    (
        ShapeEnv(step_info=("truncated",)),
        r"env\.step returned a state whose info differs from the one env\.reset "
        r"returned: info\['truncated'\] is new\. Fix: make env\.reset return every "
        r"info entry",
    ),
]


@pytest.mark.parametrize(
    "env, match", ENV_ERRORS, ids=["obs", "reward", "done", "info"]
)
def test_env_step_shapes_are_checked_in_the_rollout(getkey, env, match):
    state = init(env, mlp(getkey()), CONFIG, key=getkey())
    with pytest.raises(ValueError, match=match):
        eqx.filter_eval_shape(step, env, CONFIG, state)


@pytest.mark.parametrize(
    "env, match", ENV_ERRORS, ids=["obs", "reward", "done", "info"]
)
def test_env_step_shapes_are_checked_in_evaluation(getkey, env, match):
    with pytest.raises(ValueError, match=match):
        eqx.filter_eval_shape(
            functools.partial(eval_rollout, n_envs=4, max_episode_length=3),
            env,
            mlp(getkey()),
            getkey(),
        )


def _wrong_signature(size, *, key):
    return mlp(key)


@pytest.mark.parametrize(
    "networks, match",
    [
        (
            lambda: mlp(jax.random.key(0)),
            r"a network factory must be a function `key -> network`, called with "
            r"one PRNG key; <lambda> has the signature \(\)\. Fix: wrap it",
        ),
        (
            _wrong_signature,
            r"a network factory .* _wrong_signature has the signature "
            r"\(size, \*, key\)\. Fix: wrap it",
        ),
        (
            lambda key: (mlp(key), None),
            r"the network factory \(`key -> network`\) returned a tuple, not an "
            r"eqx_ppo network\. Fix: return the network itself",
        ),
    ],
    ids=["no-key", "other-parameters", "not-a-network"],
)
def test_network_factory_must_be_key_to_network(networks, match):
    with pytest.raises(TypeError, match=rf"train\(networks=\.\.\.\): {match}"):
        train(ENV, networks, TRAIN)


def test_student_factory_is_checked_alike(getkey):
    config = DistillationTrainConfig(
        distillation=DistillationConfig(n_envs=4, n_minibatches=1), progress=False
    )
    with pytest.raises(
        TypeError, match=r"train_distillation\(student=\.\.\.\): a network factory"
    ):
        train_distillation(ENV, mlp(getkey()), lambda: None, config)


@pytest.mark.parametrize(
    "key, seen",
    [
        (0, r"key=0\): expected a PRNG key such as jax\.random\.key\(0\), got int"),
        (np.zeros(3, np.uint32), r"key=uint32\[3\]\): .* got a uint32\[3\] array"),
        (np.zeros(2, np.float32), r"key=float32\[2\]\): .* got a float32\[2\] array"),
        (
            jax.random.split(jax.random.key(0)),
            r"key=key<fry>\[2\]\): .* got a key<fry>\[2\] array",
        ),
    ],
    ids=["int", "uint32[3]", "float32[2]", "two-keys"],
)
def test_keys_must_be_prng_keys(unchecked, getkey, key, seen):
    net = mlp(getkey())
    fix = r"\. Fix: pass a single key, e\.g\. key=jax\.random\.key\(seed\)"
    with pytest.raises(TypeError, match=rf"init\({seen}{fix}"):
        init(ENV, net, CONFIG, key=key)
    with pytest.raises(TypeError, match=rf"eval_rollout\({seen}{fix}"):
        eval_rollout(ENV, net, key, n_envs=4, max_episode_length=3)


@pytest.mark.parametrize(
    "key",
    [jax.random.PRNGKey(0), np.array([0, 1], np.uint32)],
    ids=["PRNGKey", "numpy-uint32[2]"],
)
def test_raw_key_data_is_refused_with_the_fix(unchecked, getkey, key):
    with pytest.raises(
        TypeError, match=r"ppo_init\(key=uint32\[2\]\).*jax\.random\.wrap_key_data"
    ):
        ppo_init(ENV, mlp(getkey()), CONFIG, key=key)


def test_train_keys_are_checked(unchecked, getkey):
    config = dataclasses.replace(TRAIN, n_seeds=2)
    keys = jax.random.split(getkey(), 3)
    with pytest.raises(
        ValueError, match=r"train\(key=<3 keys>\): .* needs n_seeds=3, .* Fix"
    ):
        train(ENV, mlp, config, key=keys)
    with pytest.raises(TypeError, match=r"train\(key=0\): expected a PRNG key"):
        train(ENV, mlp, config, key=0)


def test_a_batch_of_seed_keys_may_be_legacy_key_data(unchecked, getkey):
    config = dataclasses.replace(TRAIN, n_seeds=2)
    typed = jax.random.split(getkey(), 2)
    legacy = jax.random.key_data(typed)  # uint32[2, 2], as PRNGKey(...) splits
    run = functools.partial(train, ENV, mlp, config)
    from_typed, from_legacy = run(key=typed), run(key=legacy)
    assert jax.tree.all(
        jax.tree.map(
            lambda a, b: bool(np.array_equal(a, b)),
            eqx.filter(from_typed.training_state.network, eqx.is_array),
            eqx.filter(from_legacy.training_state.network, eqx.is_array),
        )
    )
    with pytest.raises(
        TypeError,
        match=r"train\(key=key<fry>\[2, 2\]\): .*Fix: pass a single key, e\.g\. "
        r"key=jax\.random\.key\(seed\) \(or one key per seed, \[n_seeds\], e\.g\. "
        r"jax\.random\.split\(key, n_seeds\)\)",
    ):
        run(key=jax.random.split(getkey(), (2, 2)))


@pytest.mark.parametrize(
    "factory, args",
    [
        ("make_mlp", (2, [8], 2)),
        ("make_mlp_actor_critic", (2, 2, [8], [8])),
        ("make_recurrent_actor_critic", (2, 2, 8)),
    ],
)
def test_factories_declare_one_typed_key(factory, args):
    # Checked at run time in the suite; raw key data is not a typed key.
    for key in (0, jax.random.PRNGKey(0)):
        with pytest.raises(TypeError, match="key"):
            getattr(eqx_ppo.nn, factory)(*args, key=key)


def test_a_network_for_another_obs_size_names_the_fix(getkey):
    factory = lambda key: make_mlp_actor_critic(3, 2, [8], [8], key=key)  # noqa: E731
    with pytest.raises(
        ValueError,
        match=r"Normalizer expects one env's input float32\[3\], got float32\[2\]\. "
        r"The sizes differ: build the network for one env's observation "
        r"\(obs_size=env\.observation_size\)",
    ):
        train(ENV, factory, TRAIN)


@pytest.mark.parametrize(
    "layer, x, match",
    [
        ("dense", jnp.zeros((5, 2)), r"input of shape \(2,\), got shape \(5, 2\)\. "),
        ("dense", jnp.zeros(3), r"input of shape \(2,\), got shape \(3,\)\. "),
        ("normalizer", jnp.zeros((5, 2)), r"float32\[2\], got float32\[5, 2\]\. "),
        ("normalizer", jnp.zeros(3), r"float32\[2\], got float32\[3\]\. "),
    ],
    ids=["dense-batched", "dense-size", "normalizer-batched", "normalizer-size"],
)
def test_input_shape_errors_tell_a_batch_from_a_wrong_size(
    unchecked, getkey, layer, x, match
):
    if layer == "dense":
        module = eqx_ppo.nn.Dense(2, 4, key=getkey())
    else:
        module = eqx_ppo.nn.Normalizer(2)
    fix = "Layers work on a single env: vmap" if x.ndim == 2 else "The sizes differ"
    with pytest.raises(ValueError, match=match + fix):
        module(module.initial_state(), x, key=getkey())


def test_record_activations_rollout_takes_keywords(getkey):
    from eqx_ppo import record_activations_rollout

    net, key = mlp(getkey()), getkey()
    acts, dones = record_activations_rollout(
        ENV, net, n_envs=2, max_episode_length=3, key=key
    )
    with pytest.warns(DeprecationWarning, match="pass n_envs=, max_episode_length="):
        old_acts, old_dones = record_activations_rollout(ENV, net, 2, 3, key)
    assert jnp.array_equal(dones, old_dones)
    assert all(
        jnp.array_equal(a, b)
        for a, b in zip(jax.tree.leaves(acts), jax.tree.leaves(old_acts), strict=True)
    )
    with pytest.raises(TypeError, match=r"missing keyword arguments \['key'\]"):
        record_activations_rollout(ENV, net, n_envs=2, max_episode_length=3)


@pytest.mark.parametrize(
    "kwargs, seen",
    [({"every_steps": 0}, "got 0"), ({"episode_length": 2.0}, "got float")],
)
def test_video_sizes_must_be_positive_ints(unchecked, kwargs, seen):
    from eqx_ppo.ppo import VideoConfig

    [(name, value)] = kwargs.items()
    with pytest.raises(
        ValueError, match=rf"VideoConfig\({name}={value!r}\): .*positive int, {seen}"
    ):
        VideoConfig(**kwargs)


@pytest.mark.parametrize("seed", [1.5, True, "3"])
def test_the_seed_must_be_an_int(unchecked, seed):
    with pytest.raises(TypeError, match=rf"TrainConfig\(seed={seed!r}\): .* an int"):
        TrainConfig(seed=seed)


class _TwoChoices(envs.AbstractEnv):
    """Dict actions of two discrete choices; reward 1 for `a == 1`, 1 for
    `b == 0`."""

    observation_size = 3
    action_size = property(lambda self: {"a": 3, "b": 2})
    n_actions = property(lambda self: {"a": 3, "b": 2})

    def reset(self, key):
        zero = jnp.zeros((), jnp.float32)
        return envs.State(zero, jnp.zeros(3), zero, zero)

    def step(self, state, action):
        reward = (action["a"] == 1).astype(jnp.float32)
        return state.replace(reward=reward + (action["b"] == 0).astype(jnp.float32))


def test_dict_discrete_actions_are_checked_key_by_key():
    env = envs.EpisodeWrapper(_TwoChoices(), 4)
    config = TrainConfig(
        learner=PPO(n_envs=2, rollout_length=4, total_steps=16, n_minibatches=1),
        eval=EvalConfig(every_steps=16, n_envs=2, max_episode_length=4),
        progress=False,
    )

    def networks(key, sizes=env.n_actions):
        return make_mlp_actor_critic(3, sizes, [8], [8], discrete=True, key=key)

    assert train(env, networks, config).total_steps == 16
    wrong = functools.partial(networks, sizes={"a": 3, "b": 4})
    with pytest.raises(
        ValueError,
        match=r"CategoricalSampler\['b'\] has 4 actions but env\.n_actions\['b'\] "
        r"= 2\. Fix",
    ):
        train(env, wrong, config)


@pytest.mark.parametrize(
    "discrete, size, fix",
    [
        (False, 3, r"build the network with the env's action_size"),
        (
            True,
            2,
            r"the network samples discrete actions, but the env is "
            r"continuous \(it has no n_actions\): build it with discrete=False",
        ),
    ],
    ids=["wrong-size", "discrete-on-continuous"],
)
def test_actions_that_do_not_fit_a_continuous_env_name_the_fix(discrete, size, fix):
    def networks(key):
        return make_mlp_actor_critic(2, size, [8], [8], discrete=discrete, key=key)

    with pytest.raises(
        ValueError,
        match=r"The network's actions do not match the env's action_size\.\n"
        rf"  network actions \(per env\): .*\n  env\.action_size: 2\nFix: {fix}",
    ):
        train(ENV, networks, TRAIN)


def discrete_mlp(key, n_logits=4):
    return make_mlp_actor_critic(5, n_logits, [8], [8], discrete=True, key=key)


@pytest.mark.parametrize("n_logits", [3, 6])
def test_categorical_samplers_must_match_env_n_actions(getkey, n_logits):
    env = envs.make("repeat_first")  # n_actions=4
    config = TrainConfig(
        learner=PPO(
            n_envs=2, rollout_length=4, total_steps=8, n_minibatches=1, n_epochs=1
        ),
        eval=EvalConfig(every_steps=8, n_envs=2, max_episode_length=4),
        progress=False,
    )
    factory = functools.partial(discrete_mlp, n_logits=n_logits)
    match = (
        rf"The network's CategoricalSampler has {n_logits} actions but "
        r"env\.n_actions = 4\. Fix: build it with action_size=env\.n_actions "
        r"\(4\), discrete=True"
    )
    with pytest.raises(ValueError, match=match):
        train(env, factory, config)
    evaluate = functools.partial(eval_rollout, n_envs=2, max_episode_length=4)
    with pytest.raises(ValueError, match=match):
        eqx.filter_eval_shape(evaluate, env, factory(getkey()), getkey())
    eqx.filter_eval_shape(evaluate, env, discrete_mlp(getkey()), getkey())


@pytest.mark.parametrize(
    "kwargs, seen",
    [
        ({"n_envs": 0}, "got 0"),
        ({"n_envs": -1}, "got -1"),
        ({"n_envs": 2.0}, "got float"),
        ({"max_episode_length": 0}, "got 0"),
    ],
)
@pytest.mark.parametrize(
    "rollout",
    [eval_rollout, record_activations_rollout],
    ids=["eval_rollout", "record_activations_rollout"],
)
def test_rollout_sizes_must_be_positive_ints(unchecked, getkey, rollout, kwargs, seen):
    [(name, value)] = kwargs.items()
    where = rollout.__name__
    sizes = {"n_envs": 2, "max_episode_length": 3} | kwargs
    with pytest.raises(
        ValueError,
        match=rf"{where}\({name}={value!r}\): {name} must be a positive int, "
        rf"{seen}\. Fix: pass an int >= 1",
    ):
        rollout(ENV, mlp(getkey()), key=getkey(), **sizes)


@pytest.mark.parametrize("n_minibatches", [1, 4])
def test_step_config_must_match_the_states_n_envs(getkey, n_minibatches):
    built = PPO(n_envs=2, rollout_length=4, n_minibatches=1)
    state = init(ENV, mlp(getkey()), built, key=getkey())
    config = PPO(n_envs=4, rollout_length=4, n_minibatches=n_minibatches)
    with pytest.raises(
        ValueError,
        match=r"step\(state=\.\.\.\): the state holds 2 envs but config\.n_envs = "
        r"4\. Fix: use the config the state was built with \(n_envs=2\)",
    ):
        eqx.filter_eval_shape(step, ENV, config, state)


def test_ppo_run_iterations_must_be_non_negative(getkey):
    state = init(ENV, mlp(getkey()), CONFIG, key=getkey())
    with pytest.raises(
        ValueError,
        match=r"ppo_run\(n_iterations=-1\): n_iterations must be an int >= 0, got "
        r"-1\. Fix: pass an int >= 0",
    ):
        ppo_run(ENV, CONFIG, state, -1)
    _, metrics = eqx.filter_eval_shape(ppo_run, ENV, CONFIG, state, 0)
    assert metrics and all(m.shape[0] == 0 for m in metrics.values())


DISTILL = DistillationTrainConfig(
    distillation=DistillationConfig(n_envs=4, n_minibatches=1), progress=False
)


@pytest.mark.parametrize(
    "config, fix",
    [
        (CONFIG, r"expected a TrainConfig, got PPOConfig\. Fix: wrap it: "),
        (
            DISTILL,
            r"expected a TrainConfig, got DistillationTrainConfig\. Fix: pass a ",
        ),
    ],
    ids=["PPOConfig", "DistillationTrainConfig"],
)
def test_train_ppo_takes_a_train_config(unchecked, config, fix):
    name = type(config).__name__
    with pytest.raises(
        TypeError,
        match=rf"train\(config={name}\(\.\.\.\)\): {fix}TrainConfig\(learner=",
    ):
        train(ENV, mlp, config)


@pytest.mark.parametrize(
    "config, fix",
    [
        (TRAIN, r"got TrainConfig\. Fix: pass a "),
        (DISTILL.distillation, r"got DistillationConfig\. Fix: wrap it: "),
    ],
    ids=["TrainConfig", "DistillationConfig"],
)
def test_train_distillation_takes_a_distillation_train_config(
    unchecked, getkey, config, fix
):
    name = type(config).__name__
    with pytest.raises(
        TypeError,
        match=rf"train_distillation\(config={name}\(\.\.\.\)\): expected a "
        rf"DistillationTrainConfig, {fix}DistillationTrainConfig\(distillation=",
    ):
        train_distillation(ENV, mlp(getkey()), mlp, config)


NOT_A_NETWORK = {
    "factory": (
        lambda state: mlp,
        r"<function>\): expected an eqx_ppo network \(an AbstractStatefulModule\), "
        r"got a function\. Fix: call the factory with a key, {arg}=factory\(key\)",
    ),
    "training-state": (
        lambda state: state,
        r"<TrainingState>\): expected an eqx_ppo network .*, got a TrainingState\. "
        r"Fix: pass its network, {arg}=state\.network",
    ),
}


@pytest.mark.parametrize("kind", NOT_A_NETWORK)
def test_network_arguments_must_be_networks(unchecked, getkey, state, kind):
    make, seen = NOT_A_NETWORK[kind]
    bad, net, key = make(state), mlp(getkey()), getkey()
    sizes = {"n_envs": 2, "max_episode_length": 3}
    calls = [
        ("init", "network", lambda: init(ENV, bad, CONFIG, key=key)),
        ("eval_rollout", "network", lambda: eval_rollout(ENV, bad, key, **sizes)),
        (
            "record_activations_rollout",
            "network",
            lambda: record_activations_rollout(ENV, bad, key=key, **sizes),
        ),
        (
            "train_distillation",
            "teacher",
            lambda: train_distillation(ENV, bad, mlp, DISTILL),
        ),
        (
            "distill_init",
            "teacher",
            lambda: distill_init(ENV, bad, net, DISTILL.distillation, key=key),
        ),
        (
            "distill_init",
            "student",
            lambda: distill_init(ENV, net, bad, DISTILL.distillation, key=key),
        ),
    ]
    for where, arg, call in calls:
        with pytest.raises(TypeError, match=rf"{where}\({arg}={seen.format(arg=arg)}"):
            call()


def test_make_mesh_takes_devices(unchecked):
    from eqx_ppo import make_mesh

    with pytest.raises(
        TypeError,
        match=r"make_mesh\(devices=3\): expected a sequence of devices\. Fix: pass "
        r"a list of devices",
    ):
        make_mesh(3)
    with pytest.raises(TypeError, match=r"expected jax devices, got \['str'\]"):
        make_mesh(["cpu:0"])
    assert make_mesh(jax.devices()[:1]).axis_names == ("env",)
    device = jax.devices()[0]
    with pytest.raises(
        ValueError, match=r"make_mesh\(devices=\.\.\.\): device .* is listed twice"
    ):
        make_mesh([device, device])


def test_a_mesh_with_an_explicit_axis_is_refused_by_name():
    # `jax.make_mesh` makes its axes Explicit by default; the evaluation, run on
    # one device, would fail deep inside JAX.
    mesh = jax.make_mesh((1,), ("env",))
    with pytest.raises(
        ValueError,
        match=r"train\(mesh=\.\.\.\): the axis 'env' has type Explicit; eqx_ppo "
        r"places arrays itself and needs Auto\. Fix: eqx_ppo\.make_mesh\(devices\)",
    ):
        train(ENV, mlp, TRAIN, mesh=mesh)


def lstm(key):
    return eqx_ppo.make_lstm_actor_critic(2, 2, lstm_size=8, key=key)


def test_apply_batched_takes_one_env_axis_on_every_leaf(unchecked, getkey):
    from eqx_ppo.nn import apply_batched

    net = lstm(getkey())
    with pytest.raises(ValueError, match="inconsistent sizes"):
        apply_batched(net, net.initialize_state(3), jnp.zeros((4, 2)), key=getkey())
    # One env's observation reaches the normaliser as [].
    feedforward = mlp(getkey())
    with pytest.raises(
        ValueError,
        match=r"The input has fewer axes than one env's: vmap and `apply_batched` "
        r"take the leading axis as the env axis, so give them a batch \[B, \.\.\.\]",
    ):
        apply_batched(
            feedforward, feedforward.initialize_state(2), jnp.zeros(2), key=getkey()
        )
    out = apply_batched(net, net.initialize_state(3), jnp.zeros((3, 2)), key=getkey())
    assert out.output.value_estimates.shape == (3,)


@pytest.mark.parametrize(
    "net, fix",
    [(mlp, "call the factory first"), (3, "pass a network")],
    ids=["factory", "int"],
)
def test_with_recording_needs_a_network(unchecked, net, fix):
    with pytest.raises(
        TypeError,
        match=rf"with_recording\(net=<{type(net).__name__}>\): found no layer to "
        rf"record\. Fix: {fix}",
    ):
        eqx_ppo.with_recording(net)


@pytest.mark.parametrize(
    "make, name",
    [
        (lambda v: PPO(normalize_advantages=v), "PPO(normalize_advantages"),
        (lambda v: PPO(combine_advantages=v), "PPO(combine_advantages"),
        (
            lambda v: DistillationConfig(check_finite=v),
            "DistillationConfig(check_finite",
        ),
        (lambda v: EvalConfig(enabled=v), "EvalConfig(enabled"),
        (lambda v: TrainConfig(progress=v), "TrainConfig(progress"),
    ],
)
def test_switches_must_be_bools(unchecked, make, name):
    # "false" from a YAML file or a command line would count as true.
    with pytest.raises(
        TypeError,
        match=rf"{re.escape(name)}='false'\): expected True or False, got str\. "
        r"Fix: pass a Python bool\.",
    ):
        make("false")
    make(False)


@pytest.mark.parametrize("config", [PPOConfig, EvalConfig], ids=lambda c: c.__name__)
@pytest.mark.parametrize("level", ["losses", 3])
def test_logging_levels_must_be_flags(unchecked, config, level):
    with pytest.raises(
        TypeError,
        match=rf"{config.__name__}\(logging_level={level!r}\): expected a "
        rf"LoggingLevel, got {type(level).__name__}\. Fix: combine flags, e\.g\. "
        r"logging_level=LoggingLevel\.",
    ):
        config(logging_level=level)


@pytest.mark.parametrize(
    "layer, args",
    [
        ("Dense", (2, 4)),
        ("LSTM", (2, 4)),
        ("GRU", (2, 4)),
        ("LRU", (2, 4)),
        ("MinGRU", (2, 4)),
        ("Conv2d", (3, 4, 3)),
        ("VariationalBottleneck", (2, 4)),
        ("AR1VariationalBottleneck", (2, 4)),
    ],
)
def test_layers_declare_one_typed_key(layer, args):
    # Checked at run time in the suite; raw key data is not a typed key.
    for key in (0, jax.random.PRNGKey(0)):
        with pytest.raises(TypeError, match="key"):
            getattr(eqx_ppo.nn, layer)(*args, key=key)


@pytest.mark.parametrize("learner", [CONFIG, None], ids=["PPOConfig", "None"])
def test_the_generic_engine_takes_a_learner(unchecked, getkey, state, learner):
    from eqx_ppo import init, step, train

    name = type(learner).__name__
    fix = "wrap the config in its learner" if learner is CONFIG else "pass a learner"
    calls = {
        "train": lambda: train(ENV, mlp, learner, TRAIN, key=getkey()),
        "init": lambda: init(ENV, mlp(getkey()), learner, key=getkey()),
        "step": lambda: step(ENV, learner, state),
    }
    for where, call in calls.items():
        with pytest.raises(
            TypeError,
            match=rf"{where}\(learner=<{name}>\): expected an eqx_ppo\.AbstractLearner"
            rf", got {name}\. Fix: {fix}",
        ):
            call()


def test_eval_rollout_logging_level_must_be_flags(unchecked, getkey):
    with pytest.raises(
        TypeError,
        match=r"eval_rollout\(logging_level='env'\): expected a LoggingLevel, got "
        r"str\. Fix: combine flags",
    ):
        eval_rollout(
            ENV,
            mlp(getkey()),
            getkey(),
            n_envs=2,
            max_episode_length=3,
            logging_level="env",
        )


def test_learners_take_their_own_config_and_a_network_teacher(unchecked, getkey):
    from eqx_ppo import PPO, Distillation

    teacher = mlp(getkey())
    # PPO's loss reads clip_range etc., which a DistillationConfig lacks.
    with pytest.raises(
        TypeError,
        match=r"PPO\(config=\.\.\.\): expected a PPOConfig, got DistillationConfig\.",
    ):
        PPO(DistillationConfig())
    with pytest.raises(
        TypeError,
        match=r"Distillation\(config=\.\.\.\): expected a DistillationConfig, got "
        r"PPOConfig\.",
    ):
        Distillation(CONFIG, teacher)
    with pytest.raises(
        TypeError,
        match=r"Distillation\(teacher=<function>\): expected an eqx_ppo network .* "
        r"Fix: call the factory with a key",
    ):
        Distillation(DistillationConfig(), mlp)


class _RawGymnaxEnv:
    """What a gymnax env looks like: `reset` / `step` take params."""

    default_params = None

    def reset(self, key, params=None): ...

    def step(self, key, state, action, params=None): ...

    def step_env(self, key, state, action, params): ...


NOT_AN_ENV = {
    "int": (3, r"got int\. Fix: pass an env with `reset\(key\)` and `step\(state, "),
    "class": (envs.MoveToCenter, r"got the class MoveToCenter\. Fix: pass an "),
    "gymnax": (
        _RawGymnaxEnv(),
        r"got _RawGymnaxEnv\. Fix: this looks like a gymnax env.*GymnaxAdapter\(env\)",
    ),
}


@pytest.mark.parametrize("kind", NOT_AN_ENV)
def test_env_arguments_must_be_envs(unchecked, getkey, state, kind):
    from eqx_ppo import PPO, init, step, train

    bad, seen = NOT_AN_ENV[kind]
    net, key = mlp(getkey()), getkey()
    carry = eqx_ppo.ppo.start_episodes(ENV, net, key, 2)
    sizes = {"n_envs": 2, "max_episode_length": 3}
    calls = [
        ("train", "env", lambda: train(bad, mlp, TRAIN)),
        ("train", "eval_env", lambda: train(ENV, mlp, TRAIN, eval_env=bad)),
        ("train", "env", lambda: train(bad, mlp, PPO(CONFIG), TRAIN, key=key)),
        (
            "train_distillation",
            "env",
            lambda: train_distillation(bad, net, mlp, DISTILL),
        ),
        ("init", "env", lambda: init(bad, net, PPO(CONFIG), key=key)),
        ("init", "env", lambda: init(bad, net, CONFIG, key=key)),
        (
            "distill_init",
            "env",
            lambda: distill_init(bad, net, net, DISTILL.distillation, key=key),
        ),
        ("step", "env", lambda: step(bad, PPO(CONFIG), state)),
        ("step", "env", lambda: step(bad, CONFIG, state)),
        ("eval_rollout", "env", lambda: eval_rollout(bad, net, key, **sizes)),
        (
            "record_activations_rollout",
            "env",
            lambda: record_activations_rollout(bad, net, key=key, **sizes),
        ),
        (
            "start_episodes",
            "env",
            lambda: eqx_ppo.ppo.start_episodes(bad, net, key, 2),
        ),
        (
            "run_episodes",
            "env",
            lambda: eqx_ppo.ppo.rollout(
                bad,
                net,
                carry,
                key,
                length=2,
                reset_mode="cached",
                keep_terminal_obs=False,
            ),
        ),
        ("EpisodeWrapper", "env", lambda: envs.EpisodeWrapper(bad, 10)),
        ("RewardScalingWrapper", "env", lambda: envs.RewardScalingWrapper(bad, 2.0)),
    ]
    for where, arg, call in calls:
        with pytest.raises(
            TypeError, match=rf"^{where}\({arg}=\.\.\.\): expected an env, {seen}"
        ):
            call()


def test_an_env_following_the_protocol_need_not_subclass(getkey):
    from eqx_ppo.envs._env import check_env

    class BraxLike:
        """Brax's and Playground's envs are not `AbstractEnv`s."""

        def reset(self, key): ...

        def step(self, state, action): ...

    check_env("train", "env", BraxLike())
    check_env("train", "env", envs.EpisodeWrapper(BraxLike(), 5))

    # A plain dataclass compares by value but cannot be hashed, which the
    # compiled programs' static arguments need.
    @dataclasses.dataclass
    class Unhashable(BraxLike):
        target: float = 0.5

    with pytest.raises(TypeError, match=r"train\(env=\.\.\.\):.*must be hashable"):
        check_env("train", "env", Unhashable())

    @dataclasses.dataclass(frozen=True)
    class Frozen(BraxLike):
        target: float = 0.5

    check_env("train", "env", Frozen())


@pytest.mark.parametrize(
    "env, seen", [(3, "int"), (_RawGymnaxEnv, "the class _RawGymnaxEnv")]
)
def test_gymnax_adapter_takes_a_gymnax_env(unchecked, env, seen):
    with pytest.raises(
        TypeError,
        match=rf"GymnaxAdapter\(env=\.\.\.\): expected a gymnax environment, got "
        rf"{seen}\. Fix: pass one instance",
    ):
        envs.GymnaxAdapter(env)


class _PlainTuple(nn.AbstractStatefulModule):
    def __call__(self, state, x, extras=None, *, key=None):
        return state, x, jnp.zeros(()), {}, None


class _VectorRegularization(nn.AbstractStatefulModule):
    def __call__(self, state, x, extras=None, *, key=None):
        return nn.StatefulModuleOutput(state, x, x**2, {}, None)


class _WrongReset(nn.AbstractStatefulModule):
    def initial_state(self):
        return jnp.zeros(2)

    def reset_state(self, prev_state):
        return jnp.zeros(3)

    def __call__(self, state, x, extras=None, *, key=None):
        return nn.StatefulModuleOutput(state, x, jnp.zeros(()), {}, None)


class _GrowingCarry(nn.AbstractStatefulModule):
    def initial_state(self):
        return jnp.zeros(2)

    def __call__(self, state, x, extras=None, *, key=None):
        return nn.StatefulModuleOutput(
            jnp.concatenate([state, x[:1]]), x, jnp.zeros(()), {}, None
        )


class _IntegerCounter(nn.AbstractStatefulModule):
    def initial_state(self):
        return {"count": jnp.zeros((), jnp.int32)}

    def __call__(self, state, x, extras=None, *, key=None):
        count = {"count": state["count"] / 2}  # a float: the counter's dtype changes
        return nn.StatefulModuleOutput(count, x, jnp.zeros(()), {}, None)


@pytest.mark.parametrize(
    ("layer", "error", "match"),
    [
        (_PlainTuple(), TypeError, r"_PlainTuple\.__call__ returned tuple; a layer"),
        (
            _GrowingCarry(),
            ValueError,
            r"_GrowingCarry\.__call__ returned the next_state float32\[3\] for the "
            r"carry float32\[2\]; a layer's carry must keep",
        ),
        (
            _IntegerCounter(),
            ValueError,
            r"_IntegerCounter\.__call__ returned the next_state \{'count': "
            r"'float32\[\]'\} for the carry \{'count': 'int32\[\]'\}",
        ),
        (
            _VectorRegularization(),
            ValueError,
            r"_VectorRegularization\.__call__ returned a regularization_loss of "
            r"shape \(2,\); it must be one number per env",
        ),
        (
            _WrongReset(),
            ValueError,
            r"reset_state \(or that of a layer inside it\) returned a carry of "
            r"\{0: 'float32\[3\]'.*the carry it resets is \{0: 'float32\[2\]'",
        ),
    ],
)
def test_a_custom_layer_breaking_the_contract_is_named(getkey, layer, error, match):
    env = envs.make("move_to_center")
    k1, k2 = jax.random.split(getkey())
    network = nn.Sequential(
        [
            layer,
            nn.PPOAdapter(
                action=nn.Sequential(
                    [nn.Dense(2, 4, key=k1), eqx_ppo.NormalTanhSampler(0.0)]
                ),
                value=nn.Dense(2, 1, key=k2),
            ),
        ]
    )
    config = eqx_ppo.PPO(n_envs=2, rollout_length=4, n_minibatches=1)
    with pytest.raises(error, match=match):
        state = eqx_ppo.init(env, network, config, key=getkey())
        eqx.filter_jit(eqx_ppo.step)(env, config, state)
