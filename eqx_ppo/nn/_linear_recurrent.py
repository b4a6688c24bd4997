"""Linear recurrences with a parallel replay: LRU (carry `(re, im)`), MinGRU (`h`).

Both layers update their carry as `h_t = a_t * h_{t-1} + b_t` with `a_t`, `b_t`
computed from the input `x_t` alone. A step is one such update. The loss
replay computes the coefficients of all `T` steps at once, as one matmul over
the whole sequence, and then composes them (`linear_recurrence`), episode
resets included, in one of two orders:

- with `jax.lax.associative_scan`, in `O(log T)` depth instead of a
  length-`T` loop;
- with a sequential loop whose body is only the elementwise update, written
  in place over the offsets. Its own `vmap` rule keeps the per-step reads
  and writes plain slices of the batched arrays (a vmapped slice would
  become a gather and a scatter), and its hand-written VJP is the same loop
  run backwards, so neither pass stacks per-step buffers. The LRU's
  `lambda`, the same at every step, is never broadcast over the sequence.

Depth only pays where there is parallel width to spend it on. On a CPU the
associative scan's extra passes over the sequence cost more than the
sequential loop saves (`python -m benchmarks.memory`), so by default
(`parallel_replay=None`) the layers compose with the associative scan on
GPUs and TPUs and sequentially on CPUs; `True` or `False` forces one. The
sequential path supports reverse-mode differentiation (`grad`, `vjp`), not
forward mode (`jvp`).
"""

import abc
import functools
import math
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import custom_batching
from jaxtyping import Array, Bool, Float, Inexact, Key, PRNGKeyArray

from ._dense import Initializer, check_size
from ._keys import check_key
from ._module import SequenceOutput
from ._recurrent import (
    _AbstractRecurrentCell,
    _init_input_weights,
    _initial_parameter,
)

LRUState = tuple[Float[Array, " hidden"], Float[Array, " hidden"]]
"""An LRU carry `(re, im)`: the real and imaginary parts of the complex state."""


def _product(
    a: Float[Array, "..."], h: Float[Array, "..."], *, pairs: bool, conjugate: bool
) -> Float[Array, "..."]:
    """`a * h`, elementwise; with `pairs`, of complex vectors stored as their
    real and imaginary parts along the second-last axis, `a` conjugated if
    `conjugate`."""
    if not pairs:
        return a * h
    a_re, a_im = a[..., :1, :], a[..., 1:, :]
    if conjugate:
        a_im = -a_im
    h_re, h_im = h[..., :1, :], h[..., 1:, :]
    return jnp.concatenate([a_re * h_re - a_im * h_im, a_re * h_im + a_im * h_re], -2)


def _compose(
    earlier: tuple[Float[Array, "..."], Float[Array, "..."]],
    later: tuple[Float[Array, "..."], Float[Array, "..."]],
    *,
    pairs: bool,
) -> tuple[Float[Array, "..."], Float[Array, "..."]]:
    """The affine map `h -> a h + b` of `earlier` followed by that of `later`."""
    a1, b1 = earlier
    a2, b2 = later
    return (
        _product(a2, a1, pairs=pairs, conjugate=False),
        _product(a2, b1, pairs=pairs, conjugate=False) + b2,
    )


def _at(x: Array, t: Any, axis: int) -> Array:
    """Step `t` of `x` along `axis`, kept as an axis of length 1; an `x` that is
    the same at every step has length 1 there already."""
    if x.shape[axis] == 1:
        return x
    return jax.lax.dynamic_slice_in_dim(x, t, 1, axis)


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
    first = _product(_at(a, 0, axis), h0, pairs=pairs, conjugate=False)
    h = jax.lax.dynamic_update_slice_in_dim(b, first + _at(b, 0, axis), 0, axis)

    def step(t, h):
        a_t = _at(a, t, axis)
        # Select after multiplying: a select feeding the product costs XLA:CPU
        # several times the loop's arithmetic.
        update = jnp.where(
            _at(keep, t, axis),
            _product(a_t, _at(h, t - 1, axis), pairs=pairs, conjugate=False),
            _product(a_t, h_reset, pairs=pairs, conjugate=False),
        )
        return jax.lax.dynamic_update_slice_in_dim(h, update + _at(h, t, axis), t, axis)

    return jax.lax.fori_loop(1, b.shape[axis], step, h)


