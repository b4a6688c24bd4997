"""The training state and the two pure functions of training, `init` and `step`:
both take a learner, and share everything else."""

import math
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from jax.flatten_util import ravel_pytree
from jax.sharding import Mesh, NamedSharding
from jaxtyping import Array, Int, Key, PRNGKeyArray, PyTree

from .._typecheck import checked
from ..envs._env import check_env
from ..logging import LoggingLevel, reduce_metric
from ..nn._errors import tree_spec
from ..nn._filters import trainable
from ..nn._module import AbstractStatefulModule, State
from . import _guard
from ._learner import AbstractLearner, Minibatch
from ._rollout import (
    SaveAt,
    StepCarry,
    Transition,
    env_keys,
    reset_envs,
    run_episodes,
)
from ._sharding import gather_envs, partition_specs, place, pmean
from ._validate import seed_axis_hint


class TrainingState(eqx.Module):
    """Everything a run carries from one iteration to the next.

    **Fields:**

    - `network`: the trained network (parameters and statistics).
    - `opt_state`: the optax state of the trainable leaves.
    - `env_state`, `carry`: the batched env states and the acting module's carries.
    - `key`: the run's PRNG key.
    - `iteration`, `steps`: int32 counters (iterations done, env steps taken).
    - `start_states`: with `reset_mode="initial"`, the env states the run
      started from, where finished envs restart; otherwise `None`.

    On a device mesh, the `env_fields` are split over the devices.
    """

    env_fields: ClassVar[tuple[str, ...]] = ("env_state", "carry", "start_states")

    network: AbstractStatefulModule
    opt_state: PyTree
    env_state: Any
    carry: State
    key: PRNGKeyArray
    iteration: Int[Array, ""]
    steps: Int[Array, ""]
    start_states: Any = None


@checked
def shard_state(state: TrainingState, mesh: Mesh) -> TrainingState:
    """`state` placed on `mesh`: env states and carries split over the devices,
    the rest replicated (every process passes the same `state`)."""
    dynamic, static = eqx.partition(state, eqx.is_array)
    placed = jax.tree.map(
        lambda x, spec: place(x, NamedSharding(mesh, spec)),
        dynamic,
        partition_specs(state),
    )
    return eqx.combine(placed, static)


class _Horizon(NamedTuple):
    """A decaying schedule's update count, kept in the optimiser state to check
    a resumed run against."""

    updates: Int[Array, ""]


def schedule_horizon(opt_state: PyTree) -> Array | None:
    """The updates a state's decaying schedule runs over (`None`: constant)."""
    is_horizon = lambda x: isinstance(x, _Horizon)  # noqa: E731
    found = [x for x in jax.tree.leaves(opt_state, is_leaf=is_horizon) if is_horizon(x)]
    return found[0].updates if found else None


def make_optimizer(learner: AbstractLearner) -> optax.GradientTransformation:
    """Adam(W), optional clipping and the schedule, read from `learner`, over
    the trainable leaves raveled into one vector (a few fused ops per update)."""

    def schedule(count):
        progress = jnp.minimum(count / learner.n_updates, 1.0)
        if learner.lr_schedule == "linear":
            scale = 1.0 - progress
        elif learner.lr_schedule == "cosine":
            scale = 0.5 * (1.0 + jnp.cos(math.pi * progress))
        else:
            scale = 1.0
        return learner.learning_rate * scale

    links = []
    if learner.gradient_clipping is not None:
        links.append(optax.clip_by_global_norm(learner.gradient_clipping))
    links.append(optax.scale_by_adam())
    if learner.weight_decay is not None:
        links.append(optax.add_decayed_weights(learner.weight_decay))
    links.append(optax.scale_by_learning_rate(schedule))
    if learner.lr_schedule != "constant":
        links.append(
            optax.GradientTransformation(
                lambda _: _Horizon(jnp.asarray(learner.n_updates, jnp.int32)),
                optax.identity().update,
            )
        )
    inner = optax.chain(*links)

    def init(params):
        return inner.init(ravel_pytree(params)[0])

    def update(updates, state, params=None):
        flat, unravel = ravel_pytree(updates)
        flat_params = None if params is None else ravel_pytree(params)[0]
        flat, state = inner.update(flat, state, flat_params)
        return unravel(flat), state

    return optax.GradientTransformation(init, update)


