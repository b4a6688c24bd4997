"""Training runs of the benchmarked systems, in worker processes.

`python -m benchmarks._worker '<Spec json>'` trains one system once,
evaluates with the shared deterministic evaluator, and prints one JSON line:
throughput, compile time, peak RSS and the final return. Only the system
under test is imported.

`python -m benchmarks._worker --session '<json>'` runs several runs one
after another in one process (`_common.run_session`): on a TPU, opening the
chip costs more than a run, and only one process can hold it. Each result is
printed as its run ends.

Every eqx_ppo training call of the benchmarks is in this module (the
multi-seed CartPole of `seeds_at_scale` included), so a change of the
training API changes this file.
"""

import dataclasses
import functools
import importlib
import json
import os
import sys
import time
from typing import Any

from ._common import (
    BASELINE_ENV,
    EPISODE_LENGTH,
    PLAYGROUND,
    Boundaries,
    Spec,
    emit,
    eqx_env,
    evaluate,
    peak_rss_mb,
    raw_env,
    serve_session,
)


def install_brax_shim() -> None:
    """Brax 0.14 calls `jax.device_put_replicated`, which JAX 0.10 removed.

    Rebuild it as an identity `pmap` over the stacked copies. The axis name
    must be Brax's own (`"i"`): arrays whose sharding names another axis make
    Brax's first `training_epoch` call compile a second time.
    """
    import jax
    import jax.numpy as jnp

    if hasattr(jax, "device_put_replicated"):
        return

    def device_put_replicated(x, devices):
        stacked = jax.tree.map(lambda a: jnp.stack([jnp.asarray(a)] * len(devices)), x)
        return jax.pmap(lambda t: t, axis_name="i", devices=devices)(stacked)

    jax.device_put_replicated = device_put_replicated


# ---------------------------------------------------------------------- eqx_ppo


def eqx_network(spec: Spec, env, key):
    import eqx_ppo

    if spec.policy == "mlp":
        return eqx_ppo.make_mlp_actor_critic(
            env.observation_size,
            env.action_size,
            list(spec.hidden),
            list(spec.hidden),
            key=key,
            activation="swish",
            entropy_weight=spec.entropy_weight,
            **spec.eqx_network_options,
        )
    return eqx_ppo.make_lstm_actor_critic(
        env.observation_size,
        env.action_size,
        spec.lstm_size,
        key=key,
        actor_hidden_sizes=list(spec.hidden),
        critic_hidden_sizes=list(spec.hidden),
        activation="swish",
        entropy_weight=spec.entropy_weight,
    )


def ppo_settings(spec: Spec) -> dict[str, Any]:
    """The PPO settings of `spec` under the names eqx_ppo's `PPO` and nnx-ppo's
    `PPOConfig` share, so both systems are configured from one place."""
    return dict(
        n_envs=spec.n_envs,
        rollout_length=spec.rollout_length,
        total_steps=spec.run_steps,
        gae_lambda=spec.gae_lambda,
        discounting_factor=spec.discount,
        clip_range=spec.clip_range,
        learning_rate=spec.learning_rate,
        n_epochs=spec.n_epochs,
        n_minibatches=spec.n_minibatches,
    )


def eqx_config(spec: Spec):
    import eqx_ppo

    if spec.driver_eval:
        evaluation = eqx_ppo.EvalConfig(
            every_steps=spec.run_steps,
            n_envs=spec.eval_envs,
            max_episode_length=EPISODE_LENGTH[spec.env],
            logging_percentiles=None,
        )
    else:
        evaluation = eqx_ppo.EvalConfig(enabled=False)
    settings = {**ppo_settings(spec), **spec.eqx_ppo_options}
    if _before_redesign(eqx_ppo):
        learner = {"ppo": eqx_ppo.PPOConfig(**settings)}
    else:
        learner = {"learner": eqx_ppo.PPO(**settings)}
    return eqx_ppo.TrainConfig(
        **learner,
        eval=evaluation,
        seed=spec.seed,
        n_seeds=spec.n_seeds,
        log_every_steps=spec.chunk_steps,
        progress=False,
    )


