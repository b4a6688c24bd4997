"""`train`: the driver that runs compiled chunks of iterations between host events.

Between two host events (evaluation, video, logging, checkpoints) one
compiled chunk runs the iterations in a loop with a traced bound, so one
program serves every chunk. Inside the driver the state always has a leading
seed axis; it is squeezed only in what the user sees when `n_seeds=1`. Host
events run on process 0 only.
"""

import concurrent.futures
import math
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jaxtyping import Array, Key

from .._typecheck import checked
from ..checkpoint import register_template
from ..envs._env import check_env
from ..logging import LoggingLevel
from ..nn._module import AbstractStatefulModule
from . import _guard
from ._chunk import Chunk, compile_chunk, over_seeds, seed_zero, with_seed_axis
from ._config import TrainConfig
from ._host import CompileTimer, Progress, paused_gc, record_video, to_host
from ._result import Metrics, TrainResult, VideoData
from ._rollout import eval_rollout
from ._sharding import check_mesh, to_local
from ._step import TrainingState, fresh_state, schedule_horizon, shard_state, step
from ._validate import check_initial_state, check_resumed_progress, seed_axis_hint

NetworkOrFactory = (
    AbstractStatefulModule | Callable[[Key[Array, ""]], AbstractStatefulModule]
)


def _key_args(key: Key[Array, ""] | Key[Array, " seed"] | None, config: TrainConfig):
    """`_split_keys`' arguments for `train`'s `key` (checked) and `config`."""
    n = config.n_seeds
    if key is not None and key.ndim > 0 and key.shape[0] != n:
        raise ValueError(
            f"train(key=<{key.shape[0]} keys>): one key per seed needs n_seeds="
            f"{key.shape[0]}, but the config has n_seeds={n}. Fix: set "
            f"TrainConfig(n_seeds={key.shape[0]}), or pass one key to split."
        )
    return key, np.uint32(config.seed), n


def _split_keys(key, seed, n: int) -> tuple[Array, Array, Array]:
    """Each seed's (init, train, eval) keys, as three stacks: the one place
    they are split (see `train`'s `key`). With no `key`, seed `i`'s is
    `jax.random.key(seed + i)`."""
    if key is None:
        key = jax.vmap(jax.random.key)(jnp.arange(n, dtype=jnp.uint32) + seed)
    elif key.ndim == 0:
        key = key[None] if n == 1 else jax.random.split(key, n)
    return tuple(jax.vmap(lambda k: jax.random.split(k, 3), out_axes=1)(key))


# One program, not an eager op each (each a compile on a TPU).
_split_keys_jit = jax.jit(_split_keys, static_argnums=2)


def _seed_keys(key: Key[Array, ""] | Key[Array, " seed"] | None, config: TrainConfig):
    """Each seed's (init, train, eval) keys, `[n_seeds]` each."""
    return _split_keys_jit(*_key_args(key, config))


# Module level, so a second run of the same env, networks and learner reuses
# the compiled program instead of tracing a new closure. The keys are split
# inside: a program of their own would be compiled before this one is traced,
# on the way to the first chunk.
@eqx.filter_jit
def _init_seeds(env, networks, learner, key, seed, n_seeds: int):
    """Each seed's fresh training state, and each seed's eval key."""
    init_keys, train_keys, eval_keys = _split_keys(key, seed, n_seeds)

    def init_seed(keys):
        init_key, train_key = keys
        network = networks
        if not isinstance(networks, AbstractStatefulModule):
            network = networks(init_key)
        if not isinstance(network, AbstractStatefulModule):
            raise TypeError(
                f"train(networks=...): the network factory returned a "
                f"{type(network).__name__}, not an eqx_ppo network. Fix: return the "
                "network itself, e.g. `make_mlp_actor_critic(..., key=key)`."
            )
        return fresh_state(env, network, learner, train_key)

    return over_seeds(init_seed, (init_keys, train_keys)), eval_keys


_first_seed = eqx.filter_jit(seed_zero)  # One program, not one per leaf.


def _initial_states(
    env: Any, networks: NetworkOrFactory, config: TrainConfig
) -> TrainingState:
    """The fresh states of `train` with `key=None`, as the user sees them:
    `load_checkpoint(env=, networks=)`'s template."""
    states, _ = _init_seeds(env, networks, config.learner, *_key_args(None, config))
    return states if config.n_seeds > 1 else _first_seed(states)


