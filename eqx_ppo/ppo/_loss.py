"""Loss replay and the PPO loss.

A minibatch is a set of envs. Replay runs the current network over each env's
whole length-`T` sequence, starting from the carry the env had at the start of
the rollout, with the rollout's per-env keys and extras, resetting carries
where the rollout did. With unchanged parameters it reproduces the rollout's
log-likelihoods and values exactly.

Advantages are recomputed in every minibatch from the *current* critic (as
nnx-ppo does), so later minibatches and epochs see fresher value estimates
than the rollout's.
"""

from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, Key, PRNGKeyArray, PyTree

from ..logging import LoggingLevel
from ..nn._adapter import PPONetworkOutput
from ..nn._module import AbstractStatefulModule, State
from ._config import PPOConfig
from ._gae import gae
from ._rollout import Transition, apply_network, env_keys, reset_carry
from ._sharding import mean, pmean, variance


class Replay(NamedTuple):
    """What replaying a minibatch gives: per step `[T, M]` outputs."""

    output: PPONetworkOutput
    regularization: Float[Array, "time env"]
    next_values: PyTree[Float[Array, "time env"]]


def _subset_keys(
    keys: Key[Array, " time"], n_envs: int, idx: Int[Array, " m"]
) -> Key[Array, "time m"]:
    return jax.vmap(lambda k: env_keys(k, n_envs)[idx])(keys)


def _value_key(key: PRNGKeyArray, tag: int) -> PRNGKeyArray:
    # Value-only calls (bootstrap values) use keys derived from, but distinct
    # from, the step's key, so replay of any env subset stays reproducible.
    return jax.random.fold_in(key, tag)


def _replay_steps(
    network: AbstractStatefulModule,
    state0: State,
    data: Transition,
    keys: Key[Array, "time m"],
    terminal_keys: Key[Array, "time m"] | None,
) -> tuple[State, PPONetworkOutput, Float[Array, "time env"], Any]:
    """Run `network` over the sliced sequences of `data`, resetting carries on done.

    Returns the carry after the last step, the per-step outputs and
    regularisation, and (when `terminal_keys` is given) the values of the
    terminal observations.
    """
    length = data.done.shape[0]
    bootstrap_truncation = terminal_keys is not None
    if not jax.tree.leaves(state0):
        # No carry: one call over all T*M steps instead of T sequential ones.
        per_step = jax.vmap(lambda o, e, k: apply_network(network, state0, o, e, k))
        out = per_step(data.obs, data.extras, keys)
        terminal_values = (
            per_step(data.terminal_obs, None, terminal_keys).output.value_estimates
            if bootstrap_truncation
            else None
        )
        return state0, out.output, out.regularization_loss, terminal_values

    def step(carry, xs):
        obs, extras, k, tk, done, terminal_obs = xs
        out = apply_network(network, carry, obs, extras, k)
        terminal_value = (
            apply_network(
                network, out.next_state, terminal_obs, None, tk
            ).output.value_estimates
            if bootstrap_truncation
            else None
        )
        next_carry = reset_carry(network, done, out.next_state)
        return next_carry, (out.output, out.regularization_loss, terminal_value)

    last_state, (outputs, regularization, terminal_values) = jax.lax.scan(
        step,
        state0,
        (data.obs, data.extras, keys, terminal_keys, data.done, data.terminal_obs),
        length=length,
    )
    return last_state, outputs, regularization, terminal_values


def replay(
    network: AbstractStatefulModule,
    state0: State,
    data: Transition,
    final_obs: PyTree[Array],
    idx: Int[Array, " m"],
    *,
    n_envs: int,
    bootstrap_truncation: bool,
) -> Replay:
    """Replay envs `idx` of `data` (already sliced to `[T, M]`) from carry `state0`."""
    keys = _subset_keys(data.key, n_envs, idx)
    last_keys = env_keys(_value_key(data.key[-1], 1), n_envs)[idx]
    terminal_keys = _subset_keys(
        jax.vmap(lambda k: _value_key(k, 2))(data.key), n_envs, idx
    )
    last_state, outputs, regularization, terminal_values = _replay_steps(
        network,
        state0,
        data,
        keys,
        terminal_keys if bootstrap_truncation else None,
    )
    last_values = apply_network(
        network, last_state, final_obs, None, last_keys
    ).output.value_estimates
    next_values = jax.tree.map(
        lambda v, last: jnp.concatenate([v[1:], last[None]], axis=0),
        outputs.value_estimates,
        last_values,
    )
    if bootstrap_truncation:
        next_values = jax.tree.map(
            lambda nv, tv: jnp.where(data.truncated, tv, nv),
            next_values,
            terminal_values,
        )
    return Replay(outputs, regularization, next_values)


def replay_policy(
    network: AbstractStatefulModule,
    state0: State,
    data: Transition,
    idx: Int[Array, " m"],
    *,
    n_envs: int,
) -> tuple[PPONetworkOutput, Float[Array, "time env"]]:
    """Replay envs `idx` of `data` like [`replay`][], without value bootstrapping.

    Returns the per-step outputs and regularisation `[T, M]`. Losses that need
    no advantages (distillation) use it; feeding other `extras` than the
    rollout's scores other actions under the same noise and carries.
    """
    _, outputs, regularization, _ = _replay_steps(
        network, state0, data, _subset_keys(data.key, n_envs, idx), None
    )
    return outputs, regularization


