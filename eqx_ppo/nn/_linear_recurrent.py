"""Linear recurrences with a parallel replay: LRU (carry `(re, im)`), MinGRU (`h`).

Both layers update their carry as `h_t = a_t * h_{t-1} + b_t` with `a_t`, `b_t`
computed from the input `x_t` alone. A step is one such update. The loss
replay computes the coefficients of all `T` steps at once, as one matmul over
the whole sequence, and then composes them (`linear_recurrence`), episode
resets included, in one of two orders:

- with `jax.lax.associative_scan`, in `O(log T)` depth instead of a
  length-`T` loop;
- with a sequential `lax.scan` whose body is only the elementwise update.

Depth only pays where there is parallel width to spend it on. On a CPU the
associative scan's extra passes over the sequence cost more than the
sequential loop saves (`python -m benchmarks.memory`), so by default
(`parallel_replay=None`) the layers compose with the associative scan on
GPUs and TPUs and sequentially on CPUs; `True` or `False` forces one.
"""

import abc
import math
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Complex, Float, Inexact, Key, PRNGKeyArray

from ._dense import Initializer, check_size
from ._module import SequenceOutput
from ._recurrent import (
    _AbstractRecurrentCell,
    _init_input_weights,
    _initial_parameter,
    _learned_or_zeros,
)

LRUState = tuple[Float[Array, " hidden"], Float[Array, " hidden"]]
"""An LRU carry `(re, im)`: the real and imaginary parts of the complex state."""


def _compose(
    earlier: tuple[Inexact[Array, "..."], Inexact[Array, "..."]],
    later: tuple[Inexact[Array, "..."], Inexact[Array, "..."]],
) -> tuple[Inexact[Array, "..."], Inexact[Array, "..."]]:
    """The affine map `h -> a h + b` of `earlier` followed by that of `later`."""
    a1, b1 = earlier
    a2, b2 = later
    return a2 * a1, a2 * b1 + b2


