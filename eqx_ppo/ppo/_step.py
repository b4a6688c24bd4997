"""The training state and the two pure functions of training: `ppo_init`, `ppo_step`.

Both are pure functions of pytrees: `jax.jit` them, `jax.vmap` them over keys
(seeds) or over `PPOConfig` coefficients, or `lax.scan` them.
"""

import math
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from jaxtyping import Array, Int, PRNGKeyArray, PyTree

from ..logging import LoggingLevel, reduce_metric
from ..nn._module import AbstractStatefulModule, State, trainable
from ._config import PPOConfig
from ._loss import ppo_loss
from ._rollout import StepCarry, env_keys, rollout


class TrainingState(eqx.Module):
    """Everything a run carries from one iteration to the next.

    **Fields:**

    - `network`: the network (parameters and statistics).
    - `opt_state`: the optax state of the trainable leaves.
    - `env_state`: the batched env states `[n_envs, ...]`.
    - `net_state`: the batched network carries `[n_envs, ...]`.
    - `key`: the run's PRNG key.
    - `iteration`, `steps`: int32 counters (iterations done, env steps taken).
    """

    network: AbstractStatefulModule
    opt_state: PyTree
    env_state: Any
    net_state: State
    key: PRNGKeyArray
    iteration: Int[Array, ""]
    steps: Int[Array, ""]


def _learning_rate(config: PPOConfig):
    updates_per_run = config.n_iterations * config.n_epochs * config.n_minibatches

    def schedule(count):
        progress = jnp.minimum(count / updates_per_run, 1.0)
        if config.lr_schedule == "linear":
            scale = 1.0 - progress
        elif config.lr_schedule == "cosine":
            scale = 0.5 * (1.0 + jnp.cos(math.pi * progress))
        else:
            scale = 1.0
        return config.learning_rate * scale

    return schedule


def make_optimizer(config: PPOConfig) -> optax.GradientTransformation:
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
    return optax.chain(*links)


def ppo_init(
    env: Any,
    network: AbstractStatefulModule,
    config: PPOConfig,
    *,
    key: PRNGKeyArray,
) -> TrainingState:
    """A fresh training state: reset envs, initial carries, optimiser state."""
    reset_key, key = jax.random.split(key)
    env_state = jax.vmap(env.reset)(env_keys(reset_key, config.n_envs))
    params = eqx.filter(network, trainable(network))
    return TrainingState(
        network=network,
        opt_state=make_optimizer(config).init(params),
        env_state=env_state,
        net_state=network.initialize_state(config.n_envs),
        key=key,
        iteration=jnp.zeros((), jnp.int32),
        steps=jnp.zeros((), jnp.int32),
    )


def _minibatch_indices(key: PRNGKeyArray, config: PPOConfig) -> Int[Array, "update m"]:
    size = config.n_envs // config.n_minibatches
    perms = jax.vmap(lambda k: jax.random.permutation(k, config.n_envs))(
        jax.random.split(key, config.n_epochs)
    )
    return perms.reshape(config.n_epochs * config.n_minibatches, size)


def _is_finite(tree: PyTree) -> Array:
    leaves = [
        jnp.all(jnp.isfinite(x))
        for x in jax.tree.leaves(tree)
        if jnp.issubdtype(jnp.result_type(x), jnp.inexact)
    ]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.array(True)


def ppo_step(
    env: Any, config: PPOConfig, state: TrainingState
) -> tuple[TrainingState, dict[str, Array]]:
    """One iteration: rollout, `n_epochs * n_minibatches` gradient steps, then
    `update_statistics` with the rollout's extras. Returns scalar metrics."""
    key, rollout_key, shuffle_key = jax.random.split(state.key, 3)
    carry, data = rollout(
        env,
        state.network,
        StepCarry(state.env_state, state.net_state),
        rollout_key,
        length=config.rollout_length,
        reset_mode=config.reset_mode,
        keep_terminal_obs=config.truncation == "bootstrap",
    )
    final_obs = carry.env_state.obs
    optimizer = make_optimizer(config)
    params, static = eqx.partition(state.network, trainable(state.network))

    def minibatch_loss(p, idx):
        sliced = jax.tree.map(lambda x: x[:, idx], data._replace(key=None))
        sliced = sliced._replace(key=data.key)
        return ppo_loss(
            eqx.combine(p, static),
            jax.tree.map(lambda x: x[idx], state.net_state),
            sliced,
            jax.tree.map(lambda x: x[idx], final_obs),
            idx,
            config,
        )

    grad_fn = jax.grad(minibatch_loss, has_aux=True)

    def update(c, idx):
        p, opt_state = c
        grads, metrics = grad_fn(p, idx)
        if LoggingLevel.GRAD_NORM in config.logging_level:
            metrics["grad_norm"] = optax.tree.norm(grads)
        # optax mixes Python floats with int32 step counts; keep it working
        # when a user (or our test suite) enables strict dtype promotion.
        with jax.numpy_dtype_promotion("standard"):
            updates, opt_state = optimizer.update(grads, opt_state, p)
        return (optax.apply_updates(p, updates), opt_state), metrics

    (params, opt_state), loss_metrics = jax.lax.scan(
        update, (params, state.opt_state), _minibatch_indices(shuffle_key, config)
    )
    network = eqx.combine(params, static).update_statistics(data.extras)
    metrics = _iteration_metrics(config, loss_metrics, data, params)
    if config.check_finite:
        metrics["debug/finite_loss"] = _is_finite(loss_metrics["loss/total"])
        metrics["debug/finite_obs"] = _is_finite(data.obs)
    new_state = TrainingState(
        network=network,
        opt_state=opt_state,
        env_state=carry.env_state,
        net_state=carry.net_state,
        key=key,
        iteration=state.iteration + 1,
        steps=state.steps + config.steps_per_iteration,
    )
    return new_state, metrics


def _iteration_metrics(
    config: PPOConfig, loss_metrics: dict, data: Any, params: PyTree
) -> dict[str, Array]:
    level, pct = config.logging_level, config.logging_percentiles
    out: dict[str, Array] = {}
    for name, value in loss_metrics.items():
        if name == "loss/total":
            continue
        reduce_metric(out, name, value, pct)
    if LoggingLevel.ENV_METRICS in level:
        reduce_metric(out, "env", data.env_metrics, pct)
    if LoggingLevel.NETWORK_METRICS in level:
        reduce_metric(out, "net", data.net_metrics, pct)
    if LoggingLevel.ROLLOUT_STATS in level:
        reduce_metric(out, "rollout_batch/reward", data.reward, pct)
        reduce_metric(out, "rollout_batch/action", data.output.actions, pct)
        out["rollout_batch/done_rate"] = jnp.mean(data.done.astype(jnp.float32))
        out["rollout_batch/truncation_rate"] = jnp.mean(
            data.truncated.astype(jnp.float32)
        )
    if LoggingLevel.ROLLOUT_OBS in level:
        reduce_metric(out, "rollout_batch/obs", data.obs, pct)
    if LoggingLevel.ACTOR_EXTRA in level:
        reduce_metric(out, "loglikelihood", data.output.loglikelihoods, pct)
    if LoggingLevel.CRITIC_EXTRA in level:
        reduce_metric(out, "losses/predicted_value", data.output.value_estimates, pct)
    if LoggingLevel.WEIGHTS in level:
        weights = jnp.concatenate([jnp.ravel(w) for w in jax.tree.leaves(params)])
        reduce_metric(out, "weights", weights, pct)
    return out