def _advantages_for_loglikelihoods(
    advantages: PyTree[Array], loglikelihoods: PyTree[Array], combine: bool
) -> PyTree[Array]:
    if combine:
        total = sum(jax.tree.leaves(advantages))
        return jax.tree.map(lambda _: total, loglikelihoods)
    if not isinstance(advantages, Mapping):
        return jax.tree.map(lambda _: advantages, loglikelihoods)
    if jax.tree.structure(advantages) == jax.tree.structure(loglikelihoods):
        return advantages
    raise ValueError(
        "Dict rewards need either one action log-likelihood per reward key "
        "(same structure) or `PPOConfig(combine_advantages=True)`.\n"
        f"  rewards: {jax.tree.structure(advantages)}\n"
        f"  loglikelihoods: {jax.tree.structure(loglikelihoods)}"
    )


def ppo_loss(
    network: AbstractStatefulModule,
    state0: State,
    data: Transition,
    final_obs: PyTree[Array],
    idx: Int[Array, " m"],
    config: PPOConfig,
    *,
    axis_name: str | None = None,
) -> tuple[Float[Array, ""], dict[str, Any]]:
    """Clipped-surrogate PPO loss of one minibatch, and its metrics.

    `total = actor + critic_loss_weight * critic + mean(regularisation)`, where
    the actor and critic terms are summed over log-likelihood leaves and reward
    keys, the critic term is `0.5 * mean((V - (V_stopgrad + A))^2)`, and
    advantages are normalised per minibatch when `normalize_advantages`.

    `idx` are the global env ids of the minibatch (they select the replay
    keys). Under `jax.shard_map` with `axis_name`, `data` holds this device's
    share of the minibatch: advantages are normalised with the moments of the
    whole minibatch and the metrics are whole-minibatch values, while `total`
    stays this device's loss (its gradient is averaged by the caller).
    """
    rep = replay(
        network,
        state0,
        data,
        final_obs,
        idx,
        n_envs=config.n_envs,
        bootstrap_truncation=config.truncation == "bootstrap",
    )
    values = rep.output.value_estimates
    advantages = jax.tree.map(
        lambda r, v, nv: gae(
            r,
            jax.lax.stop_gradient(v),
            jax.lax.stop_gradient(nv),
            data.done,
            data.truncated,
            gamma=config.discounting_factor,
            lambda_=config.gae_lambda,
            bootstrap_truncation=config.truncation == "bootstrap",
        ),
        data.reward,
        values,
        rep.next_values,
    )
    targets = jax.tree.map(
        lambda v, a: jax.lax.stop_gradient(v) + a, values, advantages
    )
    policy_advantages = _advantages_for_loglikelihoods(
        advantages, rep.output.loglikelihoods, config.combine_advantages
    )
    if config.normalize_advantages:
        policy_advantages = jax.tree.map(
            lambda a: _standardize(a, axis_name), policy_advantages
        )
    clip = config.clip_range

    def surrogate(new_ll, old_ll, adv):
        ratio = jnp.exp(new_ll - old_ll)
        clipped = jnp.clip(ratio, 1.0 - clip, 1.0 + clip)
        return -jnp.mean(jnp.minimum(ratio * adv, clipped * adv))

    actor_losses = jax.tree.map(
        surrogate,
        rep.output.loglikelihoods,
        data.output.loglikelihoods,
        policy_advantages,
    )
    critic_losses = jax.tree.map(
        lambda v, t: 0.5 * jnp.mean(jnp.square(v - t)), values, targets
    )
    regularization = jnp.mean(rep.regularization)
    actor = sum(jax.tree.leaves(actor_losses))
    critic = sum(jax.tree.leaves(critic_losses))
    total = actor + config.critic_loss_weight * critic + regularization

    level = config.logging_level
    # Every device's share of the minibatch has the same size, so the mean of
    # the devices' means is the minibatch mean.
    metrics: dict[str, Any] = {"loss/total": pmean(total, axis_name)}
    if LoggingLevel.LOSSES in level:
        metrics["losses/actor"] = pmean(actor_losses, axis_name)
        metrics["losses/critic"] = pmean(critic_losses, axis_name)
        metrics["losses/regularization"] = pmean(regularization, axis_name)
    if LoggingLevel.ACTOR_EXTRA in level:
        metrics["losses/clipping_fraction"] = jax.tree.map(
            lambda new, old: mean(
                (jnp.abs(jnp.exp(new - old) - 1.0) > clip).astype(jnp.float32),
                axis_name,
            ),
            rep.output.loglikelihoods,
            data.output.loglikelihoods,
        )
    if LoggingLevel.CRITIC_EXTRA in level:
        metrics["losses/advantages"] = jax.tree.map(
            lambda a: mean(a, axis_name), advantages
        )
        metrics["losses/critic_R^2"] = jax.tree.map(
            lambda loss, t: (
                1.0 - 2.0 * pmean(loss, axis_name) / (variance(t, axis_name) + 1e-8)
            ),
            critic_losses,
            targets,
        )
    return total, metrics


def _standardize(a: Array, axis_name: str | None) -> Array:
    if axis_name is None:
        return (a - jnp.mean(a)) / (jnp.std(a) + 1e-8)
    return (a - mean(a, axis_name)) / (jnp.sqrt(variance(a, axis_name)) + 1e-8)
