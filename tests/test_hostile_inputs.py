"""Hostile inputs to every public entry point: a wrong type for every declared
parameter, non-finite and out-of-range numbers, envs and networks that do not
fit, states that do not belong. Each is refused at construction or trace time
with an error that names the parameter (or the layer, env field or leaf),
never a shape error deep inside XLA.

The type sweep is generated from the signatures, so a new public parameter
is swept as soon as it exists; `test_the_sweep_covers_every_public_parameter`
fails for one nobody declared a type for or placed on the list of untyped
ones (those get their own cases below)."""

import dataclasses
import functools
import inspect
import math
import re
import types

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from beartype.door import is_bearable

import eqx_ppo
from eqx_ppo import analysis, envs, nn
from eqx_ppo.envs._move_to_center import MoveToCenter
from eqx_ppo.ppo._validate import check_initial_state

ENV = envs.make("move_to_center")
KEY = jax.random.key(0)
LEARNER = eqx_ppo.PPO(n_envs=4, rollout_length=4, total_steps=32, n_minibatches=1)
TRAIN = eqx_ppo.TrainConfig(learner=LEARNER, progress=False)


def mlp(key=KEY, hidden=(8,)):
    return eqx_ppo.make_mlp_actor_critic(2, 2, list(hidden), list(hidden), key=key)


NET = mlp()


def _message(error: BaseException) -> str:
    return "\n".join([str(error), *getattr(error, "__notes__", [])])


@functools.cache
def _state():
    return eqx_ppo.init(ENV, NET, LEARNER, key=KEY)


@functools.cache
def _checkpoint(folder: str):
    return eqx_ppo.save_checkpoint(folder, _state(), config=TRAIN, step=0)


