"""Linear recurrences `h_t = a_t * h_{t-1} + b_t`, `a_t` and `b_t` from `x_t`
alone, so that the loss replay composes all steps at once: LRU and MinGRU."""

import abc
import math
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Key

from .._typecheck import check_range, checked
from ._dense import Initializer
from ._errors import check_input
from ._module import (
    AbstractStatefulModule,
    SequenceOutput,
    StatefulModuleOutput,
    merges_steps,
    zero_loss,
)
from ._recurrence import linear_recurrence, product, replay_method
from ._recurrent import init_gates, initial_carry, initial_parameter

LRUState = tuple[Float[Array, " hidden"], Float[Array, " hidden"]]
"""An LRU carry `(re, im)`: the real and imaginary parts of the complex state."""


def _log_of_draw(value: Float[Array, "..."]) -> Float[Array, "..."]:
    # A uniform draw is exactly 0 with probability 2^-23; flooring it keeps the
    # log-parameter finite (an eigenvalue 0, or a real one) instead of -inf.
    return jnp.log(jnp.maximum(value, jnp.finfo(jnp.float32).tiny))


def _normal(
    key: Key[Array, ""], shape: tuple[int, ...], std: float
) -> Float[Array, "..."]:
    return std * jax.random.normal(key, shape, jnp.float32)


class _AbstractLinearRecurrence(AbstractStatefulModule):
    """One step and one replay of `h' = a h + b`: a layer gives `(a, b)` of
    one or all steps, in the layout of its packed state (`pairs`: a complex
    state as its real and imaginary parts, `[2, hidden_size]`), and its
    output from the new state."""

    ignores_key = True

    in_size: int = eqx.field(static=True)
    hidden_size: int = eqx.field(static=True)
    parallel_replay: eqx.AbstractVar[bool | None]
    pairs: ClassVar[bool] = False

    @abc.abstractmethod
    def _coefficients(
        self, xs: Float[Array, "*time in_size"]
    ) -> tuple[Float[Array, "..."], Float[Array, "..."]]:
        """`a` and `b` of the update `h' = a h + b`, for one step or all of them."""

    def _output(self, h: Float[Array, "..."], xs: Float[Array, "*time in_size"]):
        """The layer's output, from the packed new state and the input: `h`."""
        return h

    def _pack(self, state: Any) -> Float[Array, "..."]:
        """The carry as one array, in the coefficients' layout: itself."""
        return state

    def _unpack(self, h: Float[Array, "..."]) -> Any:
        """The carry of a packed state: itself."""
        return h

    def __call__(self, state, x, extras=None, *, key=None) -> StatefulModuleOutput:
        del extras, key
        check_input(self, x, (self.in_size,))
        a, b = self._coefficients(x)
        h = product(a, self._pack(state), pairs=self.pairs, conjugate=False) + b
        return StatefulModuleOutput(
            self._unpack(h), self._output(h, x), zero_loss(), {}, None
        )

    def replay(self, state0, xs, extras, keys, done) -> SequenceOutput:
        """The coefficients of all `T x M` steps at once, composed per env by
        `linear_recurrence`, resetting to `initial_state()` (these layers'
        `reset_state`). Equal to the scan of `__call__` to float32 rounding."""
        del extras, keys
        n_steps, n_envs = done.shape
        merged = merges_steps()
        steps = xs.reshape(n_steps * n_envs, -1) if merged else xs
        by_env = lambda c: c.reshape(-1, n_envs, *c.shape[1:]) if merged else c  # noqa: E731
        a, b = self._coefficients(steps)
        # An `a` the same at every step stands for all of them as `[1, M, ...]`.
        a = a[None] if merged and a.shape[0] == 1 else by_env(a)
        states, last = linear_recurrence(
            jnp.broadcast_to(a, (a.shape[0], n_envs, *a.shape[2:])),
            by_env(b),
            jax.vmap(self._pack)(state0),
            done,
            self._pack(self.initial_state()),
            method=replay_method(self.parallel_replay, self.pairs, n_steps),
            pairs=self.pairs,
        )
        h = states.reshape(-1, *states.shape[2:]) if merged else states
        output = by_env(self._output(h, steps))
        return SequenceOutput(
            jax.vmap(self._unpack)(last), output, jnp.zeros(done.shape, jnp.float32)
        )


