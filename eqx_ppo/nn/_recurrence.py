"""The linear recurrence `h_t = a_t * h_{t-1} + b_t`, resetting on episode ends:
an associative scan, a scan in blocks of steps, or an in-place sequential loop
with its own `vmap` rule and VJP (the loop run backwards), so that neither of
its passes stacks per-step buffers.
"""

import functools
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
from jax import custom_batching
from jaxtyping import Array, Bool, Float, Inexact


def product(
    a: Float[Array, "..."], h: Float[Array, "..."], *, pairs: bool, conjugate: bool
) -> Float[Array, "..."]:
    """`a * h`; with `pairs`, of complex vectors stored as real and imaginary
    parts along the second-last axis, `a` conjugated if `conjugate`."""
    if not pairs:
        return a * h
    a_re, a_im = a[..., :1, :], a[..., 1:, :]
    if conjugate:
        a_im = -a_im
    h_re, h_im = h[..., :1, :], h[..., 1:, :]
    return jnp.concatenate([a_re * h_re - a_im * h_im, a_re * h_im + a_im * h_re], -2)


def _compose(
    earlier: tuple[Inexact[Array, "..."], Inexact[Array, "..."]],
    later: tuple[Inexact[Array, "..."], Inexact[Array, "..."]],
) -> tuple[Inexact[Array, "..."], Inexact[Array, "..."]]:
    """The affine map `h -> a h + b` of `earlier` followed by that of `later`."""
    a1, b1 = earlier
    a2, b2 = later
    return a2 * a1, a2 * b1 + b2


def _at(x: Array, t: Any, axis: int) -> Array:
    """Step `t` of `x` along `axis`, kept as an axis of length 1; an `x` that is
    the same at every step has length 1 there already."""
    return x if x.shape[axis] == 1 else jax.lax.dynamic_slice_in_dim(x, t, 1, axis)


class _Steps(NamedTuple):
    """What the sequential loop runs: `h_t = a_t * start_t + b_t`, starting
    from `h0` at `t = 0`, then from the state before where `keep[t]`, else
    from `h_reset`. Every leaf has a time axis; `a`'s may have length 1."""

    a: Float[Array, "#time ..."]
    b: Float[Array, "time ..."]
    keep: Bool[Array, "time ..."]
    h0: Float[Array, "1 ..."]
    h_reset: Float[Array, "1 ..."]


def _forward_loop(steps: _Steps, axis: int, pairs: bool) -> Float[Array, "..."]:
    """Every state, along time `axis`, written in place over `steps.b`."""
    a, b, keep, h0, h_reset = steps
    first = product(_at(a, 0, axis), h0, pairs=pairs, conjugate=False)
    h = jax.lax.dynamic_update_slice_in_dim(b, first + _at(b, 0, axis), 0, axis)

    def step(t, h):
        a_t = _at(a, t, axis)
        # Select after multiplying: a select feeding the product costs XLA:CPU
        # several times the loop's arithmetic.
        update = jnp.where(
            _at(keep, t, axis),
            product(a_t, _at(h, t - 1, axis), pairs=pairs, conjugate=False),
            product(a_t, h_reset, pairs=pairs, conjugate=False),
        )
        return jax.lax.dynamic_update_slice_in_dim(h, update + _at(h, t, axis), t, axis)

    return jax.lax.fori_loop(1, b.shape[axis], step, h)


def _backward_loop(
    steps: _Steps, cotangent: Float[Array, "..."], axis: int, pairs: bool
) -> Float[Array, "..."]:
    """The forward loop's adjoint, in place: state `t` gets its cotangent plus
    `conj(a[t + 1])` times the gradient of state `t + 1`, unless `t + 1`
    restarted."""
    n_steps = cotangent.shape[axis]

    def step(i, d):
        t = n_steps - 2 - i
        back = product(
            _at(steps.a, t + 1, axis), _at(d, t + 1, axis), pairs=pairs, conjugate=True
        )
        back = jnp.where(_at(steps.keep, t + 1, axis), back, 0.0)
        return jax.lax.dynamic_update_slice_in_dim(d, back + _at(d, t, axis), t, axis)

    return jax.lax.fori_loop(0, n_steps - 1, step, cotangent)