def _targets(tmp: str) -> dict[str, tuple]:
    """Every public callable the sweep calls: `(callable, args, kwargs)` with
    valid values for every required parameter."""
    k = KEY
    graph = eqx_ppo.PopulationGraphBuilder()
    return {
        # Training.
        "PPO": (eqx_ppo.PPO, (), {}),
        "Distillation": (eqx_ppo.Distillation, (NET,), {}),
        "TrainConfig": (eqx_ppo.TrainConfig, (), {}),
        "EvalConfig": (eqx_ppo.EvalConfig, (), {}),
        "VideoConfig": (eqx_ppo.VideoConfig, (), {}),
        "init": (eqx_ppo.init, (ENV, NET, LEARNER), {"key": k}),
        "step": (eqx_ppo.step, (ENV, LEARNER, _state()), {}),
        "train": (eqx_ppo.train, (ENV, NET, TRAIN), {}),
        "eval_rollout": (
            eqx_ppo.eval_rollout,
            (ENV, NET, k),
            {"n_envs": 2, "max_episode_length": 3},
        ),
        "record_activations_rollout": (
            eqx_ppo.record_activations_rollout,
            (ENV, NET),
            {"n_envs": 2, "max_episode_length": 3, "key": k},
        ),
        "select_seed": (eqx_ppo.select_seed, ({"w": jnp.ones((2, 3))}, 0), {}),
        "gae": (
            eqx_ppo.gae,
            (jnp.ones((3, 2)),) * 3 + (jnp.zeros((3, 2), bool),) * 2,
            {"gamma": 0.9, "lambda_": 0.9},
        ),
        "make_mesh": (eqx_ppo.make_mesh, (), {}),
        "shard_state": (eqx_ppo.shard_state, (_state(), eqx_ppo.make_mesh()), {}),
        "shard_step": (eqx_ppo.shard_step, (lambda s: s, eqx_ppo.make_mesh()), {}),
        # Checkpoints.
        "save_checkpoint": (
            eqx_ppo.save_checkpoint,
            (f"{tmp}/save", _state()),
            {"config": TRAIN, "step": 0},
        ),
        "load_checkpoint": (
            eqx_ppo.load_checkpoint,
            (_checkpoint(f"{tmp}/saved"),),
            {"env": ENV, "networks": NET},
        ),
        "read_header": (eqx_ppo.read_header, (_checkpoint(f"{tmp}/saved"),), {}),
        "latest_checkpoint": (eqx_ppo.latest_checkpoint, (tmp,), {}),
        "list_checkpoints": (eqx_ppo.list_checkpoints, (tmp,), {}),
        "make_checkpoint_fn": (eqx_ppo.make_checkpoint_fn, (tmp, TRAIN), {}),
        # Logging and recording.
        "JSONLLogger": (eqx_ppo.JSONLLogger, (f"{tmp}/m.jsonl",), {}),
        "CSVLogger": (eqx_ppo.CSVLogger, (f"{tmp}/m.csv",), {}),
        "TensorBoardLogger": (eqx_ppo.TensorBoardLogger, (f"{tmp}/tb",), {}),
        "combine_loggers": (eqx_ppo.combine_loggers, (print,), {}),
        "with_recording": (eqx_ppo.with_recording, (NET,), {}),
        "extract_activations": (eqx_ppo.extract_activations, ({},), {}),
        "apply_batched": (
            nn.apply_batched,
            (NET, NET.initialize_state(2), jnp.ones((2, 2))),
            {"key": k},
        ),
        # Networks.
        "make_mlp": (nn.make_mlp, (2, [4], 2), {"key": k}),
        "make_mlp_actor_critic": (
            nn.make_mlp_actor_critic,
            (2, 2, [4], [4]),
            {"key": k},
        ),
        "make_recurrent_actor_critic": (
            nn.make_recurrent_actor_critic,
            (2, 2, 4),
            {"key": k},
        ),
        "make_lstm_actor_critic": (nn.make_lstm_actor_critic, (2, 2, 4), {"key": k}),
        "make_cnn_encoder": (nn.make_cnn_encoder, ((36, 36, 3),), {"key": k}),
        "Dense": (nn.Dense, (2, 3), {"key": k}),
        "LSTM": (nn.LSTM, (2, 3), {"key": k}),
        "GRU": (nn.GRU, (2, 3), {"key": k}),
        "LRU": (nn.LRU, (2, 3), {"key": k}),
        "MinGRU": (nn.MinGRU, (2, 3), {"key": k}),
        "Conv2d": (nn.Conv2d, (3, 4, 3), {"key": k}),
        "Delay": (nn.Delay, (jnp.zeros(2), 2), {}),
        "Normalizer": (nn.Normalizer, (2,), {}),
        "VariationalBottleneck": (nn.VariationalBottleneck, (2, 2), {"key": k}),
        "AR1VariationalBottleneck": (
            nn.AR1VariationalBottleneck,
            (2, 2),
            {"key": k},
        ),
        "Sequential": (nn.Sequential, ([nn.Scale(1.0)],), {}),
        "Parallel": (nn.Parallel, ({"a": nn.Scale(1.0)},), {}),
        "Concat": (nn.Concat, ({"a": nn.Scale(1.0)},), {}),
        "Merge": (nn.Merge, ({"a": nn.Scale(1.0)},), {}),
        "Map": (nn.Map, ({"a": nn.Scale(1.0)},), {}),
        "Splitter": (nn.Splitter, (), {"a": 1}),
        "Flattener": (nn.Flattener, (), {}),
        "Filter": (nn.Filter, ({"a": "b"},), {}),
        "Scale": (nn.Scale, (1.0,), {}),
        "PPOAdapter": (nn.PPOAdapter, (nn.Scale(1.0), nn.Scale(1.0)), {}),
        "NormalTanhSampler": (nn.NormalTanhSampler, (0.01,), {}),
        "NormalSampler": (nn.NormalSampler, (0.01,), {}),
        "CategoricalSampler": (nn.CategoricalSampler, (0.01, 3), {}),
        # Envs and graphs.
        "make": (envs.make, ("move_to_center",), {}),
        "EpisodeWrapper": (envs.EpisodeWrapper, (MoveToCenter(), 10), {}),
        "RewardScalingWrapper": (envs.RewardScalingWrapper, (ENV, 2.0), {}),
        "PopulationGraphBuilder.add_population": (
            graph.add_population,
            ("p", 3),
            {},
        ),
        # Analysis.
        "ablate": (
            analysis.ablate,
            (NET, lambda n: n.layers[1].action.layers[0], [0]),
            {},
        ),
        "pca": (analysis.pca, (jnp.ones((3, 2, 4)), jnp.zeros((3, 2), bool), 2), {}),
        "linear_probe": (
            analysis.linear_probe,
            (jnp.ones((8, 3)), jnp.arange(8) % 2),
            {"key": k},
        ),
    }