@checked
class LRU(_AbstractLinearRecurrence):
    """The Linear Recurrent Unit of Orvieto et al. (2023), for one env.

    A complex diagonal recurrence read out by a real linear map:

    ```
    lambda = exp(-exp(nu_log) + i exp(theta_log))     gamma = exp(gamma_log)
    h' = lambda * h + gamma * (x B)                   B = B_re + i B_im
    y  = Re(h' C) + D x                               C = C_re + i C_im
    ```

    Parameters and carry are real float32 arrays: **the complex state is the
    tuple `(re, im)`**; kernels are `[in, out]`. Initialised as in the paper:
    `lambda` uniform on the ring `r_min <= |lambda| <= r_max` with phase in
    `[0, max_phase]`, `gamma_log = log(sqrt(1 - |lambda|^2))`,
    `B ~ N(0, 1 / (2 in))` and `C ~ N(0, 1 / hidden)` per part, `D ~ N(0, 1)`.
    The paper's block around it (GLU, normalisation, residual) composes
    outside, e.g. in a `Sequential`.
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
    out_size: int = eqx.field(static=True)
    parallel_replay: bool | None = eqx.field(static=True)
    pairs: ClassVar[bool] = True

    def __init__(
        self,
        in_size: int,
        hidden_size: int,
        *,
        key: Key[Array, ""],
        out_size: int | None = None,
        r_min: float = 0.0,
        r_max: float = 0.999,
        max_phase: float = 2 * math.pi,
        trainable_initial_state: bool = False,
        parallel_replay: bool | None = None,
    ):
        """**Arguments:**

        - `in_size`: input features.
        - `hidden_size`: number of complex states (the paper's `N`).
        - `key`: PRNG key for the initialisers.
        - `out_size`: output features; default `in_size`, with `D` elementwise.
        - `r_min`, `r_max`: the ring of initial eigenvalue moduli, in `[0, 1)`.
        - `max_phase`: initial phases are uniform in `[0, max_phase]`.
        - `trainable_initial_state`: learn `(re, im)` instead of starting from 0.
        - `parallel_replay`: replay with the associative scan (`True`), a loop
            (`False`), or whichever measured faster on the backend (`None`:
            the loop on CPUs; on TPUs a scan in blocks of steps, but the loop
            for an LRU's sequence of 64 steps or fewer).
        """
        if not 0.0 <= r_min <= r_max < 1.0:
            raise ValueError(
                f"LRU(r_min={r_min!r}, r_max={r_max!r}): the ring of initial "
                "eigenvalue moduli needs 0 <= r_min <= r_max < 1; moduli of 1 or "
                "more make the recurrence unstable."
            )
        fix = "a positive bound; initial phases are drawn in [0, max_phase]."
        check_range("LRU(max_phase=", max_phase, 0, open_low=True, fix=fix)
        out_size = in_size if out_size is None else out_size
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
        self.initial_re = initial_parameter(trainable_initial_state, hidden_size)
        self.initial_im = initial_parameter(trainable_initial_state, hidden_size)
        self.in_size = in_size
        self.hidden_size = hidden_size
        self.out_size = out_size
        self.parallel_replay = parallel_replay

    def initial_state(self) -> LRUState:
        """`(re, im)`: the learned initial state, or zeros."""
        return initial_carry(self.hidden_size, self.initial_re, self.initial_im)

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


@checked
class MinGRU(_AbstractLinearRecurrence):
    """The minimal GRU of Feng et al. (2024), for one env; carry and output are `h`.

    The gate and the candidate see only the input, so the update is linear
    in `h`. With the two blocks stacked `z, h` along the last axis of
    `kernel` and `bias` (LeCun normal and zeros by default):

    ```
    z  = sigmoid(x W_z + b_z)        h~ = x W_h + b_h
    h' = (1 - z) * h + z * h~
    ```

    The paper's plain minGRU, without its log-space variant's positive `g`.
    """

    kernel: Float[Array, "in_size gates"]
    bias: Float[Array, " gates"]
    initial_h: Float[Array, " hidden_size"] | None
    parallel_replay: bool | None = eqx.field(static=True)

    def __init__(
        self,
        in_size: int,
        hidden_size: int,
        *,
        key: Key[Array, ""],
        trainable_initial_state: bool = False,
        kernel_init: Initializer | None = None,
        bias_init: Initializer | None = None,
        parallel_replay: bool | None = None,
    ):
        """**Arguments:** as in [`eqx_ppo.nn.LSTM`][] (`kernel_init` and
        `bias_init` per block) and, for `parallel_replay`,
        [`eqx_ppo.nn.LRU`][].
        """
        kernel_key, bias_key = jax.random.split(key)
        lecun, zeros = jax.nn.initializers.lecun_normal(), jax.nn.initializers.zeros
        self.kernel = init_gates(
            kernel_init, lecun, kernel_key, (in_size, hidden_size), 2
        )
        self.bias = init_gates(bias_init, zeros, bias_key, (hidden_size,), 2)
        self.initial_h = initial_parameter(trainable_initial_state, hidden_size)
        self.in_size = in_size
        self.hidden_size = hidden_size
        self.parallel_replay = parallel_replay

    def initial_state(self) -> Float[Array, " hidden_size"]:
        """`h0`: the learned initial state, or zeros."""
        return initial_carry(self.hidden_size, self.initial_h)

    def _coefficients(
        self, xs: Float[Array, "*time in_size"]
    ) -> tuple[Float[Array, "*time hidden_size"], Float[Array, "*time hidden_size"]]:
        """`1 - z` and `z * h~`."""
        # Two matmuls on the kernel's blocks, not one split afterwards: the
        # split's gradient concatenates two `[T, hidden]` halves.
        h = self.hidden_size
        z = jax.nn.sigmoid(xs @ self.kernel[:, :h] + self.bias[:h])
        candidate = xs @ self.kernel[:, h:] + self.bias[h:]
        return 1.0 - z, z * candidate