def _backward_loop(
    steps: _Steps, cotangent: Float[Array, "..."], axis: int, pairs: bool
) -> Float[Array, "..."]:
    """The forward loop's adjoint: the gradient of every state, in place.

    State `t` gets its own cotangent plus `conj(a[t + 1])` times the gradient
    of state `t + 1`, unless step `t + 1` restarted.
    """
    n_steps = cotangent.shape[axis]

    def step(i, d):
        t = n_steps - 2 - i
        back = _product(
            _at(steps.a, t + 1, axis), _at(d, t + 1, axis), pairs=pairs, conjugate=True
        )
        back = jnp.where(_at(steps.keep, t + 1, axis), back, 0.0)
        return jax.lax.dynamic_update_slice_in_dim(d, back + _at(d, t, axis), t, axis)

    return jax.lax.fori_loop(0, n_steps - 1, step, cotangent)


@functools.cache
def _batched(loop: Callable, axis: int, pairs: bool) -> Callable:
    """`loop` over time `axis`, vmapped by running it one axis further along.

    `vmap` of the loop's slices would batch them into gathers and scatters,
    several small ops per step; this rule keeps them plain slices of the
    batched arrays, in whatever layout the batched coefficients come.
    """

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
    """Every state of the recurrence, one step after another.

    Its gradient is the same kind of loop run backwards (`_backward_loop`):
    neither pass stores more than the inputs and the states, and neither
    materialises an `a` that is the same at every step.
    """
    return _batched(_forward_loop, 0, pairs)(steps)


def _sequential_forward(steps, pairs):
    states = _sequential(steps, pairs)
    return states, (steps, states)


def _sequential_backward(pairs, residuals, cotangent):
    steps, states = residuals
    a, _, keep, h0, h_reset = steps
    d_states = _batched(_backward_loop, 0, pairs)(steps, cotangent)
    # What each step multiplied by `a`: the state before it, or where it started.
    d_first = _product(h0, d_states[:1], pairs=pairs, conjugate=True)
    d_rest = _product(
        jnp.where(keep[1:], states[:-1], h_reset),
        d_states[1:],
        pairs=pairs,
        conjugate=True,
    )
    d_h0 = _product(a[:1], d_states[:1], pairs=pairs, conjugate=True)
    if a.shape[0] == 1:
        # A shared `a` factors out of both sums, which spares a full-length
        # product and concatenation (the LRU's update, ~6% faster on a CPU).
        d_a = d_first + jnp.sum(d_rest, 0, keepdims=True)
        restarts = jnp.sum(jnp.where(keep[1:], 0.0, d_states[1:]), 0, keepdims=True)
        d_reset = _product(a, restarts, pairs=pairs, conjugate=True)
    else:
        d_a = jnp.concatenate([d_first, d_rest])
        d_start = _product(a[1:], d_states[1:], pairs=pairs, conjugate=True)
        d_reset = jnp.sum(jnp.where(keep[1:], 0.0, d_start), 0, keepdims=True)
    return (_Steps(d_a, d_states, None, d_h0, d_reset),)


_sequential.defvjp(_sequential_forward, _sequential_backward)


def _as_pairs(x: Inexact[Array, "..."], n_time: int) -> Float[Array, "..."]:
    """A complex array as float32 `[*time, 2, size]`: its parts, flattened."""
    x = x.reshape(*x.shape[:n_time], 1, -1)
    return jnp.concatenate([jnp.real(x), jnp.imag(x)], -2).astype(jnp.float32)


