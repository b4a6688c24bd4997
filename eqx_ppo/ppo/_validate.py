"""What a type cannot say: that an env, a network and a state fit together
(checked while the episode runner is traced, never at run time)."""

import contextlib
import dataclasses
import os
from collections.abc import Iterator, Mapping
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.tree_util import keystr
from jaxtyping import Array, PyTree

from ..nn._adapter import PPONetworkOutput
from ..nn._errors import array_spec
from ..nn._module import AbstractStatefulModule
from ..samplers import CategoricalSampler


def check_output_type(output: Any, who: str = "The network") -> None:
    """Raise unless `output` is a `PPONetworkOutput`."""
    if not isinstance(output, PPONetworkOutput):
        raise TypeError(
            f"{who}'s output must be a `PPONetworkOutput` (end it with "
            f"`PPOAdapter(action=..., value=...)`); got {type(output).__name__}."
        )


def check_network_output(output: Any, reward: Any) -> None:
    """Raise unless the batched output is a `PPONetworkOutput` with a value head
    per reward key and one number per env in every output leaf."""
    check_output_type(output)
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
    # A sampler that left its action axis unsummed would otherwise broadcast
    # against the advantages in the loss, into a wrong surrogate.
    n_envs = jnp.shape(jax.tree.leaves(reward)[0])[:1]
    for name in ("loglikelihoods", "value_estimates"):
        for path, x in jax.tree_util.tree_flatten_with_path(getattr(output, name))[0]:
            if jnp.shape(x) != n_envs:
                raise ValueError(
                    f"The network's {name}{keystr(path)} has shape "
                    f"{jnp.shape(x)[1:]} per env; expected one number per env "
                    "(shape ()). Fix: a sampler's log_likelihood must sum over "
                    "its action's dimensions (e.g. jnp.sum(log_probs)), and a "
                    "value head must output one number per reward key."
                )


def check_samplers(env: Any, network: AbstractStatefulModule) -> None:
    """Raise unless every `CategoricalSampler` draws from `env.n_actions` choices
    (with dict actions, those of its key)."""
    n_actions = getattr(env, "n_actions", None)
    if n_actions is None:
        return
    is_sampler = lambda x: isinstance(x, CategoricalSampler)  # noqa: E731
    leaves = jax.tree_util.tree_leaves_with_path(network, is_leaf=is_sampler)
    for path, sampler in leaves:
        if not is_sampler(sampler):
            continue
        where, expected = "", n_actions
        if isinstance(n_actions, Mapping):
            keys = [p.key for p in path if getattr(p, "key", None) in n_actions]
            if keys:
                where, expected = f"[{keys[-1]!r}]", n_actions[keys[-1]]
        if sampler.n_actions != expected:
            raise ValueError(
                f"The network's CategoricalSampler{where} has {sampler.n_actions!r} "
                f"actions but env.n_actions{where} = {expected!r}. Fix: build it "
                f"with action_size=env.n_actions ({n_actions!r}), discrete=True."
            )


def check_actions(env: Any, actions: PyTree[Array]) -> None:
    """Raise unless `actions` have the per-env shapes of `env.action_size`
    (that of a continuous env: one without `n_actions`)."""
    if getattr(env, "n_actions", None) is not None:
        return
    size = getattr(env, "action_size", None)
    if isinstance(size, int):
        expected = (size,)
    elif isinstance(size, Mapping):
        expected = {
            k: (v,) if isinstance(v, int) else tuple(v) for k, v in size.items()
        }
    else:
        return
    shapes = jax.tree.map(lambda a: tuple(a.shape[1:]), actions)
    if shapes == expected:
        return
    if any(jnp.issubdtype(a.dtype, jnp.integer) for a in jax.tree.leaves(actions)):
        fix = (
            "the network samples discrete actions, but the env is continuous (it "
            "has no n_actions): build it with discrete=False (a Gaussian sampler)"
        )
    else:
        fix = (
            "build the network with the env's action_size (for dict actions, a "
            "`Map` of samplers with the same keys)"
        )
    raise ValueError(
        "The network's actions do not match the env's action_size.\n"
        f"  network actions (per env): {shapes}\n"
        f"  env.action_size: {env.action_size}\n"
        f"Fix: {fix}."
    )


@contextlib.contextmanager
def seed_axis_hint(network: Any, name: str = "network") -> Iterator[None]:
    """Add a hint to an error raised while `network` runs if it looks like a
    stack of seeds' networks (every array leaf has one leading axis size)."""
    try:
        yield
    except (ValueError, TypeError) as error:
        arrays = [x for x in jax.tree.leaves(network) if eqx.is_array(x)]
        sizes = {x.shape[0] if x.ndim else 0 for x in arrays}
        if arrays and len(sizes) == 1 and sizes != {0}:
            (n,) = sizes
            error.add_note(
                f"Every array of `{name}` has a leading axis of {n}: a network from a "
                f"run with TrainConfig(n_seeds={n})? Fix: pick one seed, "
                f"eqx_ppo.select_seed({name}, i), or vmap over the seeds."
            )
        raise