def fresh_state(
    env: Any,
    network: AbstractStatefulModule,
    learner: AbstractLearner,
    key: Key[Array, ""],
) -> TrainingState:
    """`init` without its checks, for callers that made them."""
    reset_key, key = jax.random.split(key)
    env_state = reset_envs(env, env_keys(reset_key, learner.n_envs))
    acting = learner.acting(network, env_state.obs)
    params = eqx.filter(network, trainable(network))
    return TrainingState(
        network=network,
        opt_state=make_optimizer(learner).init(params),
        env_state=env_state,
        carry=acting.initialize_state(learner.n_envs),
        key=key,
        iteration=jnp.zeros((), jnp.int32),
        steps=jnp.zeros((), jnp.int32),
        start_states=env_state if learner.reset_mode == "initial" else None,
    )


@checked
def init(
    env: Any,
    network: AbstractStatefulModule,
    learner: AbstractLearner,
    *,
    key: Key[Array, ""],
) -> TrainingState:
    """A fresh training state: reset envs, initial carries, optimiser state.
    Pure, so it can be jitted and vmapped over keys or learner coefficients."""
    check_env(env)
    with seed_axis_hint(network):
        return fresh_state(env, network, learner, key)


def _permutations(
    key: PRNGKeyArray,
    n_envs: int,
    n_epochs: int,
    n_minibatches: int,
    axis_name: str | None,
) -> Int[Array, "update m"]:
    """The minibatches of one iteration: env positions, one row per update (a
    permutation per epoch; each device permutes its own envs)."""
    if axis_name is not None:
        key = jax.random.fold_in(key, jax.lax.axis_index(axis_name))
    perms = jax.vmap(lambda k: jax.random.permutation(k, n_envs))(
        jax.random.split(key, n_epochs)
    )
    return perms.reshape(n_epochs * n_minibatches, n_envs // n_minibatches)


# Two updates per loop iteration let XLA overlap each update's
# parameter-independent work (minibatch gathers, key handling) with the
# previous update's serial chain (`benchmarks.ceilings` measures it).
_UPDATE_UNROLL = 2


def _gradient_phase(
    learner: AbstractLearner,
    minibatch_loss: Callable[..., tuple[Array, dict[str, Any]]],
    params: PyTree,
    opt_state: PyTree,
    indices: Int[Array, "update m"],
    axis_name: str | None,
) -> tuple[PyTree, PyTree, dict[str, Any]]:
    """An optimiser step on `minibatch_loss(params, idx)` per row of `indices`;
    with `target_kl`, updates past the stop are computed and discarded."""
    optimizer = make_optimizer(learner)
    grad_fn = jax.grad(minibatch_loss, has_aux=True)
    target_kl = learner.target_kl

    def update(carry, idx):
        p, opt_state, stopped = carry
        grads, metrics = grad_fn(p, idx)
        grads = pmean(grads, axis_name)
        if LoggingLevel.GRAD_NORM in learner.logging_level:
            metrics["grad_norm"] = optax.tree.norm(grads)
        # optax mixes Python floats with int32 step counts; keep it working
        # under strict dtype promotion.
        with jax.numpy_dtype_promotion("standard"):
            updates, new_opt_state = optimizer.update(grads, opt_state, p)
        new_p = optax.apply_updates(p, updates)
        if target_kl is None:
            return (new_p, new_opt_state, stopped), metrics
        stopped = stopped | (metrics["loss/approx_kl"] > 1.5 * target_kl)
        new_p = jax.tree.map(lambda old, new: jnp.where(stopped, old, new), p, new_p)
        is_schedule = lambda x: isinstance(x, optax.ScaleByScheduleState)  # noqa: E731
        new_opt_state = jax.tree.map(
            lambda old, new: new if is_schedule(old) else jnp.where(stopped, old, new),
            opt_state,
            new_opt_state,
            is_leaf=is_schedule,
        )
        if LoggingLevel.LOSSES in learner.logging_level:
            metrics["losses/kl_stopped"] = stopped  # logged as the fraction
        return (new_p, new_opt_state, stopped), metrics

    (params, opt_state, _), metrics = jax.lax.scan(
        update, (params, opt_state, jnp.array(False)), indices, unroll=_UPDATE_UNROLL
    )
    return params, opt_state, metrics


def rollout_save(learner: AbstractLearner) -> SaveAt:
    """What `step`'s rollout keeps: every transition field, and `terminal_obs`
    only for a learner that reads it."""
    drop = () if learner.keep_terminal_obs else ("terminal_obs",)
    return SaveAt(transitions=tuple(f for f in Transition._fields if f not in drop))


@checked
def step(
    env: Any,
    learner: AbstractLearner,
    state: TrainingState,
    *,
    axis_name: str | None = None,
) -> tuple[TrainingState, dict[str, Array]]:
    """One iteration: a rollout, `n_epochs * n_minibatches` gradient steps on
    the learner's loss, then `update_statistics`; returns the new state and
    its scalar metrics. `axis_name` names the device axis under
    [`eqx_ppo.shard_step`][] (the multi-device guide)."""
    acting = learner.acting(state.network, state.env_state.obs)
    _check_state(learner, acting, state, axis_name)
    key, rollout_key, shuffle_key = jax.random.split(state.key, 3)
    carry, steps = run_episodes(
        env,
        acting,
        StepCarry(state.env_state, state.carry),
        rollout_key,
        length=learner.rollout_length,
        reset=learner.reset_mode,
        save=rollout_save(learner),
        starts=state.start_states,
        axis_name=axis_name,
    )
    data = steps.transitions
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

    n_local = jnp.shape(data.done)[1]  # this device's envs
    indices = _permutations(
        shuffle_key, n_local, learner.n_epochs, learner.n_minibatches, axis_name
    )
    params, opt_state, loss_metrics = _gradient_phase(
        learner, minibatch_loss, params, state.opt_state, indices, axis_name
    )
    all_data = gather_envs(data._replace(key=None), axis_name)
    network = eqx.combine(params, static).update_statistics(all_data.extras)
    metrics = _iteration_metrics(learner, loss_metrics, all_data, params)
    if learner.check_finite:
        final = gather_envs(final_obs, axis_name, axis=0)
        loss = loss_metrics["loss/total"]
        metrics |= _guard.flags(all_data, final, loss, (params, opt_state))
    new_state = TrainingState(
        network=network,
        opt_state=opt_state,
        env_state=carry.env_state,
        carry=carry.net_state,
        key=key,
        iteration=state.iteration + 1,
        steps=state.steps + learner.steps_per_iteration,
        start_states=state.start_states,
    )
    return new_state, metrics


def _check_state(
    learner: AbstractLearner,
    acting: AbstractStatefulModule,
    state: TrainingState,
    axis_name: str | None,
) -> None:
    """Raise unless `state` is one seed's of `learner.n_envs` envs, with the
    optimiser state and carries `learner` and `acting` build (at trace time)."""
    problems = []
    seeds = jnp.shape(state.iteration)
    n_envs = jnp.shape(state.env_state.done)[len(seeds)]
    if axis_name is not None:
        n_envs *= jax.lax.axis_size(axis_name)
    carry = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), state.carry
    )
    expected = eqx.filter_eval_shape(acting.initial_state)
    if seeds or n_envs != learner.n_envs:
        of_seeds = f" of {seeds[0]} seeds" if seeds else ""
        problems.append(
            f"the state holds {n_envs} envs{of_seeds}, but the learner runs one "
            f"seed of n_envs={learner.n_envs}"
        )
    elif tree_spec(carry) != tree_spec(expected):
        problems.append(
            f"the state's carries (one env's) are {tree_spec(carry)}, but the "
            f"acting module's are {tree_spec(expected)}: a state built with another "
            "network or learner (e.g. another distillation teacher)"
        )
    params = eqx.filter(state.network, trainable(state.network))
    opt_state = eqx.filter_eval_shape(make_optimizer(learner).init, params)
    if jax.tree.structure(opt_state) != jax.tree.structure(state.opt_state):
        problems.append(
            "the state's optimiser state is not the one the learner's optimiser "
            f"(gradient_clipping={learner.gradient_clipping}, weight_decay="
            f"{learner.weight_decay}, lr_schedule={learner.lr_schedule!r}) builds: "
            "a state built with another learner"
        )
    if (learner.reset_mode == "initial") != (state.start_states is not None):
        built = "another reset_mode (no start states)"
        problems.append(
            f"the learner's reset_mode={learner.reset_mode!r}, but the state was "
            "built for " + (built if state.start_states is None else "'initial'")
        )
    if problems:
        raise ValueError(
            f"step(state=...): {'; '.join(problems)}. Fix: step it with the learner "
            "and network it was built with; `eqx.filter_vmap` the step over a stack "
            "of seeds, or take one with `eqx_ppo.select_seed(state, i)`."
        )


