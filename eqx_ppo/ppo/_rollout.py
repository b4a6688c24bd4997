"""Stepping a batch of envs with a network: auto-reset, rollouts and evaluation."""

import functools
from collections.abc import Mapping
from typing import Any, Literal, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Key, PRNGKeyArray, PyTree

from .._typecheck import Int, checked
from ..envs._env import check_env, reported_truncation, reset_one, step_one
from ..logging import LoggingLevel, reduce_metric
from ..nn._adapter import PPONetworkOutput
from ..nn._module import AbstractStatefulModule, State, checked_output, reset_where
from ..recording import extract_activations, with_recording
from ._sharding import shard_env_keys
from ._validate import (
    check_actions,
    check_network_output,
    check_samplers,
    check_step_output,
    seed_axis_hint,
)


class Transition(NamedTuple):
    """One rollout step for every env; the rollout stacks it to `[T, B, ...]`.

    `key` holds the network key each env used at this step, so a replay of
    any env subset reproduces every stochastic layer by slicing it like any
    other field. `terminal_obs` is the observation before an auto-reset.
    """

    obs: PyTree[Array]
    key: Key[Array, " env"]
    output: PPONetworkOutput
    reward: PyTree[Float[Array, " env"]]
    done: Bool[Array, " env"]
    truncated: Bool[Array, " env"]
    terminal_obs: PyTree[Array] | None
    env_metrics: dict[str, Any]
    net_metrics: dict[str, Any]
    extras: Any


def env_keys(key: PRNGKeyArray, n_envs: int) -> Key[Array, " env"]:
    """The per-env keys of one step: the single place this split happens."""
    return jax.random.split(key, n_envs)


def tree_select(mask: Bool[Array, " env"], on_true: Any, on_false: Any) -> Any:
    """Per-env `where` over two pytrees with a leading env axis."""

    def select(a, b):
        return jnp.where(mask.reshape(mask.shape + (1,) * (jnp.ndim(b) - 1)), a, b)

    return jax.tree.map(select, on_true, on_false)


def apply_network(
    network: AbstractStatefulModule,
    state: State,
    obs: Any,
    extras: Any,
    keys: Key[Array, " env"] | None,
):
    """`network` vmapped over the leading env axis, one key per env."""
    return jax.vmap(
        lambda s, o, e, k: checked_output(network, s, network(s, o, e, key=k))
    )(state, obs, extras, keys)


def reset_carry(
    network: AbstractStatefulModule, done: Bool[Array, " env"], state: State
) -> State:
    """Reset the carries of the envs that are `done`."""
    return jax.vmap(lambda d, s: reset_where(network, d, s))(done, state)


class StepCarry(NamedTuple):
    env_state: Any
    net_state: State


class SaveAt(eqx.Module):
    """What `run_episodes` keeps of every step, stacked to `[T, n_envs, ...]`:
    the named `Transition` fields (the others are `None`), the env states
    before every step, and the recorded activations."""

    transitions: tuple[str, ...] = eqx.field(static=True, default=())
    env_states: bool = eqx.field(static=True, default=False)
    activations: bool = eqx.field(static=True, default=False)

    def __check_init__(self):
        unknown = sorted(set(self.transitions) - set(Transition._fields))
        if unknown:
            raise ValueError(
                f"SaveAt(transitions=...): unknown fields {unknown}; choose from "
                f"{Transition._fields}."
            )


class Steps(NamedTuple):
    """What `run_episodes` saved, per step `[T, ...]`, and `finished`: whether
    an env's first episode had already ended before the step."""

    transitions: Transition
    env_states: Any
    activations: Any
    finished: Bool[Array, "time env"]


def reset_envs(env: Any, keys: Key[Array, " env"]) -> Any:
    """`env.reset` of every env, each through the jitted `reset_one` (as each
    `env.step` through `step_one`), so a run traces the env's code once."""
    return jax.vmap(functools.partial(reset_one, env))(keys)


def start_episodes(
    env: Any, network: AbstractStatefulModule, key: PRNGKeyArray, n_envs: int
) -> StepCarry:
    """Fresh envs (`env.reset` with `env_keys(key, n_envs)`) and initial carries."""
    env_state = reset_envs(env, env_keys(key, n_envs))
    return StepCarry(env_state, network.initialize_state(n_envs))


def fresh_episodes(
    env: Any,
    network: AbstractStatefulModule,
    key: PRNGKeyArray,
    n_envs: int,
    length: int,
    save: SaveAt,
    reset: Literal["fresh", "none"] = "none",
) -> Steps:
    """`run_episodes` from fresh envs (`key` split into `(reset, run)`, the envs
    started by `start_episodes`); by default never reset, for evaluation and
    recording: one episode per env, `Steps.finished` masking what follows."""
    check_env(env)
    reset_key, run_key = jax.random.split(key)
    with seed_axis_hint(network):
        start = start_episodes(env, network, reset_key, n_envs)
        return run_episodes(
            env, network, start, run_key, length=length, reset=reset, save=save
        )[1]