def linear_recurrence(
    a: Inexact[Array, " time *state"],
    b: Inexact[Array, " time *state"],
    h0: Inexact[Array, "*state"],
    done: Bool[Array, " time"],
    h_reset: Inexact[Array, "*state"],
    *,
    parallel: bool = True,
) -> tuple[Inexact[Array, " time *state"], Inexact[Array, "*state"]]:
    """All states of `h_t = a_t * h_{t-1} + b_t` from `h0`, resetting on `done`.

    As in [`eqx_ppo.nn.scan_sequence`][], `done[t]` replaces the state after
    step `t` by `h_reset` before step `t + 1`. Returns the state after every
    step (before its reset: what step `t` outputs) and the carry after the
    last step (reset if that step was done).

    A step that starts from a known state (`h0` at `t = 0`, `h_reset` after a
    done) folds it into its offset, `b_t <- a_t * start + b_t`, and forgets
    everything before it, `a_t <- 0`. Then the steps are composed, by one
    associative scan (`parallel=True`; the offsets it accumulates are the
    states themselves) or by a sequential scan from zeros (`parallel=False`).
    """
    n_steps = done.shape[0]
    per_step = (n_steps,) + (1,) * (a.ndim - 1)
    first = (jnp.arange(n_steps) == 0).reshape(per_step)
    restart = first | jnp.roll(done, 1).reshape(per_step)
    start = jnp.where(first, h0, h_reset)
    b = jnp.where(restart, a * start + b, b)
    a = jnp.where(restart, jnp.zeros_like(a), a)
    if parallel:
        _, states = jax.lax.associative_scan(_compose, (a, b))
    else:

        def step(h, coefficients):
            a_t, b_t = coefficients
            h = a_t * h + b_t
            return h, h

        _, states = jax.lax.scan(step, jnp.zeros_like(b[0]), (a, b))
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
    """What LRU and MinGRU share: the checked step, and the choice of replay."""

    parallel_replay: eqx.AbstractVar[bool | None]

    def replay_sequence(
        self,
        state0: Any,
        xs: Float[Array, "time in_size"],
        extras: Any,
        keys: Key[Array, " time"] | None,
        done: Bool[Array, " time"],
    ) -> SequenceOutput:
        """All `T` steps' coefficients at once, composed by `linear_recurrence`.

        Resets go to `initial_state()`, which is these layers' `reset_state`,
        so the replay resets as the rollout and `scan_sequence` do. It equals
        `scan_sequence` to float32 rounding, not bit for bit: the matmuls run
        on `[T, in]` instead of one step's `[in]`.
        """
        self._check_step(state0, xs[0])
        return self._replay(state0, xs, done, _parallel(self.parallel_replay))

    @abc.abstractmethod
    def _replay(
        self,
        state0: Any,
        xs: Float[Array, "time in_size"],
        done: Bool[Array, " time"],
        parallel: bool,
    ) -> SequenceOutput:
        """The replay by `linear_recurrence`, of checked inputs."""


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

    def initial_state(self) -> LRUState:
        """`(re, im)` of the initial state: the learned parameters, or zeros."""
        return (
            _learned_or_zeros(self.initial_re, self.hidden_size),
            _learned_or_zeros(self.initial_im, self.hidden_size),
        )

    def _coefficients(
        self, xs: Float[Array, "*time in_size"]
    ) -> tuple[Complex[Array, " hidden_size"], Complex[Array, "*time hidden_size"]]:
        """`lambda` and the input term `gamma * (x B)` of the update."""
        modulus = jnp.exp(-jnp.exp(self.nu_log))
        phase = jnp.exp(self.theta_log)
        lam = jax.lax.complex(modulus * jnp.cos(phase), modulus * jnp.sin(phase))
        gamma = jnp.exp(self.gamma_log)
        # One matmul for both parts: `x [B_re | B_im]`.
        re, im = jnp.split(xs @ jnp.concatenate([self.B_re, self.B_im], 1), 2, -1)
        return lam, jax.lax.complex(gamma * re, gamma * im)

    def _readout(
        self, h: Complex[Array, "*time hidden_size"], xs: Float[Array, "*time in_size"]
    ) -> Float[Array, "*time out_size"]:
        """`y = Re(h C) + D x`, with `Re(h C) = [Re h | Im h] [C_re; -C_im]`."""
        skip = xs * self.D if self.D.ndim == 1 else xs @ self.D
        parts = jnp.concatenate([jnp.real(h), jnp.imag(h)], -1)
        return parts @ jnp.concatenate([self.C_re, -self.C_im], 0) + skip

    def step(
        self, state: LRUState, x: Float[Array, " in_size"]
    ) -> tuple[LRUState, Float[Array, " out_size"]]:
        """One step for one env; returns `(re', im')` as carry and `y` as output."""
        lam, drive = self._coefficients(x)
        h = lam * jax.lax.complex(*state) + drive
        return (jnp.real(h), jnp.imag(h)), self._readout(h, x)

    def _replay(
        self,
        state0: LRUState,
        xs: Float[Array, "time in_size"],
        done: Bool[Array, " time"],
        parallel: bool,
    ) -> SequenceOutput:
        lam, drive = self._coefficients(xs)
        reset = jax.lax.complex(*self.initial_state())
        h, last = linear_recurrence(
            jnp.broadcast_to(lam, drive.shape),
            drive,
            jax.lax.complex(*state0),
            done,
            reset,
            parallel=parallel,
        )
        return SequenceOutput(
            (jnp.real(last), jnp.imag(last)),
            self._readout(h, xs),
            jnp.zeros(done.shape, jnp.float32),
        )


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

    def initial_state(self) -> Float[Array, " hidden_size"]:
        """`h0`: the learned parameter, or zeros."""
        return _learned_or_zeros(self.initial_h, self.hidden_size)

    def _coefficients(
        self, xs: Float[Array, "*time in_size"]
    ) -> tuple[Float[Array, "*time hidden_size"], Float[Array, "*time hidden_size"]]:
        """`1 - z` and `z * h~`: the update is `h' = (1 - z) * h + z * h~`."""
        z, candidate = jnp.split(xs @ self.kernel + self.bias, 2, axis=-1)
        z = jax.nn.sigmoid(z)
        return 1.0 - z, z * candidate

    def step(
        self, state: Float[Array, " hidden_size"], x: Float[Array, " in_size"]
    ) -> tuple[Float[Array, " hidden_size"], Float[Array, " hidden_size"]]:
        """One step for one env; returns `h'` as both carry and output."""
        keep, write = self._coefficients(x)
        h = keep * state + write
        return h, h

    def _replay(
        self,
        state0: Float[Array, " hidden_size"],
        xs: Float[Array, "time in_size"],
        done: Bool[Array, " time"],
        parallel: bool,
    ) -> SequenceOutput:
        keep, write = self._coefficients(xs)
        h, last = linear_recurrence(
            keep, write, state0, done, self.initial_state(), parallel=parallel
        )
        return SequenceOutput(last, h, jnp.zeros(done.shape, jnp.float32))