def _check_recurrence(a, b, h0, done, h_reset, pairs: bool) -> None:
    """Raise a `ValueError` naming the argument of `linear_recurrence` whose
    shape or dtype does not fit `b`'s `[T, *state]` (at trace time: the
    sequential path would otherwise clamp a short `a` or `done` silently)."""
    b_shape = jnp.shape(b)
    layout = "[T, *state] with *state = [..., 2, n]" if pairs else "[T, *state]"

    def fail(problem: str) -> None:
        raise ValueError(
            f"linear_recurrence: {problem}. Expected b: {layout}; a: the same, or "
            "[1, *state] for the same coefficients at every step; h0 and h_reset: "
            "[*state]; done: bool [T]."
        )

    if len(b_shape) < 1 + (2 if pairs else 0):
        fail(f"b has shape {b_shape}")
    n_steps, state = b_shape[0], b_shape[1:]
    if pairs and state[-2] != 2:
        fail(f"b's second-last axis must hold 2 parts (pairs=True); b: {b_shape}")
    for name, x in (("a", a), ("b", b), ("h0", h0), ("h_reset", h_reset)):
        if not jnp.issubdtype(jnp.result_type(x), jnp.inexact):
            fail(f"{name} has dtype {jnp.result_type(x)}, not a float or complex one")
    if jnp.shape(a) not in ((n_steps, *state), (1, *state)):
        fail(f"a has shape {jnp.shape(a)} and b {b_shape}")
    for name, x in (("h0", h0), ("h_reset", h_reset)):
        if jnp.shape(x) != state:
            fail(f"{name} has shape {jnp.shape(x)} and b {b_shape}")
    if jnp.shape(done) != (n_steps,) or jnp.result_type(done) != jnp.bool_:
        dtype = jnp.result_type(done)
        fail(f"done has shape {jnp.shape(done)} and dtype {dtype}, b {b_shape}")


def linear_recurrence(
    a: Inexact[Array, " #time *state"],
    b: Inexact[Array, " time *state"],
    h0: Inexact[Array, "*state"],
    done: Bool[Array, " time"],
    h_reset: Inexact[Array, "*state"],
    *,
    parallel: bool = True,
    pairs: bool = False,
) -> tuple[Inexact[Array, " time *state"], Inexact[Array, "*state"]]:
    """All states of `h_t = a_t * h_{t-1} + b_t` from `h0`, resetting on `done`.

    As in a module's `replay`, `done[t]` replaces the state after
    step `t` by `h_reset` before step `t + 1`. Returns the state after every
    step (before its reset: what step `t` outputs) and the carry after the
    last step (reset if that step was done).

    Real float32 or complex64; or, with `pairs=True`, complex vectors as
    float32 arrays whose second-last axis (size 2) holds their real and
    imaginary parts, `[..., 2, n]`: the LRU's layout, which spares the
    conversions to and from complex64. `a` may have a time axis of length 1:
    the same coefficients at every step, never broadcast over the sequence.

    `parallel=True` composes the steps by one associative scan: a step that
    starts from a known state (`h0` at `t = 0`, `h_reset` after a done) folds
    it into its offset, `b_t <- a_t * start + b_t`, and forgets everything
    before it, `a_t <- 0`, and the offsets the scan accumulates are the
    states themselves. `parallel=False` runs the steps one after another, in
    place; its gradient is a hand-written VJP, the same loop run backwards,
    so this path supports reverse-mode differentiation (`grad`, `vjp`) but
    not `jvp`.
    """
    _check_recurrence(a, b, h0, done, h_reset, pairs)
    if not pairs and any(jnp.iscomplexobj(x) for x in (a, b, h0, h_reset)):
        states, last = linear_recurrence(
            _as_pairs(a, 1),
            _as_pairs(b, 1),
            _as_pairs(h0, 0),
            done,
            _as_pairs(h_reset, 0),
            parallel=parallel,
            pairs=True,
        )
        return (
            jax.lax.complex(states[:, 0], states[:, 1]).reshape(b.shape),
            jax.lax.complex(last[0], last[1]).reshape(h0.shape),
        )
    n_steps = done.shape[0]
    per_step = (n_steps,) + (1,) * (b.ndim - 1)
    first = (jnp.arange(n_steps) == 0).reshape(per_step)
    restart = first | jnp.roll(done, 1).reshape(per_step)
    if parallel:
        a = jnp.broadcast_to(a, b.shape)
        start = jnp.where(first, h0, h_reset)
        b = jnp.where(restart, _product(a, start, pairs=pairs, conjugate=False) + b, b)
        a = jnp.where(restart, jnp.zeros_like(a), a)
        _, states = jax.lax.associative_scan(
            functools.partial(_compose, pairs=pairs), (a, b)
        )
    else:
        states = _sequential(_Steps(a, b, ~restart, h0[None], h_reset[None]), pairs)
    return states, jnp.where(done[-1], h_reset, states[-1])


