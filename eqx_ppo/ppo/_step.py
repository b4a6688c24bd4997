"""The training state and the pure functions of training: `init`, `step` (and
their PPO shortcuts `ppo_init`, `ppo_step`) and `ppo_run`.

`init` and `step` take a learner (`_learner.py`), which says which module
acts, what the replay batch is and what the loss is; everything else (the
rollout, minibatches, the optimiser, statistics, metrics) is shared. They are
pure functions of pytrees. Networks hold non-array leaves (activation
functions, inference flags), so use Equinox's filtered transforms:
`eqx.filter_jit` them, `eqx.filter_vmap` them over keys (seeds) or over
`PPOConfig` coefficients; `ppo_run` is the `lax.scan` of `ppo_step` (it scans
only the array leaves). `ppo_step` also runs data-parallel under
`jax.shard_map` (see `eqx_ppo.shard_step`).
"""

import math
import warnings
from collections.abc import Callable
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from jax.flatten_util import ravel_pytree
from jaxtyping import Array, Bool, Float, Int, PRNGKeyArray, PyTree

from ..envs._env import check_env
from ..logging import LoggingLevel, reduce_metric
from ..nn._filters import trainable
from ..nn._keys import check_key
from ..nn._module import AbstractStatefulModule, State
from ._config import LearnerConfig, PPOConfig
from ._learner import PPO, AbstractLearner, Minibatch, check_learner
from ._rollout import StepCarry, Transition, env_keys, rollout
from ._sharding import gather_envs, pmean
from ._validate import check_int, check_network_argument


class TrainingState(eqx.Module):
    """Everything a run carries from one iteration to the next.

    **Fields:**

    - `network`: the trained network (parameters and statistics).
    - `opt_state`: the optax state of the trainable leaves.
    - `env_state`: the batched env states `[n_envs, ...]`.
    - `carry`: the batched carries `[n_envs, ...]` of the module that acts in
      the rollout: the network's own for PPO, `{"student": ...,
      "teacher": ...}` for distillation.
    - `key`: the run's PRNG key.
    - `iteration`, `steps`: int32 counters (iterations done, env steps taken).

    On a device mesh, the fields in `env_fields` are split over the devices on
    their env axis and the others are replicated.
    """

    env_fields: ClassVar[tuple[str, ...]] = ("env_state", "carry")

    network: AbstractStatefulModule
    opt_state: PyTree
    env_state: Any
    carry: State
    key: PRNGKeyArray
    iteration: Int[Array, ""]
    steps: Int[Array, ""]

    @property
    def net_state(self) -> State:
        """Deprecated name of `carry` (PPO states)."""
        _renamed("net_state", "carry")
        return self.carry

    @property
    def student(self) -> AbstractStatefulModule:
        """Deprecated name of `network` (distillation states)."""
        _renamed("student", "network")
        return self.network

    @property
    def student_state(self) -> State:
        """Deprecated name of `carry["student"]` (distillation states)."""
        _renamed("student_state", 'carry["student"]')
        return self.carry["student"]

    @property
    def teacher_state(self) -> State:
        """Deprecated name of `carry["teacher"]` (distillation states)."""
        _renamed("teacher_state", 'carry["teacher"]')
        return self.carry["teacher"]


def _renamed(old: str, new: str) -> None:
    warnings.warn(
        f"TrainingState.{old} is deprecated; use TrainingState.{new}.",
        DeprecationWarning,
        stacklevel=3,
    )


def _learning_rate(config: LearnerConfig):
    def schedule(count):
        progress = jnp.minimum(count / config.n_updates, 1.0)
        if config.lr_schedule == "linear":
            scale = 1.0 - progress
        elif config.lr_schedule == "cosine":
            scale = 0.5 * (1.0 + jnp.cos(math.pi * progress))
        else:
            scale = 1.0
        return config.learning_rate * scale

    return schedule


