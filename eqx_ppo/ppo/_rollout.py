"""Stepping a batch of envs with a network: auto-reset, rollouts and evaluation.

The library owns the episode boundary: after `env.step`, every env whose
`done` is set gets a start state *and* its network carry reset, by the same
mask, before the next step. The transition keeps the pre-reset (terminal)
observation for truncation bootstrapping.
"""

from collections.abc import Mapping
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Key, PRNGKeyArray, PyTree

from ..logging import LoggingLevel, reduce_metric
from ..nn._adapter import PPONetworkOutput
from ..nn._module import AbstractStatefulModule, State, reset_where
from ._sharding import shard_env_keys
from ._validate import check_key, check_step_output


class Transition(NamedTuple):
    """One rollout step for every env; the rollout stacks it to `[T, B, ...]`.

    `key` holds the network key each env used at this step (`[env]`, from
    `env_keys` of the step's key), so a replay of any env subset reproduces
    every stochastic layer exactly by slicing it like any other field. In a
    sharded run env `i` gets the key of global env `i`, so the keys do not
    depend on the number of devices.
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


def truncation_flag(env_state: Any) -> Bool[Array, " env"]:
    """`info["truncation"]` (Brax) or `info["truncated"]`, else all false."""
    info = env_state.info
    for name in ("truncation", "truncated"):
        if name in info:
            return jnp.asarray(info[name]).astype(bool)
    return jnp.zeros(jnp.shape(env_state.done), bool)


def tree_select(mask: Bool[Array, " env"], on_true: Any, on_false: Any) -> Any:
    """Per-env `where` over two pytrees with a leading env axis."""

    def select(a, b):
        m = mask.reshape(mask.shape + (1,) * (jnp.ndim(b) - 1))
        return jnp.where(m, a, b)

    return jax.tree.map(select, on_true, on_false)


def apply_network(
    network: AbstractStatefulModule,
    state: State,
    obs: Any,
    extras: Any,
    keys: Key[Array, " env"] | None,
):
    """`network` vmapped over the leading env axis, one key per env."""
    return jax.vmap(lambda s, o, e, k: network(s, o, e, key=k))(
        state, obs, extras, keys
    )


def reset_carry(
    network: AbstractStatefulModule, done: Bool[Array, " env"], state: State
) -> State:
    """Reset the carries of the envs that are `done`."""
    return jax.vmap(lambda d, s: reset_where(network, d, s))(done, state)


def _check_output(output: Any, reward: Any) -> None:
    if not isinstance(output, PPONetworkOutput):
        raise TypeError(
            "The network's output must be a `PPONetworkOutput` (end it with "
            f"`PPOAdapter(action=..., value=...)`); got {type(output).__name__}."
        )
    value_struct = jax.tree.structure(output.value_estimates)
    reward_struct = jax.tree.structure(reward)
    if value_struct != reward_struct:
        raise ValueError(
            "The network's value estimates must have the env reward's structure "
            "(one value head per reward key).\n"
            f"  value_estimates: {value_struct}\n  reward: {reward_struct}\n"
            "Fix: give the value port one output per reward key (e.g. a `Splitter` "
            "or `Parallel` with the reward's keys)."
        )


def _expected_action_shapes(env: Any) -> Any:
    """Per-env action shapes the env declares, or `None` if it declares none."""
    if getattr(env, "n_actions", None) is not None:
        return None
    size = getattr(env, "action_size", None)
    if isinstance(size, int):
        return (size,)
    if isinstance(size, Mapping):
        return {k: (v,) if isinstance(v, int) else tuple(v) for k, v in size.items()}
    return None


def _step_envs(env: Any, env_state: Any, actions: Any) -> Any:
    """`env.step` vmapped, after checking the actions against `env.action_size`;
    its obs, reward and done are checked against `env_state` (at trace time)."""
    shapes = jax.tree.map(lambda a: tuple(a.shape[1:]), actions)
    expected = _expected_action_shapes(env)
    if expected is not None:
        is_shape = lambda x: isinstance(x, tuple)  # noqa: E731
        if jax.tree.structure(shapes, is_leaf=is_shape) != jax.tree.structure(
            expected, is_leaf=is_shape
        ) or jax.tree.leaves(shapes, is_leaf=is_shape) != jax.tree.leaves(
            expected, is_leaf=is_shape
        ):
            raise ValueError(
                "The network's actions do not match the env's action_size.\n"
                f"  network actions (per env): {shapes}\n"
                f"  env.action_size: {env.action_size}\n"
                "Fix: build the network with the env's action_size (for dict "
                "actions, a `Map` of samplers with the same keys)."
            )
    next_env = jax.vmap(env.step)(env_state, actions)
    check_step_output(env_state, next_env)
    return next_env


class StepCarry(NamedTuple):
    env_state: Any
    net_state: State


def rollout(
    env: Any,
    network: AbstractStatefulModule,
    carry: StepCarry,
    key: PRNGKeyArray,
    *,
    length: int,
    reset_mode: str,
    keep_terminal_obs: bool,
    axis_name: str | None = None,
) -> tuple[StepCarry, Transition]:
    """`length` steps of every env with auto-reset; returns stacked transitions.

    Under `jax.shard_map` with `axis_name`, `carry` holds this device's envs and
    they draw their keys from the split for all envs (see `Transition.key`).
    """
    n_envs = jnp.shape(carry.env_state.done)[0]

    def keys_of(k):
        return shard_env_keys(k, n_envs, axis_name)

    cache_key, keys_key, fresh_key = jax.random.split(key, 3)
    step_keys = jax.random.split(keys_key, length)
    if reset_mode == "cached":
        start_states = jax.vmap(env.reset)(keys_of(cache_key))
        reset_keys = None
    else:
        start_states = None
        reset_keys = jax.random.split(fresh_key, length)

    def step(c: StepCarry, xs):
        step_key, reset_key = xs
        net_keys = keys_of(step_key)
        out = apply_network(network, c.net_state, c.env_state.obs, None, net_keys)
        _check_output(out.output, c.env_state.reward)
        next_env = _step_envs(env, c.env_state, out.output.actions)
        done = jnp.asarray(next_env.done).astype(bool)
        transition = Transition(
            obs=c.env_state.obs,
            key=net_keys,
            output=out.output,
            reward=next_env.reward,
            done=done,
            truncated=truncation_flag(next_env) & done,
            terminal_obs=next_env.obs if keep_terminal_obs else None,
            env_metrics=next_env.metrics,
            net_metrics=out.metrics,
            extras=out.extras,
        )
        starts = (
            start_states
            if reset_key is None
            else jax.vmap(env.reset)(keys_of(reset_key))
        )
        next_env = tree_select(done, starts, next_env)
        next_net = reset_carry(network, done, out.next_state)
        return StepCarry(next_env, next_net), transition

    return jax.lax.scan(step, carry, (step_keys, reset_keys), length=length)


class _EvalCarry(NamedTuple):
    env_state: Any
    net_state: State
    finished: Bool[Array, " env"]
    returns: PyTree[Float[Array, " env"]]
    lifespan: Float[Array, " env"]
    sums: dict[str, Any]


def _mask_leaf(alive: Bool[Array, " env"], x: Array) -> Array:
    x = jnp.asarray(x, jnp.float32)
    return jnp.where(alive.reshape(alive.shape + (1,) * (x.ndim - 1)), x, 0.0)


def eval_rollout(
    env: Any,
    network: AbstractStatefulModule,
    key: PRNGKeyArray,
    *,
    n_envs: int,
    max_episode_length: int,
    logging_level: LoggingLevel = LoggingLevel.NONE,
    logging_percentiles: tuple[int | float, ...] | None = None,
) -> dict[str, Array]:
    """Evaluate `network` (put it in inference mode first) for one episode per env.

    Envs are not reset: each runs until its first `done` or `max_episode_length`
    steps. Metrics (all under `eval/`): `episode_reward/{mean,std}` of the total
    return, its percentiles, per-reward-key returns for dict rewards,
    `lifespan` (steps before `done`, counting the final step), and with
    `NETWORK_METRICS` / `ENV_METRICS` the per-episode mean of each network /
    env metric, reduced over units and envs (`eval/net/...`, `eval/env/...`).
    """
    check_key("eval_rollout", key)
    reset_key, net_key = jax.random.split(key)
    env_state = jax.vmap(env.reset)(env_keys(reset_key, n_envs))
    net_state = network.initialize_state(n_envs)
    step_keys = jax.random.split(net_key, max_episode_length)
    log_net = LoggingLevel.NETWORK_METRICS in logging_level
    log_env = LoggingLevel.ENV_METRICS in logging_level

    def collect(out_metrics, env_metrics):
        sums = {}
        if log_net:
            sums["net"] = out_metrics
        if log_env:
            sums["env"] = env_metrics
        return sums

    def step(c: _EvalCarry, step_key):
        out = apply_network(
            network, c.net_state, c.env_state.obs, None, env_keys(step_key, n_envs)
        )
        _check_output(out.output, c.env_state.reward)
        next_env = _step_envs(env, c.env_state, out.output.actions)
        alive = ~c.finished
        returns = jax.tree.map(
            lambda total, r: total + _mask_leaf(alive, r), c.returns, next_env.reward
        )
        sums = jax.tree.map(
            lambda total, m: total + _mask_leaf(alive, m),
            c.sums,
            collect(out.metrics, next_env.metrics),
        )
        finished = c.finished | jnp.asarray(next_env.done).astype(bool)
        lifespan = c.lifespan + alive.astype(jnp.float32)
        return _EvalCarry(
            next_env, out.next_state, finished, returns, lifespan, sums
        ), None

    probe = jax.eval_shape(
        lambda: collect(
            apply_network(
                network, net_state, env_state.obs, None, env_keys(net_key, n_envs)
            ).metrics,
            env_state.metrics,
        )
    )
    init = _EvalCarry(
        env_state,
        net_state,
        jnp.zeros(n_envs, bool),
        jax.tree.map(lambda r: jnp.zeros(jnp.shape(r), jnp.float32), env_state.reward),
        jnp.zeros(n_envs, jnp.float32),
        jax.tree.map(lambda s: jnp.zeros(s.shape, jnp.float32), probe),
    )
    final, _ = jax.lax.scan(step, init, step_keys)

    metrics: dict[str, Array] = {}
    total = sum(jax.tree.leaves(final.returns))
    metrics["eval/episode_reward/mean"] = jnp.mean(total)
    metrics["eval/episode_reward/std"] = jnp.std(total)
    if logging_percentiles:
        ps = jnp.percentile(total, jnp.asarray(logging_percentiles, jnp.float32))
        for level, p in zip(logging_percentiles, ps, strict=True):
            metrics[f"eval/episode_reward/p{level:g}"] = p
    if isinstance(final.returns, Mapping):
        reduce_metric(
            metrics, "eval/episode_reward", final.returns, logging_percentiles
        )
    reduce_metric(metrics, "eval/lifespan", final.lifespan, logging_percentiles)
    denominator = jnp.maximum(final.lifespan, 1.0)
    episode_means = jax.tree.map(
        lambda s: s / denominator.reshape(denominator.shape + (1,) * (s.ndim - 1)),
        final.sums,
    )
    for group, value in episode_means.items():
        reduce_metric(metrics, f"eval/{group}", value, logging_percentiles)
    return metrics


def record_activations_rollout(
    env: Any,
    network: AbstractStatefulModule,
    n_envs: int,
    max_episode_length: int,
    key: PRNGKeyArray,
) -> tuple[PyTree[Array], Bool[Array, "time env"]]:
    """Run one deterministic episode per env and stack every layer's activations.

    `network` is copied with [`eqx_ppo.with_recording`][] and put in inference
    mode; the original is untouched. Envs are **not** reset mid-rollout: each
    runs a single episode for `max_episode_length` steps, and `dones[t, i]` is
    the pre-step flag "env `i` had already terminated before step `t`"; mask
    those steps out (`acts * (1 - dones)[..., None]`).

    Returns `(activations, dones)`: `activations` mirrors the network like
    [`eqx_ppo.extract_activations`][], each leaf `[max_episode_length, n_envs,
    ...]`. Memory: `max_episode_length * n_envs * (sum of all units)` floats
    stay on the device; shrink `n_envs` or the length on a small GPU.
    """
    from ..recording import extract_activations, with_recording

    recorder = eqx.nn.inference_mode(with_recording(network))
    reset_key, net_key = jax.random.split(key)
    env_state = jax.vmap(env.reset)(env_keys(reset_key, n_envs))
    net_state = recorder.initialize_state(n_envs)
    finished = jnp.zeros(n_envs, bool)

    def step(c, step_key):
        env_state, net_state, finished = c
        out = apply_network(
            recorder, net_state, env_state.obs, None, env_keys(step_key, n_envs)
        )
        next_env = _step_envs(env, env_state, out.output.actions)
        now_finished = finished | jnp.asarray(next_env.done).astype(bool)
        return (next_env, out.next_state, now_finished), (
            extract_activations(out.metrics),
            finished,
        )

    _, (activations, dones) = jax.lax.scan(
        step,
        (env_state, net_state, finished),
        jax.random.split(net_key, max_episode_length),
    )
    return activations, dones