UNTYPED = {
    # Anything with reset/step: checked by `check_env` (test_env_arguments...).
    "env",
    # Any pytree of arrays: a state, a tree to slice, a template.
    "state",
    "tree",
    "like",
    "config",
    "networks",
    "eval_env",
    "sample_input",
    "metadata",
    # Any number or array, traced ones included: range-checked below.
    "factor",
    "scale",
    "x",
    "extras",
    "devices",
    "env_params",
    "shape",
    "net",
    "metrics",
    "kwargs",
    "init_kwargs",
    "sizes",
    "log_fns",
    "modules",
    "step",
    "where",
    "units",
    "network",
}
"""Parameters the sweep leaves out: `Any` by design, each checked by hand."""


def _bad_value(hint):
    """A value `hint` refuses, or `None` if it takes everything tried."""
    for value in ("not-a-value", 1.5, 3, None, object()):
        if not is_bearable(value, hint):
            return value
    return None


def _sweep(targets):
    cases = []
    for name, (fn, args, kwargs) in targets.items():
        signature = inspect.signature(fn.__init__ if inspect.isclass(fn) else fn)
        positional = [
            p
            for p in signature.parameters.values()
            if p.name != "self"
            and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        for param in signature.parameters.values():
            if param.name == "self" or param.kind in (
                param.VAR_POSITIONAL,
                param.VAR_KEYWORD,
            ):
                continue
            bad = _bad_value(param.annotation)
            if param.name in UNTYPED or bad is None:
                cases.append((name, param.name, None))
                continue
            index = next((i for i, p in enumerate(positional) if p is param), None)
            if index is not None and index < len(args):
                call = (fn, args[:index] + (bad,) + args[index + 1 :], kwargs)
            else:
                call = (fn, args, {**kwargs, param.name: bad})
            cases.append((name, param.name, call))
    return cases


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    return _targets(str(tmp_path_factory.mktemp("hostile")))


def test_every_declared_parameter_refuses_a_wrong_type_by_name(targets):
    checked = 0
    for name, param, call in _sweep(targets):
        if call is None:
            continue
        fn, args, kwargs = call
        with pytest.raises((TypeError, ValueError)) as info:
            fn(*args, **kwargs)
        message = _message(info.value)
        assert param in message, (name, param, message)
        # The call is named too (by its class even where `__init__` is
        # inherited): on the first line or in a note, not only in an argument's
        # repr.
        notes = getattr(info.value, "__notes__", [])
        first = [str(info.value).splitlines()[0], *notes[-1:]]
        assert re.search(rf"\b{name}\b", "\n".join(first)), (name, message)
        checked += 1
    assert checked >= 150, checked


def test_the_sweep_covers_every_public_parameter(targets):
    """Every public callable is a target (or has no parameters a user passes),
    and every parameter is swept or on the untyped list."""
    public = {}
    for module in (eqx_ppo, nn, envs, eqx_ppo.graph, analysis):
        for attr, obj in vars(module).items():
            if attr.startswith("_") or isinstance(obj, types.ModuleType):
                continue
            if inspect.isfunction(obj) or inspect.isclass(obj):
                public[attr] = obj
    not_called = {
        # Abstract bases, results and records users receive, not build.
        "AbstractEnv", "AbstractLearner", "AbstractStatefulModule",
        "AbstractStatistics", "AbstractWrapper", "CheckpointError", "LoggingLevel",
        "Minibatch", "PPONetworkOutput", "PopulationGraph", "Recorder",
        "SequenceOutput", "State", "StatefulModuleOutput", "TrainResult",
        "TrainingState", "VideoData", "FixedPoints", "Intervention", "PCA",
        "PopulationGraphBuilder", "ACTIVATION_KEY",
        # Covered by their own tests (they import optional packages).
        "WandbLogger", "GymnaxAdapter", "fixed_points", "unit_importance",
        "plot_importance", "plot_trajectories", "plot_fixed_points",
        # Filters and hooks taking any pytree or class.
        "trainable", "coefficient", "register_config", "registered_names",
        "clamp", "perturb",
        # No parameters.
        "merged_steps",
    }  # fmt: skip
    missing = sorted(set(public) - set(targets) - not_called)
    assert not missing, missing
    uncovered = [
        (name, param)
        for name, param, call in _sweep(targets)
        if call is None and param not in UNTYPED
    ]
    assert not uncovered, uncovered


# --------------------------------------------------------- numbers out of range


@pytest.mark.parametrize("value", [math.nan, math.inf, -1.0])
@pytest.mark.parametrize(
    "build, name",
    [
        (eqx_ppo.PPO, "learning_rate"),
        (eqx_ppo.PPO, "clip_range"),
        (eqx_ppo.PPO, "discounting_factor"),
        (eqx_ppo.PPO, "gae_lambda"),
        (eqx_ppo.PPO, "critic_loss_weight"),
        (eqx_ppo.PPO, "target_kl"),
        (eqx_ppo.PPO, "value_clip_range"),
        (eqx_ppo.PPO, "reward_scaling"),
        (eqx_ppo.PPO, "gradient_clipping"),
        (eqx_ppo.PPO, "weight_decay"),
        (functools.partial(eqx_ppo.Distillation, NET), "learning_rate"),
        (functools.partial(nn.NormalTanhSampler), "entropy_weight"),
        (functools.partial(nn.CategoricalSampler, n_actions=3), "entropy_weight"),
        (functools.partial(nn.VariationalBottleneck, 2, 2, key=KEY), "kl_weight"),
        (functools.partial(nn.AR1VariationalBottleneck, 2, 2, key=KEY), "ar1_weight"),
    ],
)
def test_numbers_out_of_range_are_named(build, name, value):
    with pytest.raises(ValueError, match=rf"\b{name}\b"):
        build(**{name: value})


@pytest.mark.parametrize("value", [0, -3])
@pytest.mark.parametrize(
    "build, name",
    [
        (eqx_ppo.PPO, "n_envs"),
        (eqx_ppo.PPO, "rollout_length"),
        (eqx_ppo.PPO, "total_steps"),
        (eqx_ppo.PPO, "n_epochs"),
        (eqx_ppo.PPO, "n_minibatches"),
        (eqx_ppo.TrainConfig, "n_seeds"),
        (eqx_ppo.TrainConfig, "checkpoint_every_steps"),
        (eqx_ppo.TrainConfig, "log_every_steps"),
        (eqx_ppo.EvalConfig, "every_steps"),
        (eqx_ppo.EvalConfig, "n_envs"),
        (eqx_ppo.EvalConfig, "max_episode_length"),
        (eqx_ppo.VideoConfig, "every_steps"),
        (eqx_ppo.VideoConfig, "episode_length"),
    ],
)
def test_counts_below_one_are_named(build, name, value):
    with pytest.raises(ValueError, match=rf"\({name}={value}\): must be >= 1"):
        build(**{name: value})


@pytest.mark.parametrize(
    "kwargs",
    [
        {"learning_rate": "1e-3"},
        {"target_kl": "0.01"},
        {"target_kl": True},
        {"learning_rate": "fast"},
        {"reward_scaling": None},
        {"clip_range": None},
        {"normalize_advantages": "false"},
        {"lr_schedule": "step"},
    ],
    ids=str,
)
def test_the_issues_truthy_strings_and_nones_are_refused_by_name(kwargs):
    # Each used to be parsed, taken as true, or fail inside JAX naming no field.
    (name,) = kwargs
    with pytest.raises(TypeError) as info:
        eqx_ppo.PPO(**kwargs)
    assert name in _message(info.value)


@pytest.mark.parametrize(
    "call, name",
    [
        (
            lambda: nn.make_recurrent_actor_critic(
                2, 2, 4, key=KEY, recurrent_critic="no"
            ),
            "recurrent_critic",
        ),
        (
            lambda: nn.make_recurrent_actor_critic(
                2, 2, 4, key=KEY, trainable_initial_state="false"
            ),
            "trainable_initial_state",
        ),
        (
            lambda: nn.make_recurrent_actor_critic(
                2, 2, 4, key=KEY, parallel_replay="yes"
            ),
            "parallel_replay",
        ),
        (lambda: eqx_ppo.JSONLLogger("m.jsonl", append="no"), "append"),
    ],
    ids=["recurrent_critic", "trainable_initial_state", "parallel_replay", "append"],
)
def test_the_issues_string_switches_are_refused_by_name(call, name):
    with pytest.raises(TypeError) as info:
        call()
    assert name in _message(info.value)


# ------------------------------------------------------------------- envs


class _RawGymnaxEnv:
    """What gymnax returns: `reset(key, params)`, `step_env`, params."""

    default_params = None

    def reset(self, key, params=None): ...

    def step(self, key, state, action, params=None): ...

    def step_env(self, key, state, action, params): ...


class _BraxLike:
    """Brax's and Playground's envs are not `AbstractEnv`s."""

    def reset(self, key): ...

    def step(self, state, action): ...


@pytest.mark.parametrize(
    "bad, seen",
    [
        (3, "got int"),
        (MoveToCenter, "got the class MoveToCenter. Fix: pass an instance"),
        (_RawGymnaxEnv(), "got _RawGymnaxEnv. Fix: this looks like a gymnax env"),
        (object(), "got object. Fix: pass an env with `reset\\(key\\)`"),
    ],
    ids=["int", "class", "gymnax", "object"],
)
def test_env_arguments_must_be_envs(bad, seen):
    calls = {
        "init": lambda: eqx_ppo.init(bad, NET, LEARNER, key=KEY),
        "train": lambda: eqx_ppo.train(bad, NET, TRAIN),
        "eval_rollout": lambda: eqx_ppo.eval_rollout(
            bad, NET, KEY, n_envs=2, max_episode_length=2
        ),
        "record_activations_rollout": lambda: eqx_ppo.record_activations_rollout(
            bad, NET, n_envs=2, max_episode_length=2, key=KEY
        ),
        "EpisodeWrapper": lambda: envs.EpisodeWrapper(bad, 10),
        "RewardScalingWrapper": lambda: envs.RewardScalingWrapper(bad, 2.0),
    }
    for call in calls.values():
        with pytest.raises(TypeError, match=rf"env=\.\.\.: expected an env, {seen}"):
            call()
    with pytest.raises(TypeError, match=r"eval_env=\.\.\.: expected an env"):
        eqx_ppo.train(ENV, NET, TRAIN, eval_env=bad)


def test_an_env_following_the_protocol_need_not_subclass():
    from eqx_ppo.envs._env import check_env

    check_env(_BraxLike())
    check_env(envs.EpisodeWrapper(_BraxLike(), 5))

    # A plain dataclass compares by value but cannot be hashed, which the
    # compiled programs' static arguments need.
    @dataclasses.dataclass
    class Unhashable(_BraxLike):
        target: float = 0.5

    with pytest.raises(TypeError, match=r"env=\.\.\.:.*must be hashable"):
        check_env(Unhashable())

    @dataclasses.dataclass(frozen=True)
    class Frozen(_BraxLike):
        target: float = 0.5

    check_env(Frozen())


class StepState(eqx.Module):
    """A minimal Brax-protocol state."""

    obs: jax.Array
    reward: jax.Array
    done: jax.Array
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
        r"obs has per-env shape \(3,\) and dtype float32, not \(2,\)",
    ),
    (ShapeEnv(reward=(1,)), r"reward has per-env shape \(1,\), not \(\)"),
    (ShapeEnv(done=(1,)), r"done has per-env shape \(1,\), not \(\)"),
    (ShapeEnv(step_info=("truncated",)), r"info\['truncated'\] is new"),
]