def make_optimizer(config: LearnerConfig) -> optax.GradientTransformation:
    """Adam (or AdamW with `weight_decay`), optional global-norm clipping and the
    learning-rate schedule, all read from `config`.

    The optimiser is rebuilt from the config wherever it is needed, so a resumed
    run or a vmapped learning-rate sweep never carries a stale optimiser.
    """
    links = []
    if config.gradient_clipping is not None:
        links.append(optax.clip_by_global_norm(config.gradient_clipping))
    links.append(optax.scale_by_adam())
    if config.weight_decay is not None:
        links.append(optax.add_decayed_weights(config.weight_decay))
    links.append(optax.scale_by_learning_rate(_learning_rate(config)))
    return _raveled(optax.chain(*links))


def _raveled(inner: optax.GradientTransformation) -> optax.GradientTransformation:
    """`inner` applied to all leaves raveled into one vector.

    A network has tens of small parameter arrays; one vector makes each update
    a handful of large fused ops instead of a handful per leaf. This is what
    `optax.flatten` does, written out because that fails on networks without
    parameters.
    """

    def init(params):
        return inner.init(ravel_pytree(params)[0])

    def update(updates, state, params=None):
        flat, unravel = ravel_pytree(updates)
        flat_params = None if params is None else ravel_pytree(params)[0]
        flat, state = inner.update(flat, state, flat_params)
        return unravel(flat), state

    return optax.GradientTransformation(init, update)


def init(
    env: Any,
    network: AbstractStatefulModule,
    learner: AbstractLearner,
    *,
    key: PRNGKeyArray,
) -> TrainingState:
    """A fresh training state: reset envs, initial carries, optimiser state.

    The carry is the acting module's (`learner.acting`), so building it also
    checks that the learner can act with `network` on `env`.
    """
    check_env("init", "env", env)
    check_network_argument("init", "network", network)
    check_learner("init", learner)
    check_key("init", key)
    config = learner.config
    reset_key, key = jax.random.split(key)
    env_state = jax.vmap(env.reset)(env_keys(reset_key, config.n_envs))
    acting = learner.acting(network, env_state.obs)
    params = eqx.filter(network, trainable(network))
    return TrainingState(
        network=network,
        opt_state=make_optimizer(config).init(params),
        env_state=env_state,
        carry=acting.initialize_state(config.n_envs),
        key=key,
        iteration=jnp.zeros((), jnp.int32),
        steps=jnp.zeros((), jnp.int32),
    )


def ppo_init(
    env: Any,
    network: AbstractStatefulModule,
    config: PPOConfig,
    *,
    key: PRNGKeyArray,
) -> TrainingState:
    """`init` with the [`eqx_ppo.PPO`][] learner."""
    check_env("ppo_init", "env", env)
    check_network_argument("ppo_init", "network", network)
    check_key("ppo_init", key)
    return init(env, network, PPO(config), key=key)