register_template(TrainConfig, _initial_states)


@eqx.filter_jit
def _evaluate(env, networks, keys, config):
    def one(network, key):
        return eval_rollout(
            env,
            eqx.nn.inference_mode(network),
            key,
            n_envs=config.n_envs,
            max_episode_length=config.max_episode_length,
            logging_level=config.logging_level,
            logging_percentiles=config.logging_percentiles,
        )

    return over_seeds(lambda seed: one(*seed), (networks, keys))


class _Schedule(NamedTuple):
    """Which iterations have host events: every `eval`, `video`, `checkpoint`
    and `log` iterations (`None`: never), and the last one, `total`. Logging
    defaults to about 50 chunks a run, of at least 5 iterations: on a TPU a
    chunk boundary costs ~2.5 ms of host time, which the next chunk hides
    only if it runs longer (`benchmarks/README.md`, "Short runs")."""

    eval: int | None
    video: int | None
    checkpoint: int | None
    log: int
    total: int

    @classmethod
    def of(cls, config: TrainConfig, checkpoints: bool, videos: bool) -> "_Schedule":
        spi, total = config.learner.steps_per_iteration, config.learner.n_iterations

        def every(steps: int, on: bool) -> int | None:
            return max(1, math.ceil(steps / spi)) if on else None

        log = config.log_every_steps
        return cls(
            eval=every(config.eval.every_steps, config.eval.enabled),
            video=every(config.video.every_steps, config.video.enabled and videos),
            checkpoint=every(config.checkpoint_every_steps, checkpoints),
            log=every(log, True) if log is not None else max(5, math.ceil(total / 50)),
            total=total,
        )

    def due(self, every: int | None, iteration: int) -> bool:
        return every is not None and (iteration % every == 0 or iteration == self.total)

    def needs_states(self, iteration: int) -> bool:
        """Whether an event at `iteration` reads the states (evaluation,
        video, checkpoint), not only the metrics."""
        return any(
            self.due(e, iteration) for e in (self.eval, self.video, self.checkpoint)
        )

    @property
    def chunk_length(self) -> int:
        """The longest chunk: every stop falls within the log and eval periods.
        The config alone sets it, so a run resumed without `checkpoint_fn` or
        `video_fn` runs the same program, bit for bit."""
        return min(p for p in (self.eval, self.log, self.total) if p)

    @property
    def periods(self) -> list[int]:
        return [p for p in (self.eval, self.video, self.checkpoint, self.log) if p]

    def next_stop(self, iteration: int) -> int:
        return min([self.total] + [(iteration // p + 1) * p for p in self.periods])


@checked
def train(
    env: Any,
    networks: NetworkOrFactory,
    config: TrainConfig,
    *,
    key: Key[Array, ""] | Key[Array, " seed"] | None = None,
    log_fn: Callable[[Metrics, int], None] | None = None,
    video_fn: Callable[[VideoData], None] | None = None,
    checkpoint_fn: Callable[[TrainingState, int], None] | None = None,
    eval_env: Any = None,
    initial_state: TrainingState | None = None,
    mesh: Mesh | None = None,
) -> TrainResult:
    """Train `networks` with `config.learner`: the one driver for every learner.

    **Arguments:**

    - `env`: a Brax / Playground-protocol env (single-env `reset` / `step`).
    - `networks`: a network ending in a `PPOAdapter`, or a function `key -> network`.
    - `config`: a [`eqx_ppo.TrainConfig`][].
    - `key`: one key (split per seed), one key per seed, or `None` (`config.seed`).
    - `log_fn`: called `(metrics, step)` once per iteration, in order.
    - `video_fn`: called with seed 0's [`eqx_ppo.VideoData`][] when video is on.
    - `checkpoint_fn`: called `(training_state, step)` on its cadence and at the end.
    - `eval_env`: the env for evaluation (default: `env`).
    - `initial_state`: resume from this state (e.g. [`eqx_ppo.load_checkpoint`][]).
    - `mesh`: train data-parallel over a [`eqx_ppo.make_mesh`][] device mesh.

    The guides say more: keys and seeds (multi-seed), when `log_fn` and
    `checkpoint_fn` run and resuming (checkpointing), meshes (multi-device).
    """
    check_env(env)
    if eval_env is not None:
        check_env(eval_env, "eval_env")
    learner = config.learner
    if mesh is not None:
        check_mesh(mesh, learner.n_envs, learner.n_minibatches)
    schedule = _Schedule.of(config, checkpoint_fn is not None, video_fn is not None)
    chunk = Chunk(
        jax.tree_util.Partial(step, env, learner), schedule.chunk_length, mesh
    )
    if initial_state is None:
        with seed_axis_hint(networks, "networks"):
            (states, eval_keys), compiling = _initialise(
                env, networks, key, config, chunk
            )
    else:
        eval_keys = _seed_keys(key, config)[2]
        states, compiling = _resume(env, networks, config, initial_state), None
    if mesh is not None:
        states = shard_state(states, mesh)
    driver = _Driver(
        config=config,
        schedule=schedule,
        compiling=compiling or compile_chunk(chunk, states),
        eval_env=env if eval_env is None else eval_env,
        eval_keys=eval_keys,
        log_fn=log_fn,
        video_fn=video_fn,
        checkpoint_fn=checkpoint_fn,
        local=(lambda tree: tree) if mesh is None else to_local,
    )
    return driver.run(states)


@paused_gc()
def _initialise(env, networks, key, config, chunk):
    """`train`'s fresh states and eval keys, and `chunk`'s compiling program.

    The initialisation is lowered first, so that the chunk is lowered for the
    shapes it outputs and compiles while the initialisation compiles and runs
    (on a mesh, the chunk waits for the sharded states). Both compile for the
    default device: on a TPU, XLA compiles the chunk faster beside an
    initialisation for the chip than beside one for the host
    (`benchmarks/README.md`)."""
    args = (env, networks, config.learner, *_key_args(key, config))
    lowered = _init_seeds.lower(*args)
    if chunk.mesh is not None:
        return lowered.compile()(*args), None
    # The chunk's input: the states on the device.
    (device,) = jax.device_put(0).devices()
    on_device = jax.sharding.SingleDeviceSharding(device)
    shapes = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=on_device),
        lowered.lowered.out_info,
    )
    compiling = compile_chunk(chunk, lowered.postprocess(shapes)[0])
    # Committed to the device, as the chunk's outputs are: else the first
    # evaluation's program differs from the later ones' and compiles twice.
    dynamic, static = eqx.partition(lowered.compile()(*args), eqx.is_array)
    return eqx.combine(jax.device_put(dynamic, on_device), static), compiling


def _resume(env, networks, config, state):
    """The user's `state` with the driver's seed axis, checked against a fresh
    state's shapes; a copy, since the chunks donate their input."""
    check_initial_state(
        state, eqx.filter_eval_shape(_initial_states, env, networks, config)
    )
    check_resumed_progress(state, config.learner, schedule_horizon(state.opt_state))
    copy = jax.tree.map(lambda x: x.copy() if isinstance(x, jax.Array) else x, state)
    return copy if config.n_seeds > 1 else with_seed_axis(copy)


class _Dispatched(NamedTuple):
    """A chunk on the device: its iterations, its metrics (not yet read), when
    it started running and how many of those seconds went to compiling."""

    iteration: int
    stop: int
    metrics: Metrics
    start: float
    compiling: float


class _Driver(NamedTuple):
    """The host loop: compiled chunks between the schedule's events."""

    config: TrainConfig
    schedule: _Schedule
    compiling: concurrent.futures.Future
    eval_env: Any
    eval_keys: Array
    log_fn: Callable | None
    video_fn: Callable | None
    checkpoint_fn: Callable | None
    local: Callable

    def run(self, states: TrainingState) -> TrainResult:
        config, schedule, main = self.config, self.schedule, jax.process_index() == 0
        learner, n_seeds = config.learner, config.n_seeds
        spi = learner.steps_per_iteration
        start = iteration = int(np.max(jax.device_get(states.iteration)))
        history: list[Metrics] = []
        final: Metrics = {}
        progress = Progress(
            config.progress and main,
            start * spi * n_seeds,
            schedule.total * spi * n_seeds,
        )
        if iteration == 0:
            if learner.check_finite:
                obs = jax.device_get(self.local(states.env_state.obs))
                _guard.check_host_values(
                    jax.tree.map(lambda x: x[0], obs),  # NumPy: no program
                    "observation from env.reset at the start of the run",
                    "env",
                    "Check the env's reset.",
                )
            self.events(states, 0, {}, history, progress)
        queued = None  # a chunk left running while the next one is dispatched
        while iteration < schedule.total:
            stop = schedule.next_stop(iteration)
            with CompileTimer() as timer:
                states, metrics = timer.wait(self.compiling)(states, stop - iteration)
            chunk = _Dispatched(iteration, stop, metrics, timer.start, timer.seconds)
            if queued is not None:
                ready, _ = self.finish(queued, None, history, progress)
                chunk = chunk._replace(start=ready, compiling=0.0)
            if stop < schedule.total and not schedule.needs_states(stop):
                # Its metrics are read once the next chunk is on the device, so
                # the device runs on while the host logs.
                queued = chunk
            else:
                _, final = self.finish(chunk, states, history, progress)
                queued = None
            iteration = stop
        progress.close()
        states = states if n_seeds > 1 else _first_seed(states)
        return TrainResult(states, final, history, iteration * spi, iteration - start)

    def finish(self, chunk, states, history, progress) -> tuple[float, Metrics]:
        """Read `chunk`'s metrics, check them, log its rows and run the events
        at its stop (on `states`, the states it returned, if still held);
        the time its metrics were read and its last row."""
        learner, n_seeds = self.config.learner, self.config.n_seeds
        iteration, stop, metrics = chunk.iteration, chunk.stop, chunk.metrics
        n, spi = stop - iteration, learner.steps_per_iteration
        metrics = jax.device_get(metrics)
        ready = time.perf_counter()
        if learner.check_finite:
            flags = {k: metrics.pop(k) for k in list(metrics) if k.startswith("debug/")}
            _guard.raise_if_nonfinite(flags, iteration, n, learner)
        rate = n * spi * n_seeds / max(ready - chunk.start - chunk.compiling, 1e-9)
        logged = jax.process_index() == 0 and self.log_fn is not None
        throughput = self.throughput
        for i in range(n) if logged else [n - 1]:  # Rows no one reads: not made.
            row = to_host(metrics, n_seeds, i)
            row["total_steps"] = (iteration + i + 1) * spi
            if throughput:
                row["throughput/train_sps"] = rate
            if iteration + i + 1 == stop:
                row = self.events(states, stop, row, history, progress)
            else:
                self.log_fn(row, row["total_steps"])
        progress.advance(n * spi * n_seeds, chunk.compiling, rate)
        return ready, row

    @property
    def throughput(self) -> bool:
        return LoggingLevel.THROUGHPUT in self.config.learner.logging_level

    def events(self, states, iteration, row, history, progress) -> Metrics:
        """Evaluate, render, log and checkpoint at `iteration`, as due."""
        schedule, main, config = self.schedule, jax.process_index() == 0, self.config
        step_count = iteration * config.learner.steps_per_iteration
        if main and schedule.due(schedule.eval, iteration):
            network = self.local(states.network)
            with CompileTimer() as timer, paused_gc():
                metrics = _evaluate(self.eval_env, network, self.eval_keys, config.eval)
                metrics = to_host(jax.device_get(metrics), config.n_seeds)
            progress.leave_out(timer.seconds)
            if config.learner.check_finite:
                _guard.check_host_values(
                    metrics,
                    "evaluation metrics",
                    "seed",
                    "The eval env returned NaN or inf: check it.",
                )
            history.append({"step": step_count, **metrics})
            if self.throughput:
                steps = config.eval.n_envs * config.eval.max_episode_length
                metrics["throughput/eval_sps"] = steps * config.n_seeds / timer.running
            progress.show_return(metrics["eval/episode_reward/mean"])
            row = {**row, **metrics}
        if main and schedule.due(schedule.video, iteration):
            network = _first_seed(self.local(states.network))
            with CompileTimer() as timer, paused_gc():
                frames = record_video(
                    self.eval_env, network, config.video, self.eval_keys[0], step_count
                )
            progress.leave_out(timer.seconds)
            if frames is not None:
                self.video_fn(VideoData(*frames))
                if self.throughput:
                    sps = config.video.episode_length / timer.running
                    row = {**row, "throughput/video_sps": sps}
        # Logged before it is checkpointed: a run killed in between, resumed
        # from that checkpoint, has logged every step up to it.
        if main and self.log_fn is not None and (row or iteration > 0):
            self.log_fn(row, step_count)
        if schedule.due(schedule.checkpoint, iteration):
            # Gathering a sharded state is a collective: every process joins.
            saved = self.local(states)
            saved = saved if config.n_seeds > 1 else _first_seed(saved)
            if main:
                self.checkpoint_fn(saved, step_count)
        return row