@pytest.mark.parametrize(
    "env, match", ENV_ERRORS, ids=["obs", "reward", "done", "info"]
)
def test_env_step_outputs_are_checked_in_training_and_evaluation(env, match):
    state = eqx_ppo.init(env, NET, LEARNER, key=KEY)
    with pytest.raises(
        ValueError, match=r"env\.step returned a state whose .*" + match
    ):
        eqx.filter_eval_shape(eqx_ppo.step, env, LEARNER, state)
    evaluate = functools.partial(eqx_ppo.eval_rollout, n_envs=4, max_episode_length=3)
    with pytest.raises(ValueError, match=match):
        eqx.filter_eval_shape(evaluate, env, NET, KEY)


# -------------------------------------------------------------- networks


@pytest.mark.parametrize(
    "discrete, size, fix",
    [
        (False, 3, r"build the network with the env's action_size"),
        (True, 2, r"the network samples discrete actions, but the env is continuous"),
    ],
    ids=["wrong-size", "discrete-on-continuous"],
)
def test_actions_that_do_not_fit_a_continuous_env_name_the_fix(discrete, size, fix):
    def networks(key):
        return nn.make_mlp_actor_critic(2, size, [8], [8], discrete=discrete, key=key)

    with pytest.raises(
        ValueError,
        match=r"The network's actions do not match the env's action_size\.\n"
        rf"  network actions \(per env\): .*\n  env\.action_size: 2\nFix: {fix}",
    ):
        eqx_ppo.train(ENV, networks, TRAIN)