def _parallel(parallel_replay: bool | None) -> bool:
    """Whether to replay with the associative scan (`None`: off CPUs)."""
    if parallel_replay is None:
        return jax.default_backend() != "cpu"
    return parallel_replay


def _log_of_draw(value: Float[Array, "..."]) -> Float[Array, "..."]:
    # A uniform draw is exactly 0 with probability 2^-23; flooring it keeps the
    # log-parameter finite (an eigenvalue 0, or a real one) instead of -inf.
    return jnp.log(jnp.maximum(value, jnp.finfo(jnp.float32).tiny))


def _normal(
    key: PRNGKeyArray, shape: tuple[int, ...], std: float
) -> Float[Array, "..."]:
    return std * jax.random.normal(key, shape, jnp.float32)


def _check_radius(name: str, value: Any) -> None:
    if not 0.0 <= value < 1.0:
        raise ValueError(
            f"LRU({name}={value!r}) must lie in [0, 1): eigenvalue moduli of 1 or "
            "more make the recurrence unstable."
        )


class _AbstractLinearRecurrence(_AbstractRecurrentCell):
    """What LRU and MinGRU share: one step and one replay of their update.

    A layer gives the update's coefficients `(a, b)` of one or all steps, in
    the layout of its packed state (`pairs`: a complex state as its real and
    imaginary parts, `[2, hidden_size]`), and what it outputs from the new
    state.
    """

    parallel_replay: eqx.AbstractVar[bool | None]
    pairs: eqx.AbstractClassVar[bool]

    @abc.abstractmethod
    def _coefficients(
        self, xs: Float[Array, "*time in_size"]
    ) -> tuple[Float[Array, "..."], Float[Array, "..."]]:
        """`a` and `b` of the update `h' = a h + b`, for one step or all of them."""

    @abc.abstractmethod
    def _output(
        self, h: Float[Array, "..."], xs: Float[Array, "*time in_size"]
    ) -> Array:
        """The layer's output, from the packed new state and the input."""

    @abc.abstractmethod
    def _pack(self, state: Any) -> Float[Array, "..."]:
        """The carry as one array, in the coefficients' layout."""

    @abc.abstractmethod
    def _unpack(self, h: Float[Array, "..."]) -> Any:
        """The carry of a packed state."""

    def step(self, state: Any, x: Float[Array, " in_size"]) -> tuple[Any, Array]:
        """One step for one env: the next carry, and the output."""
        a, b = self._coefficients(x)
        h = _product(a, self._pack(state), pairs=self.pairs, conjugate=False) + b
        return self._unpack(h), self._output(h, x)

    def replay(
        self,
        state0: Any,
        xs: Float[Array, "time env in_size"],
        extras: Any,
        keys: Key[Array, "time env"] | None,
        done: Bool[Array, "time env"],
    ) -> SequenceOutput:
        """The coefficients of all `T x M` steps at once, composed per env as
        `linear_recurrence` does.

        Resets go to `initial_state()`, which is these layers' `reset_state`,
        so the replay resets as the rollout does. It equals the scan of
        `__call__` to float32 rounding, not bit for bit: the matmuls run on
        `[T x M, in]` instead of one step's `[in]`.
        """
        del extras, keys
        self._check_step(jax.tree.map(lambda s: s[0], state0), xs[0, 0])
        n_steps, n_envs = done.shape
        steps = xs.reshape(n_steps * n_envs, -1)
        a, b = (_by_env(c, n_envs) for c in self._coefficients(steps))
        reset = self._pack(self.initial_state())
        states, last = jax.vmap(
            lambda a, b, h0, env_done: linear_recurrence(
                a,
                b,
                h0,
                env_done,
                reset,
                parallel=_parallel(self.parallel_replay),
                pairs=self.pairs,
            ),
            in_axes=(1, 1, 0, 1),
            out_axes=(1, 0),
        )(a, b, jax.vmap(self._pack)(state0), done)
        output = self._output(
            states.reshape(n_steps * n_envs, *states.shape[2:]), steps
        )
        return SequenceOutput(
            jax.vmap(self._unpack)(last),
            output.reshape(n_steps, n_envs, *output.shape[1:]),
            jnp.zeros(done.shape, jnp.float32),
        )