def _before_redesign(eqx_ppo: Any) -> bool:
    """Whether `eqx_ppo` is a `base` checkout from before the learner redesign
    (637070d and earlier): settings in `TrainConfig(ppo=PPOConfig(...))`,
    trained by `train_ppo`."""
    return hasattr(eqx_ppo, "PPOConfig")


def run_eqx(spec: Spec, env: Any = None) -> dict[str, Any]:
    """Train with eqx_ppo; pass `env` to reuse one env object (and so the
    compiled chunk) across runs in one process."""
    import equinox as eqx
    import jax

    import eqx_ppo

    env = eqx_env(spec.env) if env is None else env
    timer = Boundaries(spec)
    train_env = env
    if spec.reward_scaling != 1.0:
        train_env = eqx_ppo.envs.RewardScalingWrapper(env, spec.reward_scaling)
    train = eqx_ppo.train_ppo if _before_redesign(eqx_ppo) else eqx_ppo.train
    result = train(
        train_env,
        functools.partial(eqx_network, spec, env),
        eqx_config(spec),
        log_fn=lambda metrics, step: timer.mark(step),
    )
    out = timer.summary()
    out["peak_rss_mb"] = peak_rss_mb()  # training only, before evaluation
    if spec.evaluate:
        network = result.training_state.network
        if spec.n_seeds > 1:
            network = jax.tree.map(lambda x: x[0] if eqx.is_array(x) else x, network)
        network = eqx.nn.inference_mode(network)
        params, static = eqx.partition(network, eqx.is_array)

        def act(params, carry, obs, key):
            net = eqx.combine(params, static)
            o = eqx_ppo.apply_batched(net, carry, obs, key=key)
            return o.next_state, o.output.actions

        out["eval_return"] = evaluate(
            env,
            act,
            params,
            network.initialize_state(spec.eval_envs),
            spec,
        )
    return out


# ---------------------------------------------------------------------- nnx-ppo


class NnxTruncation:
    """Presents eqx_ppo's time-limit flag the way nnx-ppo reads it.

    eqx_ppo's `EpisodeWrapper` writes `info["truncation"]` (Brax's name);
    nnx-ppo 0.3.0 reads `info["truncated"]`. Both systems then step the very
    same env code.
    """

    def __init__(self, env):
        self.env = env

    def _mark(self, state):
        flag = state.info["truncation"].astype(bool)
        return state.replace(info={**state.info, "truncated": flag})

    def reset(self, key):
        return self._mark(self.env.reset(key))

    def step(self, state, action):
        return self._mark(self.env.step(state, action))

    @property
    def observation_size(self):
        return self.env.observation_size

    @property
    def action_size(self):
        return self.env.action_size


def nnx_network(spec: Spec, obs_size: int, action_size: int):
    from flax import nnx
    from nnx_ppo.networks.adapter import PPOAdapter
    from nnx_ppo.networks.containers import Sequential
    from nnx_ppo.networks.factories import make_mlp_actor_critic, make_mlp_layers
    from nnx_ppo.networks.normalizer import Normalizer
    from nnx_ppo.networks.recurrent import LSTM
    from nnx_ppo.networks.sampling_layers import NormalTanhSampler

    rngs = nnx.Rngs(spec.seed)
    if spec.policy == "mlp":
        return make_mlp_actor_critic(
            obs_size,
            action_size,
            list(spec.hidden),
            list(spec.hidden),
            rngs,
            activation="swish",
            entropy_weight=spec.entropy_weight,
        )
    kernel_init = nnx.initializers.variance_scaling(1.0, "fan_in", "uniform")

    def port(out_size):
        lstm = LSTM(obs_size, spec.lstm_size, rngs, kernel_init=kernel_init)
        mlp = make_mlp_layers(
            [spec.lstm_size, *spec.hidden, out_size],
            rngs,
            nnx.swish,
            activation_last_layer=False,
            kernel_init=kernel_init,
        )
        return [lstm, *mlp]

    sampler = NormalTanhSampler(
        rngs, entropy_weight=spec.entropy_weight, min_std=0.1, std_scale=1.0
    )
    adapter = PPOAdapter(
        action=Sequential([*port(2 * action_size), sampler]),
        value=Sequential(port(1)),
    )
    return Sequential([Normalizer(obs_size), adapter])