@pytest.mark.parametrize("n_logits", [3, 6])
def test_categorical_samplers_must_match_env_n_actions(n_logits):
    env = envs.make("repeat_first")  # n_actions=4
    network = nn.make_mlp_actor_critic(5, n_logits, [8], [8], discrete=True, key=KEY)
    with pytest.raises(
        ValueError,
        match=rf"CategoricalSampler has {n_logits} actions but env\.n_actions = 4\. "
        r"Fix: build it with action_size=env\.n_actions \(4\), discrete=True",
    ):
        eqx.filter_eval_shape(
            functools.partial(eqx_ppo.eval_rollout, n_envs=2, max_episode_length=4),
            env,
            network,
            KEY,
        )


def test_a_network_factory_that_returns_something_else_is_named():
    with pytest.raises(
        TypeError, match=r"factory returned a tuple, not an eqx_ppo network"
    ):
        eqx_ppo.train(ENV, lambda key: (mlp(key), None), TRAIN)


def test_a_network_for_another_obs_size_names_the_fix():
    factory = lambda key: nn.make_mlp_actor_critic(3, 2, [8], [8], key=key)  # noqa: E731
    with pytest.raises(ValueError, match=r"The sizes differ: build the network"):
        eqx_ppo.train(ENV, factory, TRAIN)


