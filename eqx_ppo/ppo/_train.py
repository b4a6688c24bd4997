"""`train_ppo`: the driver that compiles chunks of iterations and handles host events.

The driver runs up to `K` iterations per compiled chunk and returns to Python
only for host events (logging, progress, eval, video, checkpoints). `K` is
fixed per run, so the chunk compiles once; the number of iterations a chunk
runs is a traced bound of its loop (`scan_steps`' `n_active`), so a chunk
that must stop early (an event falls inside it) skips its tail. With
`TrainConfig(n_seeds=S)` the whole chunk is `vmap`ped over seeds: one
program trains all of them.

With `mesh=` the chunk runs data-parallel under `jax.shard_map` (see
`_sharding.py`): envs are split over the mesh's devices, the rest replicated.
Host events run on process 0 only; evaluation and video use a local copy of
the network, and checkpoints receive the state gathered onto one device.
"""

import dataclasses
import functools
import math
import operator
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jaxtyping import Array, Key, PRNGKeyArray

from ..checkpoint import register_template
from ..envs._env import check_env
from ..logging import LoggingLevel
from ..nn._keys import check_key
from ..nn._module import AbstractStatefulModule
from ._config import DriverConfig, LearnerConfig, PPOConfig, TrainConfig
from ._learner import PPO, AbstractLearner, check_learner
from ._rollout import eval_rollout
from ._sharding import (
    ENV_AXIS,
    check_mesh,
    is_main_process,
    on_mesh,
    shard_state,
    to_local,
)
from ._step import TrainingState, init, scan_steps, step
from ._validate import (
    check_callbacks,
    check_config_type,
    check_initial_state,
    check_network,
    check_network_factory,
    check_resume_length,
)

NetworkOrFactory = (
    AbstractStatefulModule | Callable[[PRNGKeyArray], AbstractStatefulModule]
)


@dataclasses.dataclass(frozen=True)
class VideoData:
    """One rendered evaluation episode, passed to `video_fn`."""

    frames: np.ndarray
    step: int
    episode_reward: float
    episode_length: int


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """What `train_ppo` (and `train_distillation`) returns.

    `training_state` is a `TrainingState` (a `DistillationState` for
    distillation). With `n_seeds > 1`, every array leaf of `training_state` has
    a leading seed axis and every metric value is a list with one float per
    seed.
    """

    training_state: Any
    final_metrics: dict[str, Any]
    eval_history: list[dict[str, Any]]
    total_steps: int
    total_iterations: int


def select_seed(tree: Any, seed_index: int) -> Any:
    """Seed `seed_index`'s slice of a multi-seed result (state, network, ...).

    Every array leaf loses its leading seed axis; everything else is kept. A
    [`eqx_ppo.TrainResult`][] gives that seed's own result: its state sliced,
    and each per-seed list in `final_metrics` and `eval_history` replaced by
    the seed's value. Raises a `TypeError` if `seed_index` is not an integer
    (a `bool` would add an axis instead), a `ValueError` if the array leaves
    share no leading axis (a single-seed result) and an `IndexError` if
    `seed_index` is out of range, which JAX indexing would otherwise clamp to
    the last seed.
    """
    dtype = getattr(seed_index, "dtype", None)
    integer = (
        jnp.issubdtype(dtype, jnp.integer)
        if dtype is not None
        else isinstance(seed_index, int)
    )
    if isinstance(seed_index, bool) or not integer:
        raise TypeError(
            f"select_seed(seed_index={seed_index!r}): a seed's index is an "
            f"integer, not a {type(seed_index).__name__}. Fix: pass an int."
        )
    if isinstance(tree, TrainResult):
        state = select_seed(tree.training_state, seed_index)

        def pick(record: dict[str, Any]) -> dict[str, Any]:
            return {
                k: v[seed_index] if isinstance(v, list) else v
                for k, v in record.items()
            }

        return dataclasses.replace(
            tree,
            training_state=state,
            final_metrics=pick(tree.final_metrics),
            eval_history=[pick(record) for record in tree.eval_history],
        )
    arrays = [x for x in jax.tree.leaves(tree) if eqx.is_array(x)]
    if not arrays:
        raise ValueError(
            f"select_seed(tree=...): a {type(tree).__name__} with no array leaves, "
            "so nothing has a seed axis. Fix: pass a multi-seed TrainResult, "
            "training state or network."
        )
    sizes = sorted({x.shape[0] if x.ndim else 0 for x in arrays})
    if len(sizes) > 1 or sizes == [0]:
        raise ValueError(
            f"select_seed(tree=...): the array leaves share no leading seed axis "
            f"(leading sizes {sizes}, 0 for scalars). Fix: pass a result of "
            "TrainConfig(n_seeds > 1); a single-seed result needs no selection."
        )
    if sizes and not isinstance(seed_index, jax.core.Tracer):
        n_seeds, index = sizes[0], operator.index(seed_index)
        if not -n_seeds <= index < n_seeds:
            raise IndexError(
                f"select_seed(seed_index={index}): out of range for {n_seeds} "
                f"seeds. Fix: pass 0 <= seed_index < {n_seeds}."
            )
    return jax.tree.map(lambda x: x[seed_index] if eqx.is_array(x) else x, tree)