def _check_loss(learner: AbstractLearner, out: Any) -> None:
    """Raise unless the loss returned `(scalar, metrics)` as the engine reads."""
    kl = () if learner.target_kl is None else ("loss/approx_kl",)
    needed = {"loss/total", *kl}
    ok = isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict)
    if not ok or jnp.shape(out[0]) != () or not needed <= set(out[1]):
        raise TypeError(
            f"{type(learner).__name__}.loss returned {type(out).__name__}; expected "
            f"(loss, metrics): a scalar and a dict holding {sorted(needed)}."
        )


def _iteration_metrics(
    learner: AbstractLearner,
    loss_metrics: dict[str, Array],
    data: Transition,
    params: PyTree,
) -> dict[str, Array]:
    """An iteration's scalar metrics, chosen by `learner.logging_level`."""
    level, pct = learner.logging_level, learner.logging_percentiles
    out: dict[str, Array] = {}
    for name, value in loss_metrics.items():
        if not name.startswith("loss/"):
            reduce_metric(out, name, value, pct)
    if LoggingLevel.ENV_METRICS in level:
        reduce_metric(out, "env", data.env_metrics, pct)
    if LoggingLevel.NETWORK_METRICS in level:
        reduce_metric(out, learner.metrics_prefix, data.net_metrics, pct)
    if LoggingLevel.ROLLOUT_STATS in level:
        reduce_metric(out, "rollout_batch/reward", data.reward, pct)
        reduce_metric(out, "rollout_batch/action", data.output.actions, pct)
        reduce_metric(out, "rollout_batch/done_rate", data.done)
        reduce_metric(out, "rollout_batch/truncation_rate", data.truncated)
    if LoggingLevel.ROLLOUT_OBS in level:
        reduce_metric(out, "rollout_batch/obs", data.obs, pct)
    if learner.logs_rollout_outputs and LoggingLevel.ACTOR_EXTRA in level:
        reduce_metric(out, "loglikelihood", data.output.loglikelihoods, pct)
    if learner.logs_rollout_outputs and LoggingLevel.CRITIC_EXTRA in level:
        reduce_metric(out, "losses/predicted_value", data.output.value_estimates, pct)
    if LoggingLevel.WEIGHTS in level:
        weights = jnp.concatenate([jnp.ravel(w) for w in jax.tree.leaves(params)])
        reduce_metric(out, "weights", weights, pct)
    return out