def run_nnx(spec: Spec) -> dict[str, Any]:
    from flax import nnx
    from nnx_ppo.algorithms import config as nnx_config, ppo as nnx_ppo

    base = eqx_env(spec.env)
    env = NnxTruncation(base)
    timer = Boundaries(spec)
    network = nnx_network(spec, env.observation_size, env.action_size)
    # nnx-ppo 0.3.0's own API (a PPOConfig under TrainConfig(ppo=...), train_ppo),
    # not eqx_ppo's.
    config = nnx_config.TrainConfig(
        ppo=nnx_config.PPOConfig(**ppo_settings(spec)),
        eval=nnx_config.EvalConfig(enabled=False),
        seed=spec.seed,
        checkpoint_every_steps=10**15,
    )
    nnx_ppo.train_ppo(
        env, network, config, log_fn=lambda metrics, step: timer.mark(int(step))
    )
    out = timer.summary()
    out["peak_rss_mb"] = peak_rss_mb()  # training only, before evaluation
    if spec.evaluate:
        network.eval()
        graphdef, state = nnx.split(network)

        def act(state, carry, obs, key):
            del key
            o = nnx.merge(graphdef, state)(carry, obs)
            return o.next_state, o.output.actions

        out["eval_return"] = evaluate(
            base,
            act,
            state,
            network.initialize_state(spec.eval_envs),
            spec,
        )
    return out


# ------------------------------------------------------------------------- Brax


def run_brax(spec: Spec) -> dict[str, Any]:
    if spec.policy != "mlp":
        raise ValueError("Brax PPO has no recurrent policy")
    install_brax_shim()
    import jax
    from brax.training.agents.ppo import networks as brax_networks, train as brax_ppo

    env = raw_env(spec.env)
    if spec.env in PLAYGROUND:
        # Playground's own training wrappers, as its Brax PPO recipes use.
        from mujoco_playground import wrapper

        options = {"wrap_env_fn": wrapper.wrap_for_brax_training}
    else:
        options = {}
    timer = Boundaries(spec)
    make_networks = functools.partial(
        brax_networks.make_ppo_networks,
        policy_hidden_layer_sizes=spec.hidden,
        value_hidden_layer_sizes=spec.hidden,
        activation=jax.nn.swish,
    )
    make_policy, params, _ = brax_ppo.train(
        env,
        num_timesteps=spec.run_steps,
        num_envs=spec.n_envs,
        episode_length=EPISODE_LENGTH[spec.env],
        unroll_length=spec.rollout_length,
        batch_size=spec.n_envs // spec.n_minibatches,
        num_minibatches=spec.n_minibatches,
        num_updates_per_batch=spec.n_epochs,
        num_evals=spec.n_chunks + 1,
        run_evals=False,
        normalize_observations=True,
        network_factory=make_networks,
        learning_rate=spec.learning_rate,
        entropy_cost=spec.entropy_weight,
        discounting=spec.discount,
        gae_lambda=spec.gae_lambda,
        clipping_epsilon=spec.clip_range,
        vf_loss_coefficient=1.0,
        normalize_advantage=True,
        seed=spec.seed,
        reward_scaling=spec.reward_scaling,
        progress_fn=lambda step, metrics: timer.mark(int(step)),
        **options,
        **spec.brax_options,
    )
    out = timer.summary()
    out["peak_rss_mb"] = peak_rss_mb()  # training only, before evaluation
    if spec.evaluate:

        def act(params, carry, obs, key):
            return carry, make_policy(params, deterministic=True)(obs, key)[0]

        out["eval_return"] = evaluate(
            eqx_env(spec.env),
            act,
            params,
            (),
            spec,
        )
    return out