def _build_network(
    networks: NetworkOrFactory,
    key: PRNGKeyArray,
    where: str = "train_ppo(networks=...)",
):
    if isinstance(networks, AbstractStatefulModule):
        return networks
    if callable(networks):
        check_network_factory(networks, where)
        return check_network(networks(key), where)
    raise TypeError(
        f"{where}: expected an eqx_ppo network or a function "
        f"`key -> network`; got {type(networks).__name__}."
    )


def init_states(
    env: Any,
    networks: NetworkOrFactory,
    learner: AbstractLearner,
    config: DriverConfig,
    *,
    key: PRNGKeyArray | Key[Array, " seed"] | None = None,
) -> TrainingState:
    """The initial training state of every seed (stacked when `n_seeds > 1`),
    for `learner`; `key` as in [`eqx_ppo.train`][] (`None`: from
    `config.seed`)."""
    return _init_states(env, networks, learner, config, key, "init_states", "networks")


def _init_states(env, networks, learner, config, key, where, networks_arg):
    # Key data, not typed keys, cross the jit boundary: one compiled program
    # for every key implementation is not needed, and the data is an array.
    data = jax.random.key_data(seed_keys(where, key, config))
    label = f"{where}({networks_arg}=...)"
    if data.shape[0] == 1:
        return _init_one(env, networks, learner, label, data[0])
    return _init_stacked(env, networks, learner, label, data)


def _init_seed(env, networks, learner, label, seed_key_data):
    init_key, train_key, _ = _split_seed_key(seed_key_data)
    network = _build_network(networks, init_key, label)
    return init(env, network, learner, key=train_key)


# Module-level programs, so that a second run of the same env, networks and
# learner shapes reuses the compiled initialisation instead of tracing a new
# closure (sweeps and sequential runs paid seconds per call).
_init_one = eqx.filter_jit(_init_seed)
_init_stacked = eqx.filter_jit(
    eqx.filter_vmap(_init_seed, in_axes=(None, None, None, None, 0))
)


def init_state(
    env: Any,
    networks: NetworkOrFactory,
    config: TrainConfig,
    *,
    key: PRNGKeyArray | Key[Array, " seed"] | None = None,
) -> TrainingState:
    """The initial PPO training state of every seed (stacked when
    `n_seeds > 1`); `key` as in [`eqx_ppo.train_ppo`][]."""
    return _init_states(
        env, networks, PPO(config.ppo), config, key, "train_ppo", "networks"
    )


register_template(
    TrainConfig, lambda config, env, networks: init_state(env, networks, config)
)