def _by_env(
    coefficient: Float[Array, "steps ..."], n_envs: int
) -> Float[Array, "time env ..."]:
    """A coefficient of `T x M` merged steps as `[T, M, ...]`; one of a single
    step, which stands for all of them, as `[1, M, ...]`."""
    if coefficient.shape[0] == 1:
        return jnp.broadcast_to(coefficient, (1, n_envs, *coefficient.shape[1:]))
    return coefficient.reshape(-1, n_envs, *coefficient.shape[1:])


class LRU(_AbstractLinearRecurrence):
    """The Linear Recurrent Unit of Orvieto et al. (2023), for one env.

    A complex diagonal recurrence read out by a real linear map:

    ```
    lambda = exp(-exp(nu_log) + i exp(theta_log))     gamma = exp(gamma_log)
    h' = lambda * h + gamma * (x B)                   B = B_re + i B_im
    y  = Re(h' C) + D x                               C = C_re + i C_im
    ```

    Every parameter is a real float32 array (`B` and `C` as their real and
    imaginary parts; kernels stored `[in, out]` as in `Dense`), and so is the
    carry: **the complex state is the tuple `(re, im)`** of two
    `[hidden_size]` arrays, so checkpoints, `trainable` and `vmap` see only
    real arrays. The output is the real `y`, which is also what a `Recorder`
    around the layer records.

    The initialisation follows the paper: `lambda` uniform on the ring
    `r_min <= |lambda| <= r_max` with phase in `[0, max_phase]`,
    `gamma_log = log(sqrt(1 - |lambda|^2))` (so white unit-variance inputs give a
    unit-variance state however long the memory), `B ~ N(0, 1 / (2 in))`
    per part, `C ~ N(0, 1 / hidden)` per part, `D ~ N(0, 1)`. The layer is
    the paper's recurrence alone: its block's GELU/GLU, normalisation and
    residual connection compose outside it, e.g. with `Dense` in a
    `Sequential`.
    """

    nu_log: Float[Array, " hidden_size"]
    theta_log: Float[Array, " hidden_size"]
    gamma_log: Float[Array, " hidden_size"]
    B_re: Float[Array, "in_size hidden_size"]
    B_im: Float[Array, "in_size hidden_size"]
    C_re: Float[Array, "hidden_size out_size"]
    C_im: Float[Array, "hidden_size out_size"]
    D: Float[Array, " in_size"] | Float[Array, "in_size out_size"]
    initial_re: Float[Array, " hidden_size"] | None
    initial_im: Float[Array, " hidden_size"] | None
    in_size: int = eqx.field(static=True)
    hidden_size: int = eqx.field(static=True)
    out_size: int = eqx.field(static=True)
    parallel_replay: bool | None = eqx.field(static=True)
    carry_parts: ClassVar[tuple[str, ...]] = ("re", "im")
    pairs: ClassVar[bool] = True

    def __init__(
        self,
        in_size: int,
        hidden_size: int,
        *,
        key: PRNGKeyArray,
        out_size: int | None = None,
        r_min: float = 0.0,
        r_max: float = 0.999,
        max_phase: float = 2 * math.pi,
        trainable_initial_state: bool = False,
        parallel_replay: bool | None = None,
    ):
        """**Arguments:**

        - `in_size`: input features.
        - `hidden_size`: size of the complex state (the paper's `N`); the
            carry holds `2 * hidden_size` reals.
        - `key`: PRNG key for the initialisers.
        - `out_size`: output features; default `in_size`, as in the paper,
            where the layer maps the model width to itself. Then `D` is the
            paper's elementwise skip `D * x`; otherwise it is a real
            `[in_size, out_size]` matrix (LeCun normal) and the skip is `x D`.
        - `r_min`, `r_max`: the ring of initial eigenvalue moduli,
            `0 <= r_min <= r_max < 1`. The default `[0, 0.999]` spreads the
            memory from one step to about a thousand: the paper's appendix
            uses `[0, 1)`, whose moduli near 1 leave no float32 room for
            `gamma = sqrt(1 - |lambda|^2)`, and `0.999` is the cap of its
            long-sequence runs (`[0.9, 0.999]`).
        - `max_phase`: initial phases are uniform in `[0, max_phase]`,
            `max_phase > 0`; the paper's default `2 pi` (smaller values bias
            the state towards slow oscillations).
        - `trainable_initial_state`: learn the initial state `(re, im)`
            (initialised to zeros) instead of starting every episode from
            zeros.
        - `parallel_replay`: compose the replay's steps with the associative
            scan (`True`), sequentially (`False`), or the faster of the two
            for the backend (`None`: associative on GPUs and TPUs, sequential
            on CPUs; see the module docstring). Either way the input and
            output projections run once over the whole sequence.
        """
        check_key("LRU", key)
        check_size("LRU(in_size=...)", in_size)
        check_size("LRU(hidden_size=...)", hidden_size)
        out_size = in_size if out_size is None else out_size
        check_size("LRU(out_size=...)", out_size)
        _check_radius("r_min", r_min)
        _check_radius("r_max", r_max)
        if r_min > r_max:
            raise ValueError(
                f"LRU(r_min={r_min!r}, r_max={r_max!r}): r_min must not exceed "
                "r_max; they bound the ring of initial eigenvalue moduli."
            )
        if not max_phase > 0:
            raise ValueError(
                f"LRU(max_phase={max_phase!r}) must be > 0: initial phases are "
                "drawn in [0, max_phase]."
            )
        radius_key, phase_key, b_re_key, b_im_key, c_re_key, c_im_key, d_key = (
            jax.random.split(key, 7)
        )
        # Uniform on the ring's area: |lambda|^2 uniform in [r_min^2, r_max^2].
        modulus_sq = jax.random.uniform(
            radius_key, (hidden_size,), jnp.float32, r_min**2, r_max**2
        )
        self.nu_log = jnp.log(-0.5 * _log_of_draw(modulus_sq))
        self.theta_log = _log_of_draw(
            jax.random.uniform(phase_key, (hidden_size,), jnp.float32, 0.0, max_phase)
        )
        self.gamma_log = 0.5 * jnp.log1p(-jnp.exp(-2.0 * jnp.exp(self.nu_log)))
        b_std = 1.0 / math.sqrt(2 * in_size)
        c_std = 1.0 / math.sqrt(hidden_size)
        self.B_re = _normal(b_re_key, (in_size, hidden_size), b_std)
        self.B_im = _normal(b_im_key, (in_size, hidden_size), b_std)
        self.C_re = _normal(c_re_key, (hidden_size, out_size), c_std)
        self.C_im = _normal(c_im_key, (hidden_size, out_size), c_std)
        if out_size == in_size:
            self.D = _normal(d_key, (in_size,), 1.0)
        else:
            self.D = jax.nn.initializers.lecun_normal()(
                d_key, (in_size, out_size), jnp.float32
            )
        self.initial_re = _initial_parameter(trainable_initial_state, hidden_size)
        self.initial_im = _initial_parameter(trainable_initial_state, hidden_size)
        self.in_size = in_size
        self.hidden_size = hidden_size
        self.out_size = out_size
        self.parallel_replay = parallel_replay

    def _coefficients(
        self, xs: Float[Array, "*time in_size"]
    ) -> tuple[
        Float[Array, "*#time 2 hidden_size"], Float[Array, "*time 2 hidden_size"]
    ]:
        """`lambda` and the input term `gamma * (x B)`, each as `[re; im]`."""
        modulus = jnp.exp(-jnp.exp(self.nu_log))
        phase = jnp.exp(self.theta_log)
        lam = jnp.stack([modulus * jnp.cos(phase), modulus * jnp.sin(phase)])
        # One matmul for both parts, `gamma` folded into the weights (cheaper
        # than scaling, and differentiating, the whole `[T, 2, hidden]` drive).
        b = jnp.concatenate([self.B_re, self.B_im], 1) * jnp.tile(
            jnp.exp(self.gamma_log), 2
        )
        drive = (xs @ b).reshape(*xs.shape[:-1], 2, self.hidden_size)
        # The same at every step: one time step of it stands for all of them.
        return lam.reshape((1,) * (xs.ndim - 1) + lam.shape), drive

    def _output(
        self, h: Float[Array, "*time 2 hidden_size"], xs: Float[Array, "*time in_size"]
    ) -> Float[Array, "*time out_size"]:
        """`y = Re(h C) + D x`, with `Re(h C) = [Re h | Im h] [C_re; -C_im]`."""
        skip = xs * self.D if self.D.ndim == 1 else xs @ self.D
        c = jnp.concatenate([self.C_re, -self.C_im], 0)
        return h.reshape(*h.shape[:-2], -1) @ c + skip

    def _pack(self, state: LRUState) -> Float[Array, "2 hidden_size"]:
        return jnp.stack(state)

    def _unpack(self, h: Float[Array, "2 hidden_size"]) -> LRUState:
        return h[0], h[1]