@functools.cache
def _batched(loop: Callable, axis: int, pairs: bool) -> Callable:
    """`loop` over time `axis`, vmapped by running it one axis further along,
    so its slices stay plain slices rather than gathers and scatters."""

    @custom_batching.custom_vmap
    def batched(*args):
        return loop(*args, axis, pairs)

    @batched.def_vmap
    def _(axis_size, in_batched, *args):
        args = jax.tree.map(
            lambda x, is_batched: (
                x if is_batched else jnp.broadcast_to(x, (axis_size, *x.shape))
            ),
            args,
            tuple(in_batched),
        )
        return _batched(loop, axis + 1, pairs)(*args), True

    return batched


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _sequential(steps: _Steps, pairs: bool) -> Float[Array, "time ..."]:
    """Every state of the recurrence, one step after another; its gradient
    is `_backward_loop`."""
    return _batched(_forward_loop, 0, pairs)(steps)


def _sequential_forward(steps, pairs):
    states = _sequential(steps, pairs)
    return states, (steps, states)


def _sequential_backward(pairs, residuals, cotangent):
    steps, states = residuals
    a, _, keep, h0, h_reset = steps
    d_states = _batched(_backward_loop, 0, pairs)(steps, cotangent)
    # What each step multiplied by `a`: the state before it, or where it started.
    d_first = product(h0, d_states[:1], pairs=pairs, conjugate=True)
    d_rest = product(
        jnp.where(keep[1:], states[:-1], h_reset),
        d_states[1:],
        pairs=pairs,
        conjugate=True,
    )
    d_h0 = product(a[:1], d_states[:1], pairs=pairs, conjugate=True)
    if a.shape[0] == 1:
        # A shared `a` factors out of both sums, which spares a full-length
        # product and concatenation (the LRU's update).
        d_a = d_first + jnp.sum(d_rest, 0, keepdims=True)
        restarts = jnp.sum(jnp.where(keep[1:], 0.0, d_states[1:]), 0, keepdims=True)
        d_reset = product(a, restarts, pairs=pairs, conjugate=True)
    else:
        d_a = jnp.concatenate([d_first, d_rest])
        d_start = product(a[1:], d_states[1:], pairs=pairs, conjugate=True)
        d_reset = jnp.sum(jnp.where(keep[1:], 0.0, d_start), 0, keepdims=True)
    return (_Steps(d_a, d_states, None, d_h0, d_reset),)


_sequential.defvjp(_sequential_forward, _sequential_backward)


def linear_recurrence(
    a: Float[Array, " #time env *state"],
    b: Float[Array, " time env *state"],
    h0: Float[Array, " env *state"],
    done: Bool[Array, " time env"],
    h_reset: Float[Array, "*state"],
    *,
    method: Literal["associative", "blocked", "sequential"] = "associative",
    pairs: bool = False,
) -> tuple[Float[Array, " time env *state"], Float[Array, " env *state"]]:
    """All states of `h_t = a_t * h_{t-1} + b_t` of each env from its `h0`,
    resetting on its `done`.

    As in `replay`, `done[t]` replaces the state after step `t` by `h_reset`.
    Returns the state after every step (before its reset) and the carry after
    the last step (reset if it was done). With `pairs=True` the states are
    complex, `[..., 2, n]` (the LRU's layout). `a` may have a time axis of
    length 1: the same at every step, never broadcast.

    `method`: an associative scan, a `_blocked` one or the sequential loop per
    env (no `jvp`). The scans fold a step that starts from a known state into
    its offset (`b_t <- a_t * start + b_t`, `a_t <- 0`)."""
    n_steps = done.shape[0]
    per_step = done.shape + (1,) * (b.ndim - 2)
    first = (jnp.arange(n_steps) == 0).reshape((n_steps,) + (1,) * (b.ndim - 1))
    restart = first | jnp.roll(done, 1, axis=0).reshape(per_step)
    if method == "sequential":
        per_env = jax.vmap(
            functools.partial(_sequential, pairs=pairs),
            in_axes=(_Steps(1, 1, 1, 1, None),),
            out_axes=1,
        )
        states = per_env(_Steps(a, b, ~restart, h0[None], h_reset[None]))
    else:
        start = jnp.where(first, h0, h_reset)
        b = jnp.where(restart, product(a, start, pairs=pairs, conjugate=False) + b, b)
        a = jnp.where(restart, 0.0, a)  # broadcast over time
        states = (_blocked if method == "blocked" else _associative)(a, b, pairs)
    return states, jnp.where(done[-1].reshape(per_step[1:]), h_reset, states[-1])