def seed_keys(
    where: str, key: PRNGKeyArray | Key[Array, " seed"] | None, config: Any
) -> Key[Array, " seed"]:
    """One key per seed, `[n_seeds]`: from `key`, or from `config.seed`.

    `key=None` gives seed `i` the key `jax.random.key(config.seed + i)`. A
    single key is split into `n_seeds` keys (used as is for one seed); a
    batch of keys `[S]` (typed, or legacy `uint32[S, 2]` key data) gives one
    per seed and must have `S == n_seeds`.
    """
    n_seeds = config.n_seeds
    if key is None:
        return jnp.stack([jax.random.key(config.seed + i) for i in range(n_seeds)])
    if eqx.is_array(key) and key.dtype == np.uint32 and key.ndim == 2:
        key = jax.random.wrap_key_data(key)
    typed = eqx.is_array(key) and jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
    if typed and key.ndim == 1:
        if key.shape[0] != n_seeds:
            raise ValueError(
                f"{where}(key=<{key.shape[0]} keys>): one key per seed needs "
                f"n_seeds={key.shape[0]}, but the config has "
                f"n_seeds={n_seeds}. Fix: set TrainConfig(n_seeds="
                f"{key.shape[0]}), or pass one key to split."
            )
        return key
    check_key(
        where,
        key,
        several="or one key per seed, [n_seeds], e.g. jax.random.split(key, n_seeds)",
    )
    if not typed:
        key = jax.random.wrap_key_data(key)
    return key[None] if n_seeds == 1 else jax.random.split(key, n_seeds)


def _split_seed_key(key_data: Array) -> Key[Array, "3"]:
    """A seed's network-init, training and evaluation keys."""
    return jax.random.split(jax.random.wrap_key_data(key_data), 3)


def eval_keys(keys: Key[Array, " seed"]) -> Key[Array, " seed"]:
    """Each seed's evaluation key (the same at every evaluation of the run)."""
    return jax.vmap(lambda k: _split_seed_key(k)[2])(jax.random.key_data(keys))


@eqx.filter_jit(donate="all-except-first")
def _run_chunk(static: tuple, state: Any, n_active: Array):
    step, chunk, n_seeds, mesh = static
    if mesh is None:
        return _chunk(state, step, chunk, n_seeds, n_active)
    return on_mesh(_chunk_on_axis, mesh, state, step, chunk, n_seeds, n_active)


def _chunk_on_axis(
    state: Any, step: Callable, chunk: int, n_seeds: int, n_active: Array
):
    step = functools.partial(step, axis_name=ENV_AXIS)
    return _chunk(state, step, chunk, n_seeds, n_active)


def _chunk(state: Any, step: Callable, chunk: int, n_seeds: int, n_active: Array):
    def chunk_one(s):
        return scan_steps(step, s, chunk, n_active)

    if n_seeds == 1:
        return chunk_one(state)
    return eqx.filter_vmap(chunk_one)(state)


@eqx.filter_jit
def _evaluate(env, network, key, eval_config):
    return eval_rollout(
        env,
        eqx.nn.inference_mode(network),
        key,
        n_envs=eval_config.n_envs,
        max_episode_length=eval_config.max_episode_length,
        logging_level=eval_config.logging_level,
        logging_percentiles=eval_config.logging_percentiles,
    )


def _host(metrics: dict[str, Any], n_seeds: int, index: int | None = None):
    host = jax.device_get(metrics)
    out = {}
    for k, v in host.items():
        v = np.asarray(v, np.float64)
        if index is not None:
            v = v[..., index]
        out[k] = float(v) if n_seeds == 1 else [float(x) for x in v]
    return out


def _period(every_steps: int, steps_per_iteration: int) -> int:
    return max(1, math.ceil(every_steps / steps_per_iteration))