def _per_env(tree: PyTree[Array]) -> dict[str, tuple[tuple[int, ...], Any]]:
    """path -> (per-env shape, dtype) of every leaf of an `[env, ...]` pytree."""
    return {
        keystr(path): (tuple(x.shape[1:]), x.dtype)
        for path, x in jax.tree_util.tree_leaves_with_path(tree)
    }


def check_step_output(before: Any, after: Any) -> None:
    """Raise unless the batched `env.step` output `after` keeps the leaves,
    per-env shapes and dtypes of `before` (the scan carries it), with one
    reward and done per env."""
    fields = ("obs", "reward", "done")
    if dataclasses.is_dataclass(before):
        fields = tuple(f.name for f in dataclasses.fields(before))
    for field in fields:
        want = _per_env(getattr(before, field))
        got = _per_env(getattr(after, field, None))
        problems = [
            f"{field}{p} has per-env shape {shape}, not ()"
            for p, (shape, _) in got.items()
            if shape and field in ("reward", "done")
        ]
        for p in sorted(want.keys() | got.keys()):
            if p not in want:
                problems.append(f"{field}{p} is new")
            elif p not in got:
                problems.append(f"{field}{p} is missing")
            elif want[p] != got[p]:
                problems.append(
                    f"{field}{p} has per-env shape {got[p][0]} and dtype "
                    f"{got[p][1]}, not {want[p][0]} and {want[p][1]}"
                )
        if problems:
            raise ValueError(
                f"env.step returned a state whose {field} differs from the one "
                f"env.reset returned: {'; '.join(problems[:3])}"
                f"{'; ...' if len(problems) > 3 else ''}. Fix: make env.reset and "
                f"env.step return the same {field} entries, shapes and dtypes "
                "(reward and done one scalar per env); the rollout carries the env "
                "state between steps."
            )


def check_initial_state(state: Any, expected: Any) -> None:
    """Raise unless `state` has the leaves of `expected` (a fresh state's
    shapes) and no buffer a chunk has taken."""
    prefix = "train(initial_state=...)"
    fix = "Fix: pass the network and config the state was built with."
    got, want = (
        {keystr(p): x for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}
        for tree in (state, expected)
    )
    for path, x in got.items():
        if isinstance(x, jax.Array) and x.is_deleted():
            raise ValueError(
                f"{prefix}: initial_state{path} has been deleted: a state that "
                "`checkpoint_fn` received and kept as it is lends its buffers to "
                "the next compiled chunk. Fix: keep a host copy inside "
                "checkpoint_fn (jax.device_get), or load the checkpoint it saved."
            )
    if list(got) != list(want):
        i = len(os.path.commonprefix([list(got), list(want)]))
        seen = [list(t)[i] if i < len(t) else "(none)" for t in (got, want)]
        raise ValueError(
            f"{prefix}: the state's structure differs from a fresh state's at leaf "
            f"{i}: {seen[0]} vs {seen[1]}. {fix}"
        )
    for path, spec in want.items():
        x = got[path]
        if isinstance(spec, jax.ShapeDtypeStruct) and (
            not eqx.is_array(x) or (x.shape, x.dtype) != (spec.shape, spec.dtype)
        ):
            raise ValueError(
                f"{prefix}: initial_state{path} is {array_spec(x)}, but a fresh "
                f"state of this config has {array_spec(spec)} (a state of another "
                f"n_seeds or n_envs?). {fix}"
            )


def check_resumed_progress(state: Any, learner: Any, horizon: Any) -> None:
    """Raise unless `learner` can continue `state`: not past `total_steps`, and
    a decaying schedule over the state's `horizon` of updates."""
    done = int(np.max(jax.device_get(state.iteration))) * learner.steps_per_iteration
    if done > learner.n_iterations * learner.steps_per_iteration:
        raise ValueError(
            f"train(initial_state=...): the state has trained {done} env steps, "
            f"more than total_steps={learner.total_steps}. Fix: raise "
            "total_steps to train it further, or use the state as it is."
        )
    updates = None if horizon is None else int(np.max(jax.device_get(horizon)))
    if updates is not None and updates != learner.n_updates:
        raise ValueError(
            f"train(initial_state=...): the state's {learner.lr_schedule} "
            f"learning-rate schedule runs over {updates} updates, but this "
            f"learner's over {learner.n_updates}: every rate of a decaying schedule "
            "depends on total_steps. Fix: resume with the total_steps the state was "
            "trained for."
        )