# ------------------------------------------------------------------------ rejax


def gymnax_view(env, episode_length: int):
    """eqx_ppo's time-limited env behind the gymnax `Environment` API rejax steps.

    `step` auto-resets on `done` and returns the five values rejax 0.1.3
    unpacks (gymnax 1.0's own `step` returns six and needs a `time` field).
    rejax treats every `done` as terminal (it has no truncation flag), so a
    time-limit end is not bootstrapped there.
    """
    import jax
    from flax import struct
    from gymnax.environments import environment, spaces

    @struct.dataclass
    class Params:
        max_steps_in_episode: int = episode_length

    class View(environment.Environment):
        @property
        def default_params(self):
            return Params()

        def step(self, key, state, action, params=None):
            state = env.step(state, action)
            reward, done = state.reward, state.done.astype(bool)
            fresh = env.reset(key)
            state = jax.tree.map(lambda a, b: jax.lax.select(done, a, b), fresh, state)
            return state.obs, state, reward, done, {}

        def reset(self, key, params=None):
            state = env.reset(key)
            return state.obs, state

        def action_space(self, params=None):
            return spaces.Box(-1.0, 1.0, (env.action_size,))

        def observation_space(self, params=None):
            return spaces.Box(-float("inf"), float("inf"), (env.observation_size,))

    return View()


_REJAX_TIMER: list[Boundaries] = []
"""The timer of the rejax run in progress: the compiled program's callback
reads it from here, so one program serves every run of a session."""
_REJAX_PROGRAMS: dict[str, tuple[Any, Any]] = {}


def _mark_rejax_chunk(step) -> None:
    _REJAX_TIMER[-1].mark(int(step))


def _rejax_program(spec: Spec):
    """rejax's algorithm and its jitted `train` for `spec`, built once per
    setting (its seed aside): a later run of a session reuses the compiled
    program, as eqx_ppo's reuses its chunk."""
    import jax
    from rejax import PPO

    key = dataclasses.replace(spec, seed=0, evaluate=False).to_json()
    if key in _REJAX_PROGRAMS:
        return _REJAX_PROGRAMS[key]
    env = gymnax_view(eqx_env(spec.env), EPISODE_LENGTH[spec.env])

    def mark_chunk(algo, ts, rng):
        jax.debug.callback(_mark_rejax_chunk, ts.global_step)
        return ()

    algo = PPO.create(
        env=env,
        num_envs=spec.n_envs,
        num_steps=spec.rollout_length,
        num_minibatches=spec.n_minibatches,
        num_epochs=spec.n_epochs,
        total_timesteps=spec.run_steps,
        eval_freq=spec.chunk_steps,
        skip_initial_evaluation=True,
        learning_rate=spec.learning_rate,
        gamma=spec.discount,
        gae_lambda=spec.gae_lambda,
        clip_eps=spec.clip_range,
        ent_coef=spec.entropy_weight,
        vf_coef=1.0,
        max_grad_norm=0.5,
        normalize_observations=True,
        agent_kwargs={"hidden_layer_sizes": spec.hidden, "activation": "swish"},
    ).replace(eval_callback=mark_chunk)
    _REJAX_PROGRAMS[key] = algo, jax.jit(algo.train)
    return _REJAX_PROGRAMS[key]


