"""Loss replay and the PPO loss.

Replay runs the current network over each env's whole sequence from its
carry at the start of the rollout, with the rollout's keys and extras (the
guarantee is in `docs/concepts.md`). Advantages are recomputed in every
minibatch from the *current* critic, as nnx-ppo does.
"""

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Key, PyTree

from ..logging import LoggingLevel
from ..nn._adapter import PPONetworkOutput
from ..nn._module import AbstractStatefulModule, SequenceOutput, State
from ._gae import gae
from ._rollout import Transition, apply_network, reset_carry
from ._sharding import gather_envs, mean, pmean, variance

if TYPE_CHECKING:
    from ._learner import PPO


class Replay(NamedTuple):
    """What replaying a minibatch gives: per step `[T, M]` outputs."""

    output: PPONetworkOutput
    regularization: Float[Array, "time env"]
    next_values: PyTree[Float[Array, "time env"]]


def _value_keys(keys: Key[Array, "..."], tag: int) -> Key[Array, "..."]:
    # Value-only calls (bootstrap values) use keys derived from, but distinct
    # from, each env's step key, so replay of any env subset stays reproducible.
    flat = jnp.ravel(keys)
    return jax.vmap(lambda k: jax.random.fold_in(k, tag))(flat).reshape(keys.shape)


def _replay_with_terminal_values(
    network: AbstractStatefulModule,
    state0: State,
    data: Transition,
    terminal_keys: Key[Array, "time m"],
) -> tuple[SequenceOutput, PyTree[Float[Array, "time m"]]]:
    """Replay `data` step by step, valuing each terminal observation with the
    step's carry before the reset."""

    def step(carry, xs):
        obs, extras, k, tk, done, terminal_obs = xs
        out = apply_network(network, carry, obs, extras, k)
        terminal_value = apply_network(
            network, out.next_state, terminal_obs, None, tk
        ).output.value_estimates
        next_carry = reset_carry(network, done, out.next_state)
        return next_carry, (out.output, out.regularization_loss, terminal_value)

    last_state, (outputs, regularization, terminal_values) = jax.lax.scan(
        step,
        state0,
        (data.obs, data.extras, data.key, terminal_keys, data.done, data.terminal_obs),
    )
    return SequenceOutput(last_state, outputs, regularization), terminal_values


def replay(
    network: AbstractStatefulModule,
    state0: State,
    data: Transition,
    final_obs: PyTree[Array],
    *,
    bootstrap_truncation: bool,
) -> Replay:
    """Replay a minibatch of envs: `data` sliced to `[T, M]`, from carry `state0`.

    The envs' own keys come with `data.key`, so any subset replays exactly.
    """
    terminal_keys = _value_keys(data.key, 2) if bootstrap_truncation else None
    if bootstrap_truncation and jax.tree.leaves(state0):
        seq, terminal_values = _replay_with_terminal_values(
            network, state0, data, terminal_keys
        )
    else:
        seq = network.replay(state0, data.obs, data.extras, data.key, data.done)
        if bootstrap_truncation:
            # No carry: the terminal observations are just more inputs.
            terminal_values = network.replay(
                state0, data.terminal_obs, None, terminal_keys, data.done
            ).output.value_estimates
    last_values = apply_network(
        network, seq.last_state, final_obs, None, _value_keys(data.key[-1], 1)
    ).output.value_estimates
    next_values = jax.tree.map(
        lambda v, last: jnp.concatenate([v[1:], last[None]], axis=0),
        seq.output.value_estimates,
        last_values,
    )
    if bootstrap_truncation:
        next_values = jax.tree.map(
            lambda nv, tv: jnp.where(data.truncated, tv, nv),
            next_values,
            terminal_values,
        )
    return Replay(seq.output, seq.regularization_loss, next_values)


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
        "(same structure) or `PPO(combine_advantages=True)`.\n"
        f"  rewards: {jax.tree.structure(advantages)}\n"
        f"  loglikelihoods: {jax.tree.structure(loglikelihoods)}"
    )


def value_loss(
    values: Float[Array, "..."],
    old_values: Float[Array, "..."],
    targets: Float[Array, "..."],
    clip_range: Float[Array, ""] | None,
) -> Float[Array, ""]:
    """`0.5 * mean((V - target)^2)`; with `clip_range`, CleanRL's clipped form
    `0.5 * mean(max((V - t)^2, (V_old + clip(V - V_old, -c, c) - t)^2))`."""
    error = jnp.square(values - targets)
    if clip_range is not None:
        clipped = old_values + jnp.clip(values - old_values, -clip_range, clip_range)
        error = jnp.maximum(error, jnp.square(clipped - targets))
    return 0.5 * jnp.mean(error)


