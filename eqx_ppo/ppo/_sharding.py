"""Data parallelism over the env axis: the mesh, state placement and collectives.

A sharded run splits the env axis of the training state (env states, network
carries) and of everything built from it inside a step (rollout buffers,
minibatches) over a 1-D device mesh whose axis is named `"env"`. Parameters,
optimiser state, statistics, the run's key and the counters are replicated.

The step runs under `jax.shard_map` with explicit collectives, rather than
under `jax.jit` with sharding annotations left to the GSPMD partitioner,
because

1. every collective is written where it happens (`pmean` of gradients,
   advantage moments and loss metrics; `all_gather` of statistics inputs and
   logged rollout data), so the communication of an iteration is predictable
   and does not change with the compiler's propagation choices;
2. minibatch shuffles are device-local by construction: a device permutes its
   own envs, so no minibatch gather crosses devices (the partitioner would
   turn a global permutation into all-to-all traffic);
3. the body is the single-device code with a few `axis_name` branches, so a
   step on one device and its sharded version are easy to compare.

The body runs with `check_vma=False`: user layers may start internal scans
from constants, which the varying-manual-axes type checker rejects. The
collectives below keep replicated outputs identical on every device.
"""

from collections.abc import Callable, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec
from jaxtyping import Array, Int, Key, PRNGKeyArray, PyTree

from .._typecheck import checked

ENV_AXIS = "env"
"""The name of the mesh axis that splits the envs."""


@checked
def make_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A 1-D mesh over `devices` with the axis `"env"`, for `train(mesh=...)`.

    **Arguments:**

    - `devices`: the devices to spread the envs over; default `jax.devices()`,
      which is every local device, or every device of every process once
      `jax.distributed.initialize()` has run.
    """
    devices = jax.devices() if devices is None else list(devices)
    if not devices:
        raise ValueError("make_mesh(devices=[]): expected at least one device.")
    for i, device in enumerate(devices):
        if device in devices[:i]:
            raise ValueError(
                f"make_mesh(devices=...): device {device} is listed twice; each "
                "device holds its own share of the envs. Fix: pass distinct devices."
            )
    return Mesh(np.asarray(devices), (ENV_AXIS,), axis_types=(AxisType.Auto,))


def check_mesh(mesh: Mesh, n_envs: int, n_minibatches: int) -> None:
    """Raise if `mesh` is not a 1-D `"env"` mesh that divides the minibatches."""
    if tuple(mesh.axis_names) != (ENV_AXIS,):
        raise ValueError(
            f"train(mesh=...): expected a 1-D mesh with the axis name "
            f"{ENV_AXIS!r}; got axis names {tuple(mesh.axis_names)}. Fix: build it "
            "with `eqx_ppo.make_mesh(devices)`."
        )
    explicit = [t for t in mesh.axis_types if t != AxisType.Auto]
    if explicit:
        raise ValueError(
            f"train(mesh=...): the axis {ENV_AXIS!r} has type {explicit[0].name}; "
            "eqx_ppo places arrays itself and needs Auto. Fix: "
            "eqx_ppo.make_mesh(devices), or jax.make_mesh(..., "
            "axis_types=(jax.sharding.AxisType.Auto,))."
        )
    n_devices = mesh.size
    if n_envs % (n_devices * n_minibatches):
        per_step = n_devices * n_minibatches
        raise ValueError(
            f"train(mesh=...): n_envs={n_envs} must be divisible by n_devices * "
            f"n_minibatches = {n_devices} * {n_minibatches} = {per_step}, because "
            "each device holds n_envs / n_devices envs and splits them into "
            f"n_minibatches local minibatches. Fix: use n_envs="
            f"{per_step * max(1, round(n_envs / per_step))}, fewer minibatches or "
            "a mesh of fewer devices."
        )


def is_main_process() -> bool:
    """Whether this is process 0, the one that logs, evaluates and checkpoints."""
    return jax.process_index() == 0


def env_offset(n_local: int, axis_name: str | None) -> Int[Array, ""] | int:
    """The global id of this device's first env (`0` when not sharded)."""
    if axis_name is None:
        return 0
    return jax.lax.axis_index(axis_name) * n_local


def shard_env_keys(
    key: PRNGKeyArray, n_local: int, axis_name: str | None
) -> Key[Array, " env"]:
    """This device's slice of the per-env keys `jax.random.split(key, n_envs)`.

    Every device splits for all envs and keeps its own, so env `i` gets the
    same key on any number of devices or processes, and no two envs share one.
    """
    if axis_name is None:
        return jax.random.split(key, n_local)
    n_envs = n_local * jax.lax.axis_size(axis_name)
    return jax.lax.dynamic_slice_in_dim(
        jax.random.split(key, n_envs), env_offset(n_local, axis_name), n_local
    )