class MinGRU(_AbstractLinearRecurrence):
    """The minimal GRU of Feng et al. (2024), for one env; carry and output are `h`.

    The gate and the candidate see only the input, so the update is linear
    in `h` and replays in parallel. With the two blocks stacked in the order
    `z, h` along the last axis of `kernel` and `bias`:

    ```
    z  = sigmoid(x W_z + b_z)        h~ = x W_h + b_h
    h' = (1 - z) * h + z * h~
    ```

    This is the paper's plain minGRU: the candidate is linear, not passed
    through the positive `g` of its log-space variant, which exists only to
    scan in log space; here the scan works on `h` directly. Defaults:
    LeCun-normal kernels (one per block), zero biases. With
    `trainable_initial_state=True`, `initial_state()` returns the learned
    `initial_h`.
    """

    kernel: Float[Array, "in_size gates"]
    bias: Float[Array, " gates"]
    initial_h: Float[Array, " hidden_size"] | None
    in_size: int = eqx.field(static=True)
    hidden_size: int = eqx.field(static=True)
    parallel_replay: bool | None = eqx.field(static=True)
    carry_parts: ClassVar[tuple[str, ...]] = ("h",)
    pairs: ClassVar[bool] = False

    def __init__(
        self,
        in_size: int,
        hidden_size: int,
        *,
        key: PRNGKeyArray,
        trainable_initial_state: bool = False,
        kernel_init: Initializer | None = None,
        bias_init: Initializer | None = None,
        parallel_replay: bool | None = None,
    ):
        """**Arguments:**

        - `in_size`: input features.
        - `hidden_size`: size of `h`, and of the output.
        - `key`: PRNG key for the initialisers.
        - `trainable_initial_state`: learn `h0` (initialised to zeros)
            instead of starting every episode from zeros.
        - `kernel_init`: initialiser of each block's `[in_size, hidden_size]`
            kernel; default LeCun normal.
        - `bias_init`: initialiser of each block's bias; default zeros.
        - `parallel_replay`: as in [`eqx_ppo.nn.LRU`][].
        """
        check_key("MinGRU", key)
        kernel_key, bias_key = jax.random.split(key)
        self.kernel, self.bias = _init_input_weights(
            "MinGRU",
            in_size,
            hidden_size,
            2,
            (kernel_key, bias_key),
            kernel_init,
            bias_init,
        )
        self.initial_h = _initial_parameter(trainable_initial_state, hidden_size)
        self.in_size = in_size
        self.hidden_size = hidden_size
        self.parallel_replay = parallel_replay

    def _coefficients(
        self, xs: Float[Array, "*time in_size"]
    ) -> tuple[Float[Array, "*time hidden_size"], Float[Array, "*time hidden_size"]]:
        """`1 - z` and `z * h~`: the update is `h' = (1 - z) * h + z * h~`."""
        # Two matmuls on the kernel's blocks rather than one split afterwards:
        # the split's gradient concatenates two `[T, hidden]` halves, the
        # blocks' only two small `[in, hidden]` ones (13% of a replay's time).
        h = self.hidden_size
        z = jax.nn.sigmoid(xs @ self.kernel[:, :h] + self.bias[:h])
        candidate = xs @ self.kernel[:, h:] + self.bias[h:]
        return 1.0 - z, z * candidate

    def _output(
        self, h: Float[Array, "*time hidden_size"], xs: Float[Array, "*time in_size"]
    ) -> Float[Array, "*time hidden_size"]:
        return h

    def _pack(
        self, state: Float[Array, " hidden_size"]
    ) -> Float[Array, " hidden_size"]:
        return state

    def _unpack(self, h: Float[Array, " hidden_size"]) -> Float[Array, " hidden_size"]:
        return h