def ppo_loss(
    network: AbstractStatefulModule,
    state0: State,
    data: Transition,
    final_obs: PyTree[Array],
    learner: "PPO",
    *,
    axis_name: str | None = None,
) -> tuple[Float[Array, ""], dict[str, Any]]:
    """Clipped-surrogate PPO loss of one minibatch (`data`, `[T, M]`), and its
    metrics: `total = actor + critic_loss_weight * critic + mean(regularisation)`,
    with `loss/total` and `loss/approx_kl` (`mean((r - 1) - log r)`). Under
    `jax.shard_map`, `total` is this device's loss; advantages are normalised
    and metrics computed over the whole minibatch.
    """
    bootstrap = learner.truncation == "bootstrap"
    rep = replay(network, state0, data, final_obs, bootstrap_truncation=bootstrap)
    values = rep.output.value_estimates
    rewards = jax.tree.map(lambda r: r * learner.reward_scaling, data.reward)
    advantages = jax.tree.map(
        lambda r, v, nv: gae(
            r,
            jax.lax.stop_gradient(v),
            jax.lax.stop_gradient(nv),
            data.done,
            data.truncated,
            gamma=learner.discounting_factor,
            lambda_=learner.gae_lambda,
            bootstrap_truncation=bootstrap,
        ),
        rewards,
        values,
        rep.next_values,
    )
    targets = jax.tree.map(
        lambda v, a: jax.lax.stop_gradient(v) + a, values, advantages
    )
    policy_advantages = _advantages_for_loglikelihoods(
        advantages, rep.output.loglikelihoods, learner.combine_advantages
    )
    if learner.normalize_advantages:
        policy_advantages = jax.tree.map(
            lambda a: _standardize(a, axis_name), policy_advantages
        )
    clip = learner.clip_range

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
        lambda v, old, t: value_loss(v, old, t, learner.value_clip_range),
        values,
        data.output.value_estimates,
        targets,
    )
    regularization = jnp.mean(rep.regularization)
    actor = sum(jax.tree.leaves(actor_losses))
    critic = sum(jax.tree.leaves(critic_losses))
    total = actor + learner.critic_loss_weight * critic + regularization

    level = learner.logging_level
    # Every device's share of the minibatch has the same size, so the mean of
    # the devices' means is the minibatch mean.
    log_ratios = jax.tree.map(
        lambda new, old: jax.lax.stop_gradient(new - old),
        rep.output.loglikelihoods,
        data.output.loglikelihoods,
    )
    approx_kl = sum(
        mean(jnp.expm1(lr) - lr, axis_name) for lr in jax.tree.leaves(log_ratios)
    )
    metrics: dict[str, Any] = {
        "loss/total": pmean(total, axis_name),
        "loss/approx_kl": approx_kl,
    }
    if LoggingLevel.LOSSES in level:
        metrics["losses/actor"] = pmean(actor_losses, axis_name)
        metrics["losses/critic"] = pmean(critic_losses, axis_name)
        metrics["losses/regularization"] = pmean(regularization, axis_name)
    if LoggingLevel.ACTOR_EXTRA in level:
        metrics["losses/approx_kl"] = approx_kl
        metrics["losses/clipping_fraction"] = jax.tree.map(
            lambda lr: mean(
                (jnp.abs(jnp.exp(lr) - 1.0) > clip).astype(jnp.float32), axis_name
            ),
            log_ratios,
        )
    if LoggingLevel.CRITIC_EXTRA in level:
        metrics["losses/advantages"] = gather_envs(
            jax.tree.map(jax.lax.stop_gradient, policy_advantages), axis_name
        )
        metrics["losses/raw_advantages"] = gather_envs(advantages, axis_name)
        # From the plain squared error, not the loss: with `value_clip_range`
        # the loss is the clipped error, which is not the explained variance.
        metrics["losses/critic_R^2"] = jax.tree.map(
            lambda v, t: (
                1.0
                - mean(jnp.square(jax.lax.stop_gradient(v) - t), axis_name)
                / (variance(t, axis_name) + 1e-8)
            ),
            values,
            targets,
        )
    return total, metrics


def _standardize(a: Array, axis_name: str | None) -> Array:
    return (a - mean(a, axis_name)) / (jnp.sqrt(variance(a, axis_name)) + 1e-8)