def _permutations(
    key: PRNGKeyArray, n_envs: int, n_epochs: int, n_minibatches: int
) -> Int[Array, "update m"]:
    """A fresh permutation of `n_envs` per epoch, cut into `n_minibatches`."""
    perms = jax.vmap(lambda k: jax.random.permutation(k, n_envs))(
        jax.random.split(key, n_epochs)
    )
    return perms.reshape(n_epochs * n_minibatches, n_envs // n_minibatches)


def minibatch_indices(
    key: PRNGKeyArray,
    n_envs: int,
    n_epochs: int,
    n_minibatches: int,
    axis_name: str | None = None,
) -> Int[Array, "update m"]:
    """The minibatches of one iteration: env positions, one row per update.

    Without `axis_name`, permutations of all `n_envs` envs. Under
    `jax.shard_map`, `n_envs` is this device's count and each device permutes
    only its own envs, with its own key (`fold_in(key, device)`), so
    minibatching moves no data between devices. Global minibatch `j` is the
    union of every device's local minibatch `j`: it holds exactly
    `n_envs / n_minibatches` envs of each device, a sample stratified by device
    rather than a uniform one. Every env is still used once per epoch.
    """
    if axis_name is not None:
        key = jax.random.fold_in(key, jax.lax.axis_index(axis_name))
    return _permutations(key, n_envs, n_epochs, n_minibatches)


def _inexact_leaves(tree: PyTree) -> list[Array]:
    return [
        x
        for x in jax.tree.leaves(tree)
        if jnp.issubdtype(jnp.result_type(x), jnp.inexact)
    ]


def _is_finite(tree: PyTree) -> Bool[Array, ""]:
    leaves = [jnp.all(jnp.isfinite(x)) for x in _inexact_leaves(tree)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.array(True)


def first_nonfinite_env(tree: PyTree[Array]) -> Int[Array, ""]:
    """The first env index (axis 1 of `[T, B, ...]` leaves) holding a NaN or
    inf, or -1 when every value is finite."""
    per_env = [
        jnp.all(jnp.isfinite(x).reshape(x.shape[0], x.shape[1], -1), axis=(0, 2))
        for x in _inexact_leaves(tree)
    ]
    if not per_env:
        return jnp.array(-1, jnp.int32)
    finite = jnp.all(jnp.stack(per_env), axis=0)
    return jnp.where(jnp.all(finite), -1, jnp.argmin(finite)).astype(jnp.int32)


_UPDATE_UNROLL = 2


def gradient_phase(
    minibatch_loss: Callable[..., tuple[Array, dict[str, Any]]],
    params: PyTree,
    opt_state: PyTree,
    optimizer: optax.GradientTransformation,
    key: PRNGKeyArray,
    *,
    n_local_envs: int,
    config: Any,
    axis_name: str | None = None,
    target_kl: Float[Array, ""] | None = None,
) -> tuple[PyTree, PyTree, dict[str, Any]]:
    """`n_epochs * n_minibatches` optimiser steps over env minibatches.

    `minibatch_loss(params, idx)` returns `(loss, metrics)` for the envs at
    positions `idx` of this device's batch. Gradients are averaged over
    `axis_name` when running on a mesh; `config` supplies `n_epochs`,
    `n_minibatches` and `logging_level`.

    With `target_kl`, the loss metrics' `loss/approx_kl` (the minibatch's KL
    from the rollout policy, before its update) stops the loop: from the first
    minibatch whose KL exceeds `1.5 * target_kl`, no update is applied for the
    rest of the iteration (the updates are still computed and discarded, so
    the program keeps one shape under `vmap`). Only the learning-rate
    schedule's step count advances through them, so the schedule still
    follows the run's progress.
    """
    grad_fn = jax.grad(minibatch_loss, has_aux=True)

    def update(c, idx):
        p, opt_state, stopped = c
        grads, metrics = grad_fn(p, idx)
        grads = pmean(grads, axis_name)
        if LoggingLevel.GRAD_NORM in config.logging_level:
            metrics["grad_norm"] = optax.tree.norm(grads)
        # optax mixes Python floats with int32 step counts; keep it working
        # when a user (or our test suite) enables strict dtype promotion.
        with jax.numpy_dtype_promotion("standard"):
            updates, new_opt_state = optimizer.update(grads, opt_state, p)
        new_p = optax.apply_updates(p, updates)
        if target_kl is None:
            return (new_p, new_opt_state, stopped), metrics
        stopped = stopped | (metrics["loss/approx_kl"] > 1.5 * target_kl)
        new_p = jax.tree.map(lambda old, new: jnp.where(stopped, old, new), p, new_p)
        # A skipped update still counts for the learning-rate schedule, which
        # follows the run's progress and reaches its end at `total_steps`.
        is_schedule = lambda x: isinstance(x, optax.ScaleByScheduleState)  # noqa: E731
        new_opt_state = jax.tree.map(
            lambda old, new: new if is_schedule(old) else jnp.where(stopped, old, new),
            opt_state,
            new_opt_state,
            is_leaf=is_schedule,
        )
        if LoggingLevel.LOSSES in config.logging_level:
            metrics["losses/kl_stopped"] = stopped  # logged as the fraction
        return (new_p, new_opt_state, stopped), metrics

    indices = minibatch_indices(
        key, n_local_envs, config.n_epochs, config.n_minibatches, axis_name
    )
    # Two updates per loop iteration let XLA overlap each update's
    # parameter-independent work (minibatch gathers, key and input handling)
    # with the previous update's serial chain. `benchmarks.ceilings`,
    # `ppo_step` ms (compile s): move_to_center 35.5 (3.1) -> 29.9 (3.4),
    # inverted_pendulum 51.2 (8.6) -> 49.4 (8.8); unrolling 4 gains little
    # more and compiles ~1.5 s longer.
    (params, opt_state, _), metrics = jax.lax.scan(
        update, (params, opt_state, jnp.array(False)), indices, unroll=_UPDATE_UNROLL
    )
    return params, opt_state, metrics


def step(
    env: Any,
    learner: AbstractLearner,
    state: TrainingState,
    *,
    axis_name: str | None = None,
) -> tuple[TrainingState, dict[str, Array]]:
    """One iteration: rollout of the acting module, `n_epochs * n_minibatches`
    gradient steps on the learner's loss, then `update_statistics` of the
    network with its rollout extras. Returns scalar metrics.

    With `axis_name`, this is the body of a data-parallel step under
    `jax.shard_map` (`eqx_ppo.shard_step` sets it up): `state.env_state`
    and `state.carry` hold this device's envs, everything else is
    replicated. Envs get the keys they would get on one device; each device
    shuffles its own envs into minibatches; gradients are averaged over
    devices (`pmean`); statistics are updated from every device's extras
    (`all_gather`), and metrics are whole-batch values, so the replicated
    results stay identical on every device.
    """
    check_env("step", "env", env)
    check_learner("step", learner)
    config = learner.config
    _check_n_envs(config, state, axis_name)
    key, rollout_key, shuffle_key = jax.random.split(state.key, 3)
    carry, data = rollout(
        env,
        learner.acting(state.network, state.env_state.obs),
        StepCarry(state.env_state, state.carry),
        rollout_key,
        length=config.rollout_length,
        reset_mode=config.reset_mode,
        keep_terminal_obs=learner.keep_terminal_obs,
        axis_name=axis_name,
    )
    batch = learner.replay_batch(state.network, data)
    final_obs = carry.env_state.obs
    params, static = eqx.partition(state.network, trainable(state.network))

    def minibatch_loss(p, idx):
        minibatch = Minibatch(
            jax.tree.map(lambda x: x[idx], state.carry),
            jax.tree.map(lambda x: x[:, idx], batch),
            jax.tree.map(lambda x: x[idx], final_obs),
        )
        out = learner.loss(eqx.combine(p, static), minibatch, axis_name=axis_name)
        _check_loss(learner, out)
        return out

    optimizer = make_optimizer(config)
    _check_opt_state(config, optimizer, params, state.opt_state)
    params, opt_state, loss_metrics = gradient_phase(
        minibatch_loss,
        params,
        state.opt_state,
        optimizer,
        shuffle_key,
        n_local_envs=jnp.shape(data.done)[1],
        config=config,
        axis_name=axis_name,
        target_kl=learner.target_kl,
    )
    all_data = gather_envs(data._replace(key=None), axis_name)
    network = eqx.combine(params, static).update_statistics(all_data.extras)
    metrics = iteration_metrics(
        config,
        loss_metrics,
        all_data,
        params,
        net_prefix=learner.metrics_prefix,
        rollout_outputs=learner.logs_rollout_outputs,
    )
    new_state = TrainingState(
        network=network,
        opt_state=opt_state,
        env_state=carry.env_state,
        carry=carry.net_state,
        key=key,
        iteration=state.iteration + 1,
        steps=state.steps + config.steps_per_iteration,
    )
    return new_state, metrics


def _check_loss(learner: AbstractLearner, out: Any) -> None:
    """Raise a `TypeError` naming the learner unless its loss returned
    `(scalar, metrics)` with the metrics the engine reads (at trace time)."""
    where = f"{type(learner).__name__}.loss"
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict)):
        raise TypeError(
            f"{where} returned {type(out).__name__}; expected (loss, metrics), a "
            "scalar and a dict with 'loss/total'."
        )
    needed = ["loss/total"] + (
        ["loss/approx_kl"] if learner.target_kl is not None else []
    )
    missing = [k for k in needed if k not in out[1]]
    if jnp.shape(out[0]) != () or missing:
        raise TypeError(
            f"{where} returned a loss of shape {jnp.shape(out[0])} and metrics "
            f"without {missing}; expected a scalar loss, and metrics holding "
            "'loss/total' (the loss) and, with target_kl, 'loss/approx_kl'."
        )