def pmean(tree: PyTree, axis_name: str | None) -> PyTree:
    """`lax.pmean` over the env axis; the identity when not sharded."""
    if axis_name is None:
        return tree
    return jax.lax.pmean(tree, axis_name)


def mean(x: Array, axis_name: str | None) -> Array:
    """The mean over all envs of all devices (equal shares per device)."""
    return pmean(jnp.mean(x), axis_name)


def variance(x: Array, axis_name: str | None) -> Array:
    """The variance over all envs of all devices, by two passes for accuracy."""
    if axis_name is None:
        return jnp.var(x)
    centre = mean(x, axis_name)
    return mean(jnp.square(x - centre), axis_name)


def gather_envs(tree: PyTree, axis_name: str | None, axis: int = 1) -> PyTree:
    """Every device's `[T, B_local, ...]` leaves joined into `[T, B, ...]`.

    Used for statistics updates and logged rollout data, so each device computes
    exactly what one device would; XLA drops the gathers nobody reads.
    """
    if axis_name is None:
        return tree
    return jax.tree.map(
        lambda x: jax.lax.all_gather(x, axis_name, axis=axis, tiled=True), tree
    )


def _is_key(x: Any) -> bool:
    return isinstance(x, jax.Array) and jax.dtypes.issubdtype(
        x.dtype, jax.dtypes.prng_key
    )


def partition_specs(state: Any) -> PyTree[PartitionSpec]:
    """The `PartitionSpec` of every array of a training state.

    The fields named in the state class's `env_fields` are split on their env
    axis (the leading axis, or the second one under a leading seed axis); every
    other array is replicated.
    """
    fields = getattr(type(state), "env_fields", None)
    if fields is None:
        raise TypeError(
            f"{type(state).__name__} has no `env_fields`: expected a TrainingState."
        )
    seed_axes = (None,) * jnp.ndim(state.iteration)
    env = PartitionSpec(*seed_axes, ENV_AXIS)

    def spec(path, _):
        return env if getattr(path[0], "name", None) in fields else PartitionSpec()

    return jax.tree_util.tree_map_with_path(spec, eqx.filter(state, eqx.is_array))


def _place(x: Array | np.ndarray, sharding: NamedSharding) -> Array:
    if _is_key(x):
        data = _place(jax.random.key_data(x), sharding)
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


@checked
def shard_state(state: Any, mesh: Mesh) -> Any:
    """`state` (a `TrainingState`) placed on `mesh`.

    Env states and carries are split over the devices on their env axis,
    everything else is replicated. In a multi-process run every process must
    pass the same `state` (as `init` with the same key gives).
    """
    dynamic, static = eqx.partition(state, eqx.is_array)
    placed = jax.tree.map(
        lambda x, spec: _place(x, NamedSharding(mesh, spec)),
        dynamic,
        partition_specs(state),
    )
    return eqx.combine(placed, static)


def to_local(tree: PyTree) -> PyTree:
    """A copy of `tree` on this process's first device, unsharded.

    Arrays split across processes are gathered (`process_allgather`, a
    collective: every process must call this on the same tree); replicated
    and local arrays are copied without communication.
    """
    from jax.experimental import multihost_utils

    device = jax.local_devices()[0]

    def one(x):
        if not isinstance(x, jax.Array):
            return x
        if _is_key(x):
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
    """`fn(state, *args) -> (state, out)` run per device under `jax.shard_map`.

    The state is split as `partition_specs` says; `fn` (which may be a
    pytree, e.g. a `jax.tree_util.Partial`), `args` and `out` are replicated,
    so `fn` must reduce what it returns in `out` over the `"env"` axis. The
    returned state keeps the input's static structure.
    """
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

    `step(state, *, axis_name)` is e.g. `jax.tree_util.Partial(eqx_ppo.step, env,
    learner)`, for any learner; the
    result maps a state placed with `eqx_ppo.shard_state` to `(state,
    metrics)`, with env states and carries still split and metrics replicated.
    Wrap it in `eqx.filter_jit`.
    """

    def sharded(state):
        return on_mesh(_call_on_axis, mesh, state, step)

    return sharded


def _call_on_axis(state: Any, step: Callable) -> tuple[Any, Any]:
    return step(state, axis_name=ENV_AXIS)