class _PlainTuple(nn.AbstractStatefulModule):
    def __call__(self, state, x, extras=None, *, key=None):
        return state, x, jnp.zeros(()), {}, None


class _VectorRegularization(nn.AbstractStatefulModule):
    def __call__(self, state, x, extras=None, *, key=None):
        return nn.StatefulModuleOutput(state, x, x**2, {}, None)


class _GrowingCarry(nn.AbstractStatefulModule):
    def initial_state(self):
        return jnp.zeros(2)

    def __call__(self, state, x, extras=None, *, key=None):
        return nn.StatefulModuleOutput(
            jnp.concatenate([state, x[:1]]), x, jnp.zeros(()), {}, None
        )


@pytest.mark.parametrize(
    ("layer", "error", "match"),
    [
        (_PlainTuple(), TypeError, r"_PlainTuple\.__call__ returned tuple; a layer"),
        (
            _GrowingCarry(),
            ValueError,
            r"_GrowingCarry\.__call__ returned the next_state",
        ),
        (_VectorRegularization(), ValueError, r"regularization_loss of shape \(2,\)"),
    ],
)
def test_a_custom_layer_breaking_the_contract_is_named(layer, error, match):
    k1, k2 = jax.random.split(KEY)
    network = nn.Sequential(
        [
            layer,
            nn.PPOAdapter(
                action=nn.Sequential(
                    [nn.Dense(2, 4, key=k1), nn.NormalTanhSampler(0.0)]
                ),
                value=nn.Dense(2, 1, key=k2),
            ),
        ]
    )
    with pytest.raises(error, match=match):
        state = eqx_ppo.init(ENV, network, LEARNER, key=KEY)
        eqx.filter_eval_shape(eqx_ppo.step, ENV, LEARNER, state)