def _check_opt_state(
    config: LearnerConfig,
    optimizer: optax.GradientTransformation,
    params: PyTree,
    opt_state: PyTree,
) -> None:
    """Raise unless `opt_state` is the state of `config`'s optimiser (at trace
    time: optax would fail inside its chain with an error about its own
    internals)."""
    expected = eqx.filter_eval_shape(optimizer.init, params)
    if jax.tree.structure(expected) != jax.tree.structure(opt_state):
        raise ValueError(
            "step(state=...): the state's optimiser state is not the one "
            f"config's optimiser (gradient_clipping={config.gradient_clipping}, "
            f"weight_decay={config.weight_decay}) builds: a state built with "
            "another config. Fix: use the config the state was built with."
        )


def _check_n_envs(
    config: LearnerConfig, state: TrainingState, axis_name: str | None
) -> None:
    """Raise unless `state` is one seed's `TrainingState` holding
    `config.n_envs` envs (this device's share of them under `axis_name`), at
    trace time."""
    if not isinstance(state, TrainingState):
        raise TypeError(
            f"step(state=...): expected a TrainingState, got {type(state).__name__}."
            " Fix: pass the state itself; the step returns `(state, metrics)`."
        )
    seeds = jnp.shape(state.iteration)
    if seeds:
        raise ValueError(
            f"step(state=...): the state has a seed axis of {seeds[0]} (a stack of "
            "seeds' states). Fix: `eqx.filter_vmap` the step over it, or take one "
            "seed with `eqx_ppo.select_seed(state, i)`."
        )
    n_envs = jnp.shape(state.env_state.done)[0]
    if axis_name is not None:
        n_envs *= jax.lax.axis_size(axis_name)
    if n_envs != config.n_envs:
        raise ValueError(
            f"step(state=...): the state holds {n_envs} envs but config.n_envs = "
            f"{config.n_envs}. Fix: use the config the state was built with "
            f"(n_envs={n_envs})."
        )