def run_rejax(spec: Spec) -> dict[str, Any]:
    """rejax's PPO: its whole run is one compiled program; the timer reads its
    per-chunk evaluation callback, which here only marks the time.

    What it cannot match: minibatches of single transitions (ours are whole
    env sequences), `max_grad_norm` clips element-wise (ours by global norm;
    set to 0.5 like ours), the value loss is always clipped at `clip_eps`,
    actor and critic have separate Adam states, and time-limit ends are
    treated as terminal.
    """
    if spec.policy != "mlp":
        raise ValueError("rejax PPO has no recurrent policy")
    import jax

    algo, train = _rejax_program(spec)
    timer = Boundaries(spec)
    _REJAX_TIMER.append(timer)
    try:
        ts, _ = jax.block_until_ready(train(jax.random.key(spec.seed)))
    finally:
        _REJAX_TIMER.pop()
    out = timer.summary()
    out["peak_rss_mb"] = peak_rss_mb()  # training only, before evaluation
    if spec.evaluate:
        actor = algo.actor

        def act(params, carry, obs, key):
            obs = algo.normalize_obs(params["rms"], obs)
            mean = actor.apply(params["actor"], obs, method="_action_dist").mean()
            return carry, jax.numpy.clip(mean, -1.0, 1.0)

        params = {"actor": ts.actor_ts.params, "rms": ts.obs_rms_state}
        out["eval_return"] = evaluate(eqx_env(spec.env), act, params, (), spec)
    return out


# --------------------------------------------------------- seeds at scale


def seeds_env(name: str):
    """`gymnax:CartPole-v1` (discrete, gymnax's 500-step limit) or the built-in
    `cartpole` (gym's dynamics with a continuous force, 500 steps)."""
    from eqx_ppo import envs

    if name == "cartpole":
        return envs.make("cartpole", episode_length=EPISODE_LENGTH["cartpole"])
    return envs.make(name)


def seeds_factory(env, settings: dict[str, Any]):
    """`key -> network`: actor and critic MLPs of `settings["hidden"]`, no
    observation normalisation (PureJaxRL's CartPole network)."""
    import eqx_ppo

    n_actions = getattr(env, "n_actions", None)

    def make(key):
        return eqx_ppo.make_mlp_actor_critic(
            env.observation_size,
            env.action_size if n_actions is None else n_actions,
            list(settings["hidden"]),
            list(settings["hidden"]),
            key=key,
            activation=settings["activation"],
            discrete=n_actions is not None,
            normalize_obs=False,
            entropy_weight=settings["entropy_weight"],
        )

    return make