def _complex(x: Float[Array, "time env 2 n"], flat: bool) -> Array:
    """Pairs as complex64, `[time, env, n]`, or with `flat`, `[time, env * n]`."""
    z = jax.lax.complex(x[..., 0, :], x[..., 1, :])
    return z.reshape(z.shape[0], -1) if flat else z


def _pairs(z: Array, shape: tuple[int, ...]) -> Float[Array, "time env 2 n"]:
    """Complex states back as pairs of the given `shape`."""
    z = z.reshape(*shape[:-2], 1, shape[-1])
    return jnp.concatenate([jnp.real(z), jnp.imag(z)], -2)


def _associative(a, b, pairs: bool) -> Float[Array, "time env ..."]:
    """`linear_recurrence`'s states by one associative scan along time.

    A real recurrence scans each env apart (`vmap`), a complex one all envs at
    once as complex64 `[time, env, n]`, flat on a TPU, `[time, env * n]`: XLA:TPU
    lays the others out with time as the lane axis, where the scan's strided
    slices dominate; on a CPU the flat form is slower (`tpu_lru_layouts.md`)."""
    if not pairs:
        per_env = jax.vmap(lambda *ab: jax.lax.associative_scan(_compose, ab)[1], 1, 1)
        return per_env(a, b)
    flat = jax.default_backend() == "tpu"
    z = jax.lax.associative_scan(_compose, (_complex(a, flat), _complex(b, flat)))
    return _pairs(z[1], b.shape)


def _blocked(a, b, pairs: bool) -> Inexact[Array, "time ..."]:
    """`linear_recurrence`'s states from `h_{-1} = 0` by two short scans: one
    through blocks of 16 steps (32 past 64), all blocks at once, then one
    over the blocks carrying each block's start in; about `2 sqrt(T)`
    dependent steps. A complex one runs flat, `[time, env * n]`, as above."""
    if pairs:
        return _pairs(_blocked(_complex(a, True), _complex(b, True), False), b.shape)
    n_steps = b.shape[0]
    block = min(16 if n_steps <= 64 else 32, n_steps)
    n_blocks = -(-n_steps // block)
    padding = [(0, n_blocks * block - n_steps)] + [(0, 0)] * (b.ndim - 1)
    a, b = jnp.pad(a, padding, constant_values=1), jnp.pad(b, padding)
    a, b = (x.reshape(n_blocks, block, *x.shape[1:]).swapaxes(0, 1) for x in (a, b))

    def within(carry, ab):  # the block's steps so far as one map `h -> gain h + state`
        carry = _compose(carry, ab)
        return carry, carry

    ones = jnp.ones_like(b[0])
    gains, states = jax.lax.scan(within, (ones, 0 * ones), (a, b))[1]
    entering = jax.lax.scan(
        lambda h, x: (x[0] * h + x[1], h), 0 * ones[0], (gains[-1], states[-1])
    )[1]
    states = states + gains * entering
    return states.swapaxes(0, 1).reshape(-1, *states.shape[2:])[:n_steps]


def replay_method(parallel_replay: bool | None, pairs: bool, n_steps: int) -> str:
    """How a layer replays `n_steps`: `parallel_replay=True` associatively,
    `False` by the loop, `None` as measured fastest (`benchmarks.memory`,
    `results/tpu_blocked_replay.md`): the loop on CPUs, blocked on TPUs (but
    the loop for a complex one of <= 64 steps), associatively elsewhere."""
    if parallel_replay is not None:
        return "associative" if parallel_replay else "sequential"
    backend = jax.default_backend()
    if backend == "tpu":
        return "sequential" if pairs and n_steps <= 64 else "blocked"
    return "sequential" if backend == "cpu" else "associative"