def ppo_step(
    env: Any,
    config: PPOConfig,
    state: TrainingState,
    *,
    axis_name: str | None = None,
) -> tuple[TrainingState, dict[str, Array]]:
    """`step` with the [`eqx_ppo.PPO`][] learner: one PPO iteration."""
    return step(env, PPO(config), state, axis_name=axis_name)


def scan_steps(
    step: Callable[[Any], tuple[Any, dict[str, Array]]],
    state: Any,
    length: int,
    n_active: Int[Array, ""] | None = None,
) -> tuple[Any, dict[str, Array]]:
    """`length` calls of `step` in one loop; metrics stacked on a new axis.

    Only the array leaves of `state` are carried (the rest is static). With
    `n_active`, only the first `n_active` steps run (a `fori_loop` with a traced
    bound writing into preallocated metric buffers; the rest stay zeros), which
    lets one compiled program serve chunks of any length up to `length`.
    """
    dynamic, static = eqx.partition(state, eqx.is_array)

    def run(d):
        new, metrics = step(eqx.combine(d, static))
        return eqx.filter(new, eqx.is_array), metrics

    if n_active is None:
        dynamic, metrics = jax.lax.scan(lambda d, _: run(d), dynamic, length=length)
        return eqx.combine(dynamic, static), metrics

    _, metrics_shape = eqx.filter_eval_shape(step, state)
    buffers = jax.tree.map(
        lambda m: jnp.zeros((length, *m.shape), m.dtype), metrics_shape
    )

    def body(i, carry):
        d, buffers = carry
        d, metrics = run(d)
        return d, jax.tree.map(lambda b, m: b.at[i].set(m), buffers, metrics)

    dynamic, metrics = jax.lax.fori_loop(0, n_active, body, (dynamic, buffers))
    return eqx.combine(dynamic, static), metrics


