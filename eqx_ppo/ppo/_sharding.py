"""Data parallelism over the env axis: the mesh, state placement and collectives.

The env axis of the training state (env states, carries) is split over a 1-D
`"env"` device mesh, everything else replicated; the step runs under
`jax.shard_map` with explicit collectives (the multi-device guide says why).
"""

from collections.abc import Callable, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec
from jaxtyping import Array, Key, PRNGKeyArray, PyTree

from .._typecheck import checked
from ..checkpoint._leaves import is_key

ENV_AXIS = "env"
"""The name of the mesh axis that splits the envs."""


@checked
def make_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A 1-D mesh with the axis `"env"` over the `devices` to spread the envs
    over (default: `jax.devices()`), for `train(mesh=...)`."""
    devices = jax.devices() if devices is None else list(devices)
    if not devices or len(set(devices)) < len(devices):
        raise ValueError(
            f"make_mesh(devices={devices}): expected one or more distinct devices; "
            "each device holds its own share of the envs. Fix: pass distinct devices."
        )
    return Mesh(np.asarray(devices), (ENV_AXIS,), axis_types=(AxisType.Auto,))


def check_mesh(mesh: Mesh, n_envs: int, n_minibatches: int) -> None:
    """Raise if `mesh` is not a 1-D `"env"` mesh that divides the minibatches."""
    axes = tuple(zip(mesh.axis_names, mesh.axis_types, strict=True))
    if axes != ((ENV_AXIS, AxisType.Auto),):
        raise ValueError(
            f"train(mesh=...): expected a 1-D mesh with one Auto axis {ENV_AXIS!r} "
            "(eqx_ppo places arrays itself); got axes "
            f"{[(name, kind.name) for name, kind in axes]}. Fix: "
            "eqx_ppo.make_mesh(devices), or jax.make_mesh(..., "
            "axis_types=(jax.sharding.AxisType.Auto,))."
        )
    per_step = mesh.size * n_minibatches
    if n_envs % per_step:
        raise ValueError(
            f"train(mesh=...): n_envs={n_envs} must be divisible by n_devices * "
            f"n_minibatches = {mesh.size} * {n_minibatches} = {per_step}, because "
            "each device holds n_envs / n_devices envs and splits them into "
            f"n_minibatches local minibatches. Fix: use n_envs="
            f"{per_step * max(1, round(n_envs / per_step))}, fewer minibatches or "
            "a mesh of fewer devices."
        )


def shard_env_keys(
    key: PRNGKeyArray, n_local: int, axis_name: str | None
) -> Key[Array, " env"]:
    """This device's slice of the per-env keys `jax.random.split(key, n_envs)`,
    so env `i` gets the same key on any number of devices."""
    if axis_name is None:
        return jax.random.split(key, n_local)
    n_envs = n_local * jax.lax.axis_size(axis_name)
    first = jax.lax.axis_index(axis_name) * n_local
    return jax.lax.dynamic_slice_in_dim(jax.random.split(key, n_envs), first, n_local)


def pmean(tree: PyTree, axis_name: str | None) -> PyTree:
    """`lax.pmean` over the env axis; the identity when not sharded."""
    return tree if axis_name is None else jax.lax.pmean(tree, axis_name)


def mean(x: Array, axis_name: str | None) -> Array:
    """The mean over all envs of all devices (equal shares per device)."""
    return pmean(jnp.mean(x), axis_name)


def variance(x: Array, axis_name: str | None) -> Array:
    """The variance over all envs of all devices, by two passes for accuracy."""
    if axis_name is None:
        return jnp.var(x)
    return mean(jnp.square(x - mean(x, axis_name)), axis_name)


def gather_envs(tree: PyTree, axis_name: str | None, axis: int = 1) -> PyTree:
    """Every device's `[T, B_local, ...]` leaves joined into `[T, B, ...]`
    (XLA drops the gathers nobody reads)."""
    if axis_name is None:
        return tree
    return jax.tree.map(
        lambda x: jax.lax.all_gather(x, axis_name, axis=axis, tiled=True), tree
    )


def partition_specs(state: Any) -> PyTree[PartitionSpec]:
    """The `PartitionSpec` of every array of a training state: its `env_fields`
    split on their env axis (after any seed axis), the rest replicated."""
    fields = type(state).env_fields
    seed_axes = (None,) * jnp.ndim(state.iteration)
    env = PartitionSpec(*seed_axes, ENV_AXIS)

    def spec(path, _):
        return env if getattr(path[0], "name", None) in fields else PartitionSpec()

    return jax.tree_util.tree_map_with_path(spec, eqx.filter(state, eqx.is_array))


def place(x: Array | np.ndarray, sharding: NamedSharding) -> Array:
    if is_key(x):
        data = place(jax.random.key_data(x), sharding)
        return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
    if not isinstance(x, jax.Array):
        # A host copy (`jax.device_get`): the same value in every process.
        return jax.make_array_from_callback(x.shape, sharding, lambda i: x[i])
    if x.sharding == sharding:
        return x
    if not x.is_fully_addressable:
        return jax.device_put(x, sharding)
    # Every process holds the same host value; each places its own shards, which
    # works for meshes that span processes.
    host = np.asarray(jax.device_get(x))
    return jax.make_array_from_callback(host.shape, sharding, lambda i: host[i])


def to_local(tree: PyTree) -> PyTree:
    """A copy of `tree` on this process's first device, unsharded (a
    collective: every process must call it on the same tree)."""
    from jax.experimental import multihost_utils

    device = jax.local_devices()[0]

    def one(x):
        if not isinstance(x, jax.Array):
            return x
        if is_key(x):
            data = one(jax.random.key_data(x))
            return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
        if not x.is_fully_addressable:
            if x.is_fully_replicated:
                x = x.addressable_data(0)
            else:
                x = multihost_utils.process_allgather(x, tiled=True)
        return jax.device_put(x, device)

    return jax.tree.map(one, tree)


def on_mesh(
    fn: Callable[..., tuple[Any, Any]], mesh: Mesh, state: Any, *args: Any
) -> tuple[Any, Any]:
    """`fn(state, *args) -> (state, out)` run per device under `jax.shard_map`:
    the state split as `partition_specs` says; `fn` (a pytree, e.g. a
    `Partial`), `args` and `out` replicated, so `fn` must reduce `out`."""
    dynamic, static = eqx.partition(state, eqx.is_array)
    replicated, replicated_static = eqx.partition((fn, args), eqx.is_array)
    specs = partition_specs(state)

    def body(dyn, rep):
        f, a = eqx.combine(rep, replicated_static)
        new_state, out = f(eqx.combine(dyn, static), *a)
        return eqx.filter(new_state, eqx.is_array), out

    new_dynamic, out = jax.shard_map(
        body,
        mesh=mesh,
        in_specs=(specs, PartitionSpec()),
        out_specs=(specs, PartitionSpec()),
        check_vma=False,
    )(dynamic, replicated)
    return eqx.combine(new_dynamic, static), out


@checked
def shard_step(step: Callable[..., tuple[Any, Any]], mesh: Mesh) -> Callable:
    """A data-parallel version of a pure step, for your own training loop.

    `step(state, *, axis_name)` is e.g. `Partial(eqx_ppo.step, env, learner)`;
    the result maps a state placed with `eqx_ppo.shard_state` to `(state,
    metrics)`, metrics replicated.
    """
    return lambda state: on_mesh(_call_on_axis, mesh, state, step)


def _call_on_axis(state: Any, step: Callable) -> tuple[Any, Any]:
    return step(state, axis_name=ENV_AXIS)