def seeds_config(settings: dict[str, Any]):
    """The multi-seed `TrainConfig` of `settings` (a `seeds_at_scale.Settings`
    as a dict): `n_seeds` seeds in one program, no evaluation while training,
    the run in `chunks` compiled chunks."""
    import eqx_ppo

    per_iteration = settings["n_envs"] * settings["rollout_length"]
    iterations = -(-settings["steps"] // per_iteration)
    chunk = -(-iterations // settings["chunks"])
    return eqx_ppo.TrainConfig(
        learner=eqx_ppo.PPO(
            n_envs=settings["n_envs"],
            rollout_length=settings["rollout_length"],
            total_steps=iterations * per_iteration,
            n_epochs=settings["n_epochs"],
            n_minibatches=settings["n_minibatches"],
            learning_rate=settings["learning_rate"],
            lr_schedule=settings["lr_schedule"],
            discounting_factor=settings["discount"],
            gae_lambda=settings["gae_lambda"],
            clip_range=settings["clip_range"],
            critic_loss_weight=settings["critic_loss_weight"],
            gradient_clipping=settings["gradient_clipping"],
            normalize_advantages=settings["normalize_advantages"],
        ),
        eval=eqx_ppo.EvalConfig(enabled=False),
        n_seeds=settings["n_seeds"],
        seed=settings["seed"],
        log_every_steps=chunk * per_iteration,
        progress=False,
    )


def train_seeds(settings: dict[str, Any]) -> dict[str, Any]:
    """Train `n_seeds` seeds in one program and score each seed's final policy.

    `train_wall_s` is the `train` call, compilation included, up to the
    trained state on the host side of the device; `eval_wall_s` the final
    deterministic evaluation of every seed (one episode on each of
    `eval_envs` envs, in one vmapped program), apart.
    """
    import equinox as eqx
    import jax
    import numpy as np

    import eqx_ppo

    env = seeds_env(settings["env"])
    config = seeds_config(settings)
    t0 = time.perf_counter()
    result = eqx_ppo.train(env, seeds_factory(env, settings), config)
    jax.block_until_ready(result.training_state)
    train_wall = time.perf_counter() - t0

    @eqx.filter_jit
    def evaluate_all(networks, keys):
        def one(network, key):
            return eqx_ppo.eval_rollout(
                env,
                eqx.nn.inference_mode(network),
                key,
                n_envs=settings["eval_envs"],
                max_episode_length=settings["episode_length"],
            )["eval/episode_reward/mean"]

        return eqx.filter_vmap(one)(networks, keys)

    t1 = time.perf_counter()
    keys = jax.random.split(
        jax.random.key(settings["seed"] + 10**6), settings["n_seeds"]
    )
    returns = np.asarray(evaluate_all(result.training_state.network, keys))
    return {
        "train_wall_s": train_wall,
        "eval_wall_s": time.perf_counter() - t1,
        "steps_per_seed": result.total_steps,
        "iterations": result.total_iterations,
        "final_returns": returns.tolist(),
        "peak_rss_mb": peak_rss_mb(),
    }


def seeds_memory(settings: dict[str, Any], n_seeds: int) -> dict[str, Any]:
    """XLA's memory account of one compiled chunk of `n_seeds` seeds.

    The program is the driver's own chunk of iterations over the seeds,
    compiled from the state's shapes alone: nothing is allocated on the
    device. `peak_bytes` = arguments + outputs -
    their aliases (the donated state) + scratch.
    """
    import equinox as eqx
    import jax

    import eqx_ppo

    env = seeds_env(settings["env"])
    config = seeds_config({**settings, "n_seeds": n_seeds})
    make = seeds_factory(env, settings)
    iterations = config.log_every_steps // config.learner.steps_per_iteration

    def init(key):
        network_key, train_key = jax.random.split(key)
        return eqx_ppo.init(env, make(network_key), config.learner, key=train_key)

    keys = jax.random.split(jax.random.key(0), n_seeds)
    shapes = eqx.filter_eval_shape(eqx.filter_vmap(init), keys)
    dynamic, static = eqx.partition(
        shapes, lambda x: isinstance(x, jax.ShapeDtypeStruct)
    )

    from eqx_ppo.ppo._chunk import Chunk, seeds_chunk

    program = Chunk(
        jax.tree_util.Partial(eqx_ppo.step, env, config.learner), iterations, None
    )

    def chunk(d):
        n_active = jax.numpy.asarray(iterations)
        return seeds_chunk(eqx.combine(d, static), program, n_active)

    t0 = time.perf_counter()
    compiled = jax.jit(chunk, donate_argnums=0).lower(dynamic).compile()
    compile_s = time.perf_counter() - t0
    m = compiled.memory_analysis()
    out = {
        "n_seeds": n_seeds,
        "compile_s": compile_s,
        "argument_bytes": m.argument_size_in_bytes,
        "output_bytes": m.output_size_in_bytes,
        "alias_bytes": m.alias_size_in_bytes,
        "temp_bytes": m.temp_size_in_bytes,
    }
    out["peak_bytes"] = (
        out["argument_bytes"]
        + out["output_bytes"]
        - out["alias_bytes"]
        + out["temp_bytes"]
    )
    out["device_bytes"], out["device_bytes_source"] = device_memory()
    return out


def device_memory() -> tuple[int | None, str]:
    """The memory one device can hold: its allocator's limit (TPU, GPU), or
    on a CPU backend the host's RAM."""
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    if "bytes_limit" in stats:
        return int(stats["bytes_limit"]), "device allocator limit (memory_stats)"
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024, "host RAM (MemTotal)"
    except OSError:
        pass
    return None, "unknown"


RUNNERS = {
    "eqx": run_eqx,
    "base": run_eqx,
    "nnx": run_nnx,
    "brax": run_brax,
    "rejax": run_rejax,
}


_SYSTEM_MODULES = {
    "eqx": ("eqx_ppo",),
    "brax": ("brax.training.agents.ppo.train", "brax.envs"),
    "rejax": ("rejax", "gymnax"),
    "nnx": ("nnx_ppo.algorithms.ppo",),
}


def warm_up(systems: set[str]) -> None:
    """Import the systems' code, open the device and compile a small training
    step (an MLP's gradient and an Adam update in a scan, vmapped, random
    numbers; and a `pmap`, as Brax runs its epochs): first-use costs that
    the first run of a process would otherwise count as its compile time."""
    if "brax" in systems:
        install_brax_shim()
    for system in sorted(systems):
        for module in _SYSTEM_MODULES.get(system, ()):
            importlib.import_module(module)
    import jax
    import jax.numpy as jnp
    import optax

    optimizer = optax.chain(optax.clip_by_global_norm(0.5), optax.adam(1e-3))

    def loss(w, x):
        return jnp.mean(jnp.tanh(jnp.tanh(x @ w[0]) @ w[1]) ** 2)

    def train(key):
        w = jax.random.normal(key, (2, 8, 8))
        state = optimizer.init(w)

        def step(carry, k):
            w, state = carry
            x = jax.random.normal(k, (16, 8))
            grads = jax.vmap(jax.grad(loss), in_axes=(None, 0))(w, x[:, None])
            updates, state = optimizer.update(jnp.mean(grads, 0), state, w)
            return (optax.apply_updates(w, updates), state), loss(w, x)

        return jax.lax.scan(step, (w, state), jax.random.split(key, 4))[1]

    jax.block_until_ready(jax.jit(train)(jax.random.key(0)))
    jax.block_until_ready(jax.pmap(lambda x: x + 1)(jnp.ones((1, 2))))


class _Session:
    """Runs a session's items; eqx_ppo runs of one env share the env object, so
    a later run of a setting reuses its compiled programs (rejax's reuse theirs
    through `_rejax_program`; Brax and nnx-ppo trace anew each run)."""

    def __init__(self):
        self.envs: dict[str, Any] = {}

    def __call__(self, item: dict[str, Any]) -> dict[str, Any]:
        spec = Spec.from_json(item["spec"])
        if spec.system == "base":
            raise ValueError("a session cannot run the baseline checkout's eqx_ppo")
        if spec.system == "eqx":
            if spec.env not in self.envs:
                self.envs[spec.env] = eqx_env(spec.env)
            run = functools.partial(run_eqx, spec, self.envs[spec.env])
        else:
            run = functools.partial(RUNNERS[spec.system], spec)
        t0 = time.perf_counter()
        if item.get("compile_events"):
            from .compile_time import CompileEvents

            with CompileEvents() as events:
                out = run()
            out["compile_events"] = events.records
        else:
            out = run()
        out["run_wall_s"] = time.perf_counter() - t0
        out["system"] = spec.system
        return out


def main() -> None:
    if sys.argv[1] == "--session":
        items = json.loads(sys.argv[2])["items"]
        specs = [Spec.from_json(item["spec"]) for item in items]
        serve_session(
            sys.argv[2], _Session(), lambda: warm_up({s.system for s in specs})
        )
        return
    spec = Spec.from_json(sys.argv[1])
    if spec.system == "base":
        # The baseline checkout's eqx_ppo shadows this one (`python -m` puts
        # this checkout first on the path); the benchmark code stays this one's.
        sys.path.insert(0, os.environ[BASELINE_ENV])
    out = RUNNERS[spec.system](spec)
    if spec.system in ("eqx", "base"):
        import eqx_ppo

        out["eqx_ppo_path"] = eqx_ppo.__file__
    out["peak_rss_with_eval_mb"] = peak_rss_mb()
    out["system"] = spec.system
    emit(out)


if __name__ == "__main__":
    main()
