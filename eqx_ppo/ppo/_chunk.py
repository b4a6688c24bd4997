"""The compiled chunk: `step` run a traced number of times in one program,
over every seed, on one device or over a mesh; lowered on the caller's
thread and compiled in a background one."""

import concurrent.futures
import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jaxtyping import Array

from ..nn import merged_steps
from ._host import paused_gc
from ._sharding import on_mesh
from ._step import TrainingState


def seed_zero(tree: Any) -> Any:
    return jax.tree.map(lambda x: x[0] if eqx.is_array(x) else x, tree)


def with_seed_axis(tree: Any) -> Any:
    return jax.tree.map(lambda x: x[None] if eqx.is_array(x) else x, tree)


def over_seeds(fn: Callable, stacked: Any) -> Any:
    """`fn` of every seed's part of `stacked`, stacked: a `vmap`, or for one
    seed a call on its slice (which traces and compiles faster)."""
    n_seeds = next(x for x in jax.tree.leaves(stacked) if eqx.is_array(x)).shape[0]
    if n_seeds > 1:
        with merged_steps():
            return eqx.filter_vmap(fn)(stacked)
    return with_seed_axis(fn(seed_zero(stacked)))


class Chunk(eqx.Module):
    """What a compiled chunk runs: `step` (`state -> (state, metrics)`), at most
    `length` times, on one device or data-parallel over `mesh`."""

    step: Callable
    length: int = eqx.field(static=True)
    mesh: Mesh | None = eqx.field(static=True)


def scan_steps(chunk: Chunk, state: TrainingState, n_active: Array):
    """`n_active <= chunk.length` steps in a loop with a traced bound, writing
    each step's metrics into buffers of `chunk.length` rows."""
    dynamic, static = eqx.partition(state, eqx.is_array)

    # Jitted, so the step is traced once: for the buffers' shapes and again in
    # the loop, JAX reuses the cached trace of this one function.
    @jax.jit
    def run(d):
        new, metrics = chunk.step(eqx.combine(d, static))
        return eqx.filter(new, eqx.is_array), metrics

    _, shapes = jax.eval_shape(run, dynamic)
    buffers = jax.tree.map(
        lambda m: jnp.zeros((chunk.length, *m.shape), m.dtype), shapes
    )

    def body(i, carry):
        d, buffers = carry
        d, metrics = run(d)
        write = functools.partial(jax.lax.dynamic_update_index_in_dim, index=i, axis=0)
        return d, jax.tree.map(write, buffers, metrics)

    dynamic, metrics = jax.lax.fori_loop(0, n_active, body, (dynamic, buffers))
    return eqx.combine(dynamic, static), metrics


def seeds_chunk(states: TrainingState, chunk: Chunk, n_active: Array):
    return over_seeds(lambda state: scan_steps(chunk, state, n_active), states)


def _leaves(tree: Any, is_array: Callable = eqx.is_array):
    """`tree`'s treedef, its leaves with `None` for each array, and its arrays:
    one flatten, where a partition and a combine of Modules take four."""
    leaves, treedef = jax.tree.flatten(tree)
    rest = tuple(None if is_array(x) else x for x in leaves)
    return treedef, rest, tuple(x for x in leaves if is_array(x))


def _filled(treedef: Any, rest: tuple, arrays: Any) -> Any:
    """The tree of `_leaves`, with `arrays` in the arrays' places."""
    it = iter(arrays)
    return jax.tree.unflatten(treedef, [next(it) if x is None else x for x in rest])


@functools.partial(jax.jit, static_argnums=0, donate_argnums=2)
def _run_chunk(static, chunk_arrays: tuple, arrays: tuple, n_active: Array):
    """The compiled chunk on the chunk's and the states' arrays, as flat tuples
    (quick to pass in and out, once per chunk); `static` is the treedef and
    non-array leaves of each."""
    (chunk_def, chunk_rest), (treedef, rest) = static
    chunk = _filled(chunk_def, chunk_rest, chunk_arrays)
    states = _filled(treedef, rest, arrays)
    if chunk.mesh is None:
        states, metrics = seeds_chunk(states, chunk, n_active)
    else:
        sharded = dataclasses.replace(
            chunk, step=jax.tree_util.Partial(chunk.step, axis_name="env")
        )
        states, metrics = on_mesh(seeds_chunk, chunk.mesh, states, sharded, n_active)
    return _leaves(states)[2], metrics


_COMPILER = concurrent.futures.ThreadPoolExecutor(1, "eqx_ppo-compile")


@paused_gc()
def compile_chunk(chunk: Chunk, states: TrainingState) -> concurrent.futures.Future:
    """`chunk`'s program for `states` (arrays, or their `jax.ShapeDtypeStruct`s),
    traced and lowered now and compiled in a thread: XLA compiles without
    Python's lock, so the initialisation and the first evaluation go on
    meanwhile. The future's result runs it: `(states, n_active) -> (states,
    metrics)`."""

    def is_array(x: Any) -> bool:
        return eqx.is_array(x) or isinstance(x, jax.ShapeDtypeStruct)

    chunk_def, chunk_rest, chunk_arrays = _leaves(chunk, is_array)
    treedef, rest, arrays = _leaves(states, is_array)
    static = ((chunk_def, chunk_rest), (treedef, rest))
    n_active = jax.ShapeDtypeStruct((), jnp.int32)
    lowered = _run_chunk.lower(static, chunk_arrays, arrays, n_active)

    def compile():
        compiled = lowered.compile()

        def run(states: TrainingState, n_active: int):
            treedef, rest, arrays = _leaves(states)
            new, metrics = compiled(chunk_arrays, arrays, np.int32(n_active))
            return _filled(treedef, rest, new), metrics

        return run

    return _COMPILER.submit(compile)