def train_ppo(
    env: Any,
    networks: NetworkOrFactory,
    config: TrainConfig | None = None,
    *,
    log_fn: Callable[[dict[str, Any], int], None] | None = None,
    video_fn: Callable[[VideoData], None] | None = None,
    checkpoint_fn: Callable[[TrainingState, int], None] | None = None,
    eval_env: Any = None,
    initial_state: TrainingState | None = None,
    mesh: Mesh | None = None,
    key: PRNGKeyArray | Key[Array, " seed"] | None = None,
) -> TrainResult:
    """Train a PPO agent; see the module docstring for how the work is compiled.

    **Arguments:**

    - `env`: a Brax / Playground-protocol env (single-env `reset` / `step`).
    - `networks`: a network ending in a `PPOAdapter`, or a function
      `key -> network` (each seed then gets its own initialisation).
    - `config`: a [`eqx_ppo.TrainConfig`][].
    - `key`: the run's randomness. One key is split into `n_seeds` seed keys
      (used as is when `n_seeds=1`); a batch of keys `[n_seeds]` (typed, or
      legacy `uint32[n_seeds, 2]` key data) gives each seed its own. Each
      seed key is split once into the network initialisation, training and
      evaluation keys. `None` (default) uses
      `jax.random.key(config.seed + i)` for seed `i`. When resuming from
      `initial_state`, the training key comes from the state; pass the
      original `key` (or seed) so evaluations draw the same noise as in an
      uninterrupted run.
    - `log_fn`: called `(metrics, step)` once per iteration, in order, with
      eval metrics merged in when an eval ran. The calls come in a burst
      when each compiled chunk of iterations returns (`log_every_steps`), not
      as each iteration ends: time a run by `step` (that iteration's env
      steps) or `throughput/train_sps`, not by when `log_fn` is called.
    - `video_fn`: called with [`eqx_ppo.VideoData`][] when `config.video` is
      enabled and the eval env has `render`.
    - `checkpoint_fn`: called `(training_state, step)` every
      `checkpoint_every_steps` steps and at the end, after `log_fn` has
      logged that step (so a killed run has logged up to its last
      checkpoint). The next compiled chunk reuses (donates) the state's
      buffers, so save it or keep a host copy (`jax.device_get`) inside the
      call; a reference kept as it is is refused as `initial_state`, and
      raises "Array has been deleted" when read.
    - `eval_env`: the env for evaluation (default: `env`).
    - `initial_state`: resume from this state instead of a fresh one (e.g.
      from [`eqx_ppo.load_checkpoint`][]); the run trains a copy, so the state
      stays usable. Training continues from its `iteration` up to
      `config.ppo.total_steps` (a state that has trained more is refused);
      host events keep their absolute cadence, so a resumed run logs,
      evaluates and checkpoints at the same steps as an uninterrupted one.
    - `mesh`: train data-parallel over the devices of this 1-D
      `jax.sharding.Mesh` with axis `"env"` (see `eqx_ppo.make_mesh`):
      env states, carries and rollouts are split over the devices, the network
      and optimiser state replicated. `n_envs` must be divisible by the number
      of devices times `n_minibatches`. `None` (default) trains on one device.
      With several processes (`jax.distributed.initialize()`), every process
      calls `train_ppo` identically; `log_fn`, `video_fn`, `checkpoint_fn`
      and evaluation run on process 0 only. The returned `training_state` is
      sharded like the run; `checkpoint_fn` receives it gathered onto one
      device, so checkpoints load on any number of devices.
    """
    config = TrainConfig() if config is None else config
    check_config_type("train_ppo", config, TrainConfig, "ppo", PPOConfig)
    hosts = _Hosts(log_fn, video_fn, checkpoint_fn, eval_env, initial_state, mesh)
    return _train(env, networks, PPO(config.ppo), config, key, hosts, "train_ppo")


def train(
    env: Any,
    networks: NetworkOrFactory,
    learner: AbstractLearner,
    config: DriverConfig,
    *,
    key: PRNGKeyArray | Key[Array, " seed"] | None = None,
    log_fn: Callable[[dict[str, Any], int], None] | None = None,
    video_fn: Callable[[VideoData], None] | None = None,
    checkpoint_fn: Callable[[TrainingState, int], None] | None = None,
    eval_env: Any = None,
    initial_state: TrainingState | None = None,
    mesh: Mesh | None = None,
) -> TrainResult:
    """Train `networks` with any learner: the driver behind `train_ppo` and
    `train_distillation`.

    `learner` is an [`eqx_ppo.AbstractLearner`][] (e.g. `eqx_ppo.PPO(ppo_config)`)
    and `config` a [`eqx_ppo.DriverConfig`][] (a `TrainConfig` works: its
    `ppo` field is then ignored in favour of `learner.config`). The other
    arguments are [`eqx_ppo.train_ppo`][]'s.
    """
    check_learner("train", learner)
    hosts = _Hosts(log_fn, video_fn, checkpoint_fn, eval_env, initial_state, mesh)
    return _train(env, networks, learner, config, key, hosts, "train")


class _Hosts(NamedTuple):
    """The host-side arguments every driver entry point passes on."""

    log_fn: Callable[[dict[str, Any], int], None] | None
    video_fn: Callable[[VideoData], None] | None
    checkpoint_fn: Callable[[TrainingState, int], None] | None
    eval_env: Any
    initial_state: TrainingState | None
    mesh: Mesh | None