# ----------------------------------------------------------------- states


def test_initial_states_of_another_network_or_config_are_named():
    state = eqx_ppo.train(ENV, mlp, TRAIN).training_state
    cases = [
        (
            functools.partial(mlp, hidden=(16,)),
            TRAIN,
            r"is float32\[2, 8\], but a fresh",
        ),
        (functools.partial(mlp, hidden=(8, 8)), TRAIN, r"structure differs"),
        (mlp, dataclasses.replace(TRAIN, n_seeds=2), r"another n_seeds or n_envs"),
        (
            mlp,
            dataclasses.replace(TRAIN, learner=dataclasses.replace(LEARNER, n_envs=8)),
            r"another n_seeds or n_envs",
        ),
    ]
    for networks, config, match in cases:
        with pytest.raises(
            ValueError, match=rf"train\(initial_state=\.\.\.\): .*{match}"
        ):
            eqx_ppo.train(ENV, networks, config, initial_state=state)
    with pytest.raises(TypeError, match="initial_state"):
        eqx_ppo.train(ENV, mlp, TRAIN, initial_state=(state,))


def test_a_state_trained_past_total_steps_is_refused():
    trained = eqx_ppo.train(ENV, mlp, TRAIN).training_state  # 32 env steps
    shorter = dataclasses.replace(
        TRAIN, learner=dataclasses.replace(LEARNER, total_steps=16)
    )
    with pytest.raises(ValueError, match=r"has trained 32 env steps, more than"):
        eqx_ppo.train(ENV, mlp, shorter, initial_state=trained)
    finished = eqx_ppo.train(ENV, mlp, TRAIN, initial_state=trained)
    assert finished.total_steps == 32 and finished.final_metrics == {}


def test_a_state_kept_from_checkpoint_fn_is_refused_by_name():
    """The chunks donate their input: a state `checkpoint_fn` kept without
    copying it to the host is deleted by the next chunk (seed-stacked states
    are handed out as they are; one seed's is a slice, so it survives)."""
    kept = []
    eqx_ppo.train(
        ENV,
        mlp,
        dataclasses.replace(TRAIN, checkpoint_every_steps=16, n_seeds=2),
        checkpoint_fn=lambda state, step: kept.append(state),
    )
    with pytest.raises(ValueError, match=r"has been deleted.*jax\.device_get"):
        eqx_ppo.train(
            ENV, mlp, dataclasses.replace(TRAIN, n_seeds=2), initial_state=kept[0]
        )


def test_training_from_a_state_leaves_the_callers_state_usable():
    """The compiled chunks donate their input; `train` hands them a copy."""
    state = eqx_ppo.train(ENV, mlp, TRAIN).training_state
    eqx_ppo.train(
        ENV,
        mlp,
        dataclasses.replace(
            TRAIN, learner=dataclasses.replace(LEARNER, total_steps=64)
        ),
        initial_state=state,
    )
    arrays = [x for x in jax.tree.leaves(state) if isinstance(x, jax.Array)]
    assert arrays and not any(x.is_deleted() for x in arrays)


def test_raw_key_data_is_refused():
    with pytest.raises(TypeError, match="key"):
        eqx_ppo.init(ENV, NET, LEARNER, key=jax.random.PRNGKey(0))
    with pytest.raises(TypeError, match="key"):
        eqx_ppo.train(ENV, NET, TRAIN, key=np.zeros((1, 2), np.uint32))
    with pytest.raises(ValueError, match=r"one key per seed needs n_seeds=3"):
        eqx_ppo.train(ENV, NET, TRAIN, key=jax.random.split(KEY, 3))


def test_matching_initial_state_passes_the_check():
    state = _state()
    check_initial_state(state, eqx.filter_eval_shape(lambda: state))