def run_episodes(
    env: Any,
    network: AbstractStatefulModule,
    carry: StepCarry,
    key: PRNGKeyArray,
    *,
    length: int,
    reset: Literal["cached", "fresh", "initial", "none"],
    save: SaveAt,
    starts: Any = None,
    axis_name: str | None = None,
) -> tuple[StepCarry, Steps]:
    """The one episode runner: `length` steps of every env, keeping `save`.

    After every `env.step`, an env whose `done` is set gets a start state
    *and* its carry reset, by the same mask (`"cached"`: start states drawn
    once per call; `"fresh"`: `env.reset` at every step; `"initial"`: the
    given `starts`), or runs on untouched (`"none"`; mask with
    `Steps.finished`).

    `key` is split into `(cache, steps, fresh)`: env `i` acts at step `t`
    with `env_keys(split(steps, length)[t], n_envs)[i]`; start states come
    alike from `cache` (once) or `fresh` (per step). Under `jax.shard_map` a
    device's envs take their share of the split for all envs.
    """
    check_samplers(env, network)
    n_envs = jnp.shape(carry.env_state.done)[0]
    keys_of = functools.partial(shard_env_keys, n_local=n_envs, axis_name=axis_name)
    cache_key, keys_key, fresh_key = jax.random.split(key, 3)
    step_keys = jax.random.split(keys_key, length)
    if reset == "cached":
        starts = reset_envs(env, keys_of(cache_key))
    reset_keys = jax.random.split(fresh_key, length) if reset == "fresh" else None
    keep = set(save.transitions)

    def step(c, xs):
        (env_state, net_state), finished = c
        step_key, reset_key = xs
        net_keys = keys_of(step_key)
        out = apply_network(network, net_state, env_state.obs, None, net_keys)
        check_network_output(out.output, env_state.reward)
        check_actions(env, out.output.actions)
        next_env = jax.vmap(functools.partial(step_one, env))(
            env_state, out.output.actions
        )
        check_step_output(env_state, next_env)
        done = jnp.asarray(next_env.done).astype(bool)
        transition = Transition(
            obs=env_state.obs,
            key=net_keys,
            output=out.output,
            reward=next_env.reward,
            done=done,
            truncated=reported_truncation(next_env) & done,
            terminal_obs=next_env.obs,
            env_metrics=next_env.metrics,
            net_metrics=out.metrics,
            extras=out.extras,
        )
        saved = Steps(
            transitions=Transition(
                **{k: v if k in keep else None for k, v in transition._asdict().items()}
            ),
            env_states=env_state if save.env_states else None,
            activations=extract_activations(out.metrics) if save.activations else None,
            finished=finished,
        )
        next_net = out.next_state
        if reset != "none":
            new = reset_envs(env, keys_of(reset_key)) if reset == "fresh" else starts
            next_env = tree_select(done, new, next_env)
            next_net = reset_carry(network, done, next_net)
        return (StepCarry(next_env, next_net), finished | done), saved

    finished = jnp.zeros(n_envs, bool)
    (carry, _), steps = jax.lax.scan(
        step, (carry, finished), (step_keys, reset_keys), length=length
    )
    return carry, steps


def _mask_leaf(alive: Bool[Array, "..."], x: Array) -> Array:
    x = jnp.asarray(x, jnp.float32)
    return jnp.where(alive.reshape(alive.shape + (1,) * (x.ndim - alive.ndim)), x, 0.0)


@checked
def eval_rollout(
    env: Any,
    network: AbstractStatefulModule,
    key: Key[Array, ""],
    *,
    n_envs: Int,
    max_episode_length: Int,
    logging_level: LoggingLevel = LoggingLevel.NONE,
    logging_percentiles: tuple[int | float, ...] | None = None,
) -> dict[str, Array]:
    """Evaluate `network` (put it in inference mode first) for one episode per env.

    Envs are not reset: each runs until its first `done` or
    `max_episode_length` steps. Returns the `eval/...` metrics the logging
    guide lists; `key` gives the envs' resets and the run.
    """
    levels = {"env": LoggingLevel.ENV_METRICS, "net": LoggingLevel.NETWORK_METRICS}
    groups = [group for group, level in levels.items() if level in logging_level]
    save = SaveAt(transitions=("reward", *(f"{g}_metrics" for g in groups)))
    steps = fresh_episodes(env, network, key, n_envs, max_episode_length, save)
    alive = ~steps.finished

    def episode_sums(tree):
        return jax.tree.map(lambda x: jnp.sum(_mask_leaf(alive, x), axis=0), tree)

    returns = episode_sums(steps.transitions.reward)
    lifespan = jnp.sum(alive.astype(jnp.float32), axis=0)
    metrics: dict[str, Array] = {}
    total = sum(jax.tree.leaves(returns))
    reduce_metric(metrics, "eval/episode_reward", total)  # mean and std, always
    if logging_percentiles:
        reduce_metric(metrics, "eval/episode_reward", total, logging_percentiles)
    if isinstance(returns, Mapping):
        reduce_metric(metrics, "eval/episode_reward", returns, logging_percentiles)
    reduce_metric(metrics, "eval/lifespan", lifespan, logging_percentiles)
    denominator = jnp.maximum(lifespan, 1.0)
    for group in groups:
        means = jax.tree.map(
            lambda s: s / denominator.reshape(denominator.shape + (1,) * (s.ndim - 1)),
            episode_sums(getattr(steps.transitions, f"{group}_metrics")),
        )
        reduce_metric(metrics, f"eval/{group}", means, logging_percentiles)
    return metrics


@checked
def record_activations_rollout(
    env: Any,
    network: AbstractStatefulModule,
    *,
    n_envs: Int,
    max_episode_length: Int,
    key: Key[Array, ""],
) -> tuple[PyTree[Array], Bool[Array, "time env"]]:
    """Run one deterministic episode per env and stack every layer's activations.

    Returns `(activations, dones)`, each leaf `[max_episode_length, n_envs, ...]`,
    on an inference-mode [`eqx_ppo.with_recording`][] copy of `network`. Envs
    are not reset: `dones[t, i]` says env `i` ended before step `t`, so mask
    those steps out (the recording guide).
    """
    recorder = eqx.nn.inference_mode(with_recording(network))
    save = SaveAt(activations=True)
    steps = fresh_episodes(env, recorder, key, n_envs, max_episode_length, save)
    return steps.activations, steps.finished