def ppo_run(
    env: Any, config: PPOConfig, state: TrainingState, n_iterations: int
) -> tuple[TrainingState, dict[str, Array]]:
    """`n_iterations` of `ppo_step` as one pure function (a `lax.scan`).

    Metrics come back stacked, `[n_iterations]` per key. A whole run, vmapped
    over seeds and learning rates:

    ```python
    def run(key, lr):
        config = PPOConfig(learning_rate=lr, ...)
        state = ppo_init(env, make_network(key), config, key=key)
        return ppo_run(env, config, state, config.n_iterations)

    states, metrics = eqx.filter_jit(eqx.filter_vmap(run))(keys, lrs)
    ```
    """
    check_int("ppo_run", "n_iterations", n_iterations, minimum=0)
    return scan_steps(lambda s: ppo_step(env, config, s), state, n_iterations)


def iteration_metrics(
    config: LearnerConfig,
    loss_metrics: dict[str, Array],
    data: Transition,
    params: PyTree,
    *,
    net_prefix: str = "net",
    rollout_outputs: bool = True,
) -> dict[str, Array]:
    """An iteration's scalar metrics, chosen by `config.logging_level`.

    Every learner's: the gradient phase's loss metrics (their
    mean over updates, or percentiles), then the rollout's env and network
    metrics (the latter under `net_prefix`), batch statistics and weights.
    `rollout_outputs` adds the rollout's log-likelihoods and values
    (`ACTOR_EXTRA`, `CRITIC_EXTRA`). With `config.check_finite`, also the
    flags the driver stops on (`debug/...`): the first env whose observations
    or rewards were non-finite (-1 for none), and whether every update's loss
    and the updated parameters were finite.
    """
    level, pct = config.logging_level, config.logging_percentiles
    out: dict[str, Array] = {}
    for name, value in loss_metrics.items():
        if not name.startswith("loss/"):
            reduce_metric(out, name, value, pct)
    if LoggingLevel.ENV_METRICS in level:
        reduce_metric(out, "env", data.env_metrics, pct)
    if LoggingLevel.NETWORK_METRICS in level:
        reduce_metric(out, net_prefix, data.net_metrics, pct)
    if LoggingLevel.ROLLOUT_STATS in level:
        reduce_metric(out, "rollout_batch/reward", data.reward, pct)
        reduce_metric(out, "rollout_batch/action", data.output.actions, pct)
        out["rollout_batch/done_rate"] = jnp.mean(data.done.astype(jnp.float32))
        out["rollout_batch/truncation_rate"] = jnp.mean(
            data.truncated.astype(jnp.float32)
        )
    if LoggingLevel.ROLLOUT_OBS in level:
        reduce_metric(out, "rollout_batch/obs", data.obs, pct)
    if rollout_outputs and LoggingLevel.ACTOR_EXTRA in level:
        reduce_metric(out, "loglikelihood", data.output.loglikelihoods, pct)
    if rollout_outputs and LoggingLevel.CRITIC_EXTRA in level:
        reduce_metric(out, "losses/predicted_value", data.output.value_estimates, pct)
    if LoggingLevel.WEIGHTS in level:
        weights = jnp.concatenate([jnp.ravel(w) for w in jax.tree.leaves(params)])
        reduce_metric(out, "weights", weights, pct)
    if config.check_finite:
        out["debug/nonfinite_obs_env"] = first_nonfinite_env(
            (data.obs, data.terminal_obs)
        )
        out["debug/nonfinite_reward_env"] = first_nonfinite_env(data.reward)
        out["debug/finite_loss"] = _is_finite(loss_metrics["loss/total"])
        out["debug/finite_params"] = _is_finite(params)
    return out