def _train(
    env: Any,
    networks: NetworkOrFactory,
    learner: AbstractLearner,
    config: DriverConfig,
    key: PRNGKeyArray | Key[Array, " seed"] | None,
    hosts: _Hosts,
    where: str,
    networks_arg: str = "networks",
) -> TrainResult:
    """`train`, with error messages naming the entry point `where` and its
    network argument `networks_arg`."""
    check_env(where, "env", env)
    if hosts.eval_env is not None:
        check_env(where, "eval_env", hosts.eval_env)
    check_callbacks(
        where,
        log_fn=hosts.log_fn,
        video_fn=hosts.video_fn,
        checkpoint_fn=hosts.checkpoint_fn,
    )
    iteration = learner.config
    if hosts.mesh is not None:
        check_mesh(hosts.mesh, iteration.n_envs, iteration.n_minibatches, where=where)
    keys = seed_keys(where, key, config)

    def fresh():
        return _init_states(env, networks, learner, config, key, where, networks_arg)

    check_initial_state(where, hosts.initial_state, fresh)
    if hosts.initial_state is None:
        state = fresh()
    else:
        check_resume_length(where, hosts.initial_state, iteration)
        # The chunks donate their input: they get a copy, so the caller's state
        # (a loaded checkpoint, say) can start another run.
        state = jax.tree.map(
            lambda x: x.copy() if isinstance(x, jax.Array) else x,
            hosts.initial_state,
        )
    return _drive(
        jax.tree_util.Partial(step, env, learner),
        state,
        keys,
        config,
        iteration,
        eval_env=env if hosts.eval_env is None else hosts.eval_env,
        log_fn=hosts.log_fn,
        video_fn=hosts.video_fn,
        checkpoint_fn=hosts.checkpoint_fn,
        mesh=hosts.mesh,
    )


def _drive(
    step_fn: Callable[[Any], tuple[Any, dict[str, Array]]],
    state: Any,
    keys: Key[Array, " seed"],
    config: DriverConfig,
    iteration_config: LearnerConfig,
    *,
    eval_env: Any,
    log_fn: Callable[[dict[str, Any], int], None] | None,
    video_fn: Callable[[VideoData], None] | None,
    checkpoint_fn: Callable[[Any, int], None] | None,
    mesh: Mesh | None = None,
) -> TrainResult:
    """The host loop of [`eqx_ppo.train`][]: compiled chunks between host events.

    `step_fn` is a pytree callable (`jax.tree_util.Partial`) `state -> (state,
    metrics)`; `keys` are the seed keys (evaluation and video draw from them);
    `config` provides the driver settings (`eval`, `video`, `n_seeds`,
    `checkpoint_every_steps`, `log_every_steps`, `progress`) and
    `iteration_config` the run length and logging (`steps_per_iteration`,
    `n_iterations`, `total_steps`, `logging_level`, `check_finite`);
    `state.network` is the network to evaluate and render. `mesh` (checked
    by the caller) places the state on the mesh and runs the chunks sharded.
    """
    if mesh is not None:
        state = shard_state(state, mesh)
    main = is_main_process()
    # Host events see unsharded copies: evaluation then runs on one device, and
    # a checkpoint does not depend on the mesh it was written from.
    local = (lambda tree: tree) if mesh is None else to_local
    n_seeds = config.n_seeds
    spi = iteration_config.steps_per_iteration
    total_iterations = iteration_config.n_iterations

    eval_every = _period(config.eval.every_steps, spi) if config.eval.enabled else None
    ckpt_every = (
        _period(config.checkpoint_every_steps, spi)
        if checkpoint_fn is not None
        else None
    )
    video_every = (
        _period(config.video.every_steps, spi)
        if config.video.enabled and video_fn is not None
        else None
    )
    log_every = (
        _period(config.log_every_steps, spi)
        if config.log_every_steps is not None
        else max(1, math.ceil(total_iterations / 50))
    )
    periods = [p for p in (eval_every, ckpt_every, video_every, log_every) if p]
    chunk = min(periods)

    evaluation_keys = eval_keys(keys)
    eval_history: list[dict[str, Any]] = []
    final_metrics: dict[str, Any] = {}
    iteration = int(np.max(jax.device_get(state.iteration)))
    start_iteration = iteration
    # One rate: env steps over all seeds; the total is what the run really
    # takes (whole iterations), so the bar never runs past it.
    progress = _progress(
        config.progress and main,
        iteration * spi * n_seeds,
        total_iterations * spi * n_seeds,
    )

    throughput = LoggingLevel.THROUGHPUT in iteration_config.logging_level

    def run_eval(step: int) -> dict[str, Any]:
        network = local(state.network)
        with _CompileTimer() as timer:
            if n_seeds == 1:
                metrics = _evaluate(eval_env, network, evaluation_keys[0], config.eval)
            else:
                metrics = eqx.filter_vmap(
                    lambda net, k: _evaluate(eval_env, net, k, config.eval)
                )(network, evaluation_keys)
            metrics = _host(metrics, n_seeds)
        eval_history.append({"step": step, **metrics})
        if throughput:
            eval_steps = config.eval.n_envs * config.eval.max_episode_length
            metrics["throughput/eval_sps"] = eval_steps * n_seeds / timer.running
        if progress is not None:
            progress.set_postfix(eval_return=_mean(metrics["eval/episode_reward/mean"]))
        return metrics

    def due(every: int | None, it: int) -> bool:
        return every is not None and (it % every == 0 or it == total_iterations)

    def host_events(it: int, metrics: dict[str, Any]) -> dict[str, Any]:
        """Evaluate, render, log and checkpoint iteration `it`, as due."""
        step = it * spi
        if main and due(eval_every, it):
            metrics = {**metrics, **run_eval(step)}
        if main and due(video_every, it):
            network = local(state.network)
            video_key = jax.random.fold_in(evaluation_keys[0], step)
            with _CompileTimer() as timer:
                rendered = _record_video(
                    eval_env, network, config, video_fn, video_key, step
                )
            if throughput and rendered:
                metrics = {**metrics, "throughput/video_sps": rendered / timer.running}
        # Logged before it is checkpointed: a run killed in between, resumed
        # from that checkpoint, has logged every step up to it.
        if main and log_fn is not None and (metrics or it > 0):
            log_fn(metrics, step)
        if due(ckpt_every, it):
            # Gathering a sharded state is a collective: every process joins.
            saved = local(state)
            if main:
                checkpoint_fn(saved, step)
        return metrics

    if iteration == 0:
        host_events(0, {})

    static = (step_fn, chunk, n_seeds, mesh)
    while iteration < total_iterations:
        next_stop = min(
            [total_iterations] + [(iteration // p + 1) * p for p in periods]
        )
        n_active = next_stop - iteration
        with _CompileTimer() as timer:
            state, chunk_metrics = _run_chunk(static, state, jnp.asarray(n_active))
            chunk_metrics = jax.device_get(chunk_metrics)
        if iteration_config.check_finite:
            _raise_if_nonfinite(
                chunk_metrics, iteration, n_active, n_seeds, iteration_config
            )
            # The flags are for the driver; log_fn gets the metrics only.
            chunk_metrics = {
                k: v for k, v in chunk_metrics.items() if not k.startswith("debug/")
            }
        for i in range(n_active):
            it = iteration + i + 1
            metrics = _host(chunk_metrics, n_seeds, index=i)
            metrics["total_steps"] = it * spi
            if throughput:
                metrics["throughput/train_sps"] = (
                    n_active * spi * n_seeds / timer.running
                )
            if i == n_active - 1:
                metrics = host_events(it, metrics)
            elif main and log_fn is not None:
                log_fn(metrics, it * spi)
            final_metrics = metrics
        iteration = next_stop
        if progress is not None:
            progress.set_description("train")
            progress.update(n_active * spi * n_seeds)
    if progress is not None:
        progress.close()
    return TrainResult(
        training_state=state,
        final_metrics=final_metrics,
        eval_history=eval_history,
        total_steps=iteration * spi,
        total_iterations=iteration - start_iteration,
    )


class _CompileTimer:
    """The seconds JAX spends tracing, lowering and compiling while the
    context is open (`seconds`, from `jax.monitoring`), and the wall time
    left for running (`running`, once closed), so that the throughput of a
    chunk that compiled counts its running time only."""

    _EVENTS = (
        "/jax/core/compile/jaxpr_trace_duration",
        "/jax/core/compile/jaxpr_to_mlir_module_duration",
        "/jax/core/compile/backend_compile_duration",
    )

    def __enter__(self) -> "_CompileTimer":
        self.seconds = 0.0
        jax.monitoring.register_event_duration_secs_listener(self._add)
        self._start = time.perf_counter()
        return self

    def _add(self, event: str, duration: float, **kwargs: Any) -> None:
        if event in self._EVENTS:
            self.seconds += duration

    def __exit__(self, *exc_info: Any) -> None:
        self.running = time.perf_counter() - self._start - self.seconds
        jax.monitoring.unregister_event_duration_listener(self._add)


def _mean(value: float | Sequence[float]) -> str:
    return f"{float(np.mean(value)):.3g}"


def _progress(enabled: bool, initial: int, total: int):
    """A bar of env steps over all seeds; it says "compiling" until the first
    compiled chunk returns (the driver then sets "train")."""
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(
        total=total,
        initial=initial,
        unit="env-step",
        unit_scale=True,
        desc="compiling",
    )


_ENV_FIX = (
    "The env's `step` returned NaN or inf: check it (run it with "
    "`jax.config.update('jax_debug_nans', True)`)."
)


def _nonfinite_fix(what: str, config: LearnerConfig) -> str:
    """What to change for a non-finite `what`, in the learner config's terms."""
    if what in ("observation", "reward"):
        return _ENV_FIX
    clipping = (
        "set `gradient_clipping`"
        if config.gradient_clipping is None
        else "keep `gradient_clipping` on"
    )
    if what == "loss":
        stop = ", or set `target_kl`" if hasattr(config, "target_kl") else ""
        return (
            "The observations and rewards were finite, so the update diverged: "
            f"lower `learning_rate`, {clipping}{stop}."
        )
    return (
        "The loss was finite, so the optimiser step overflowed: lower "
        f"`learning_rate` or `weight_decay`, {clipping}."
    )


def _raise_if_nonfinite(
    chunk_metrics: dict,
    iteration: int,
    n_active: int,
    n_seeds: int,
    config: LearnerConfig,
) -> None:
    """Raise for the chunk's first iteration with a non-finite value, naming
    what (observation, reward, loss, parameters), the env and the seed, and
    the fix in `config`'s terms."""

    def per_iteration(name):
        flags = np.asarray(chunk_metrics[name])
        return flags.reshape(n_seeds, -1)[:, :n_active]

    obs_env = per_iteration("debug/nonfinite_obs_env")
    reward_env = per_iteration("debug/nonfinite_reward_env")
    checks = [
        ("observation", obs_env >= 0, obs_env),
        ("reward", reward_env >= 0, reward_env),
        ("loss", ~per_iteration("debug/finite_loss"), None),
        ("updated parameters", ~per_iteration("debug/finite_params"), None),
    ]
    bad_iterations = np.stack([bad for _, bad, _ in checks]).any(axis=(0, 1))
    if not bad_iterations.any():
        return
    i = int(np.argmax(bad_iterations))
    what, bad, env = next(c for c in checks if c[1][:, i].any())
    seed = int(np.argmax(bad[:, i]))
    where = "" if env is None else f" from env {int(env[seed, i])}"
    if n_seeds > 1:
        where += f" (seed index {seed})"
    raise FloatingPointError(
        f"Non-finite {what}{where} at iteration {iteration + i + 1}; training "
        "stopped, and no state from that iteration on was returned or "
        f"checkpointed. {_nonfinite_fix(what, config)} To train on regardless, set "
        "`check_finite=False`."
    )


def _record_video(eval_env, network, config, video_fn, key, step) -> int:
    """Render one episode of seed 0's network with `key`, for `video_fn`; the
    number of env steps rolled out (0 for an env without `render`)."""
    render = getattr(eval_env, "render", None)
    if render is None:
        return 0
    from ._video import rollout_for_video

    network = network if config.n_seeds == 1 else select_seed(network, 0)
    states, reward, length = rollout_for_video(
        eval_env, network, config.video.episode_length, key
    )
    frames = render(states, **config.video.render_kwargs)
    video_fn(
        VideoData(
            frames=np.stack([np.asarray(f) for f in frames]),
            step=step,
            episode_reward=float(reward),
            episode_length=int(length),
        )
    )
    return config.video.episode_length
