"""Recurrent layers: LSTM (carry `(h, c)`) and GRU (carry `h`)."""

import abc
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Key

from .._typecheck import checked
from ._dense import Activation, Initializer, get_activation, orthogonal
from ._errors import check_input
from ._module import AbstractStatefulModule, StatefulModuleOutput, zero_loss

Inits = tuple[Initializer | None, ...]
"""The initialisers of `kernel`, `recurrent_kernel` and `bias`; `None`: the default."""


def init_gates(
    init: Initializer | None,
    default: Initializer,
    key: Key[Array, ""],
    shape: tuple[int, ...],
    n_gates: int,
) -> Float[Array, "..."]:
    """`n_gates` blocks of `shape`, each initialised on its own by `init` (or
    `default`) as in flax, concatenated on the last axis for one fused matmul."""
    init = default if init is None else init
    keys = jax.random.split(key, n_gates)
    return jnp.concatenate([init(k, shape, jnp.float32) for k in keys], axis=-1)


def initial_parameter(
    trainable: bool, hidden_size: int
) -> Float[Array, " hidden_size"] | None:
    """A learned initial carry part (zeros until trained), or `None` for none."""
    return jnp.zeros(hidden_size, jnp.float32) if trainable else None


def initial_carry(hidden_size: int, *parts: Float[Array, " hidden_size"] | None) -> Any:
    """A carry at an episode start from its parts' learned values (`None`:
    zeros): the part itself if there is one, else their tuple."""
    carry = tuple(
        jnp.zeros(hidden_size, jnp.float32) if p is None else p for p in parts
    )
    return carry if len(carry) > 1 else carry[0]


class _AbstractGated(AbstractStatefulModule):
    """LSTM and GRU: gates stacked along the last axis of `kernel`,
    `recurrent_kernel` and `bias`, the functions squashing them, and the
    `__init__` they share (each documents its arguments)."""

    ignores_key = True

    kernel: Float[Array, "in_size gates"]
    recurrent_kernel: Float[Array, "hidden_size gates"]
    bias: Float[Array, " gates"]
    gate_fn: Callable[[Array], Array] = eqx.field(static=True)
    activation_fn: Callable[[Array], Array] = eqx.field(static=True)
    in_size: int = eqx.field(static=True)
    hidden_size: int = eqx.field(static=True)

    @abc.abstractmethod
    def _init_arrays(self, key: Key[Array, ""], inits: Inits, trainable: bool):
        """Set the arrays from `key`: the stacked gates' (`_init_gates`), the
        cell's own and, if `trainable`, the learned initial carry."""

    def __init__(
        self,
        in_size: int,
        hidden_size: int,
        *,
        key: Key[Array, ""],
        trainable_initial_state: bool = False,
        gate_fn: Activation = jax.nn.sigmoid,
        activation_fn: Activation = jnp.tanh,
        kernel_init: Initializer | None = None,
        recurrent_init: Initializer | None = None,
        bias_init: Initializer | None = None,
    ):
        self.gate_fn = get_activation(gate_fn)
        self.activation_fn = get_activation(activation_fn)
        self.in_size = in_size
        self.hidden_size = hidden_size
        inits = (kernel_init, recurrent_init, bias_init)
        self._init_arrays(key, inits, trainable_initial_state)

    def _init_gates(self, n_gates: int, keys: Key[Array, " 3"], inits: Inits):
        """Set `kernel`, `recurrent_kernel` and `bias`, of `n_gates` blocks each,
        from their keys and initialisers: LeCun normal, orthogonal and zeros by
        default."""
        lecun, zeros = jax.nn.initializers.lecun_normal(), jax.nn.initializers.zeros
        h = self.hidden_size
        shapes = ((self.in_size, h), (h, h), (h,))
        self.kernel, self.recurrent_kernel, self.bias = (
            init_gates(init, default, key, shape, n_gates)
            for init, default, key, shape in zip(
                inits, (lecun, orthogonal(), zeros), keys, shapes, strict=True
            )
        )


@checked
class LSTM(_AbstractGated):
    """A long short-term memory layer for one env: carry `(h, c)`, output `h`.

    With the gates stacked `i, f, g, o` along the last axis of `kernel`,
    `recurrent_kernel` and `bias`:

    ```
    i = gate_fn(x W_i + h U_i + b_i)        f = gate_fn(x W_f + h U_f + b_f)
    g = activation_fn(x W_g + h U_g + b_g)  o = gate_fn(x W_o + h U_o + b_o)
    c' = f * c + i * g                      h' = o * activation_fn(c')
    ```

    As flax's `LSTMCell`: LeCun-normal input kernels, orthogonal recurrent
    kernels (one per gate), zero biases (the forget gate's too).

    **Arguments:**

    - `in_size`: input features.
    - `hidden_size`: size of `h` and `c`, and of the output.
    - `key`: PRNG key for the initialisers.
    - `trainable_initial_state`: learn `(h0, c0)` instead of starting from 0.
    - `gate_fn`: squashing of the `i`, `f`, `o` gates (callable or name).
    - `activation_fn`: activation of `g` and of `c'` in `h'` (callable or name).
    - `kernel_init`: initialiser of each gate's input kernel.
    - `recurrent_init`: initialiser of each gate's recurrent kernel.
    - `bias_init`: initialiser of each gate's bias.
    """

    initial_h: Float[Array, " hidden_size"] | None
    initial_c: Float[Array, " hidden_size"] | None

    def _init_arrays(self, key, inits, trainable):
        self._init_gates(4, jax.random.split(key, 3), inits)
        self.initial_h = initial_parameter(trainable, self.hidden_size)
        self.initial_c = initial_parameter(trainable, self.hidden_size)

    def initial_state(self) -> tuple[Float[Array, " hidden_size"], ...]:
        """`(h0, c0)`: the learned initial state, or zeros."""
        return initial_carry(self.hidden_size, self.initial_h, self.initial_c)

    def __call__(self, state, x, extras=None, *, key=None) -> StatefulModuleOutput:
        del extras, key
        check_input(self, x, (self.in_size,))
        h, c = state
        z = x @ self.kernel + h @ self.recurrent_kernel + self.bias
        i, f, g, o = jnp.split(z, 4)
        c = self.gate_fn(f) * c + self.gate_fn(i) * self.activation_fn(g)
        h = self.gate_fn(o) * self.activation_fn(c)
        return StatefulModuleOutput((h, c), h, zero_loss(), {}, None)


@checked
class GRU(_AbstractGated):
    """A gated recurrent unit layer for one env; the carry and output are `h`.

    As flax's `GRUCell` (and cuDNN), with the gates stacked `r, z, n` along
    the last axis of `kernel`, `recurrent_kernel` and `bias`:

    ```
    r = gate_fn(x W_r + b_r + h U_r)
    z = gate_fn(x W_z + b_z + h U_z)
    n = activation_fn(x W_n + b_n + r * (h U_n + recurrent_bias))
    h' = (1 - z) * n + z * h
    ```

    Initialised as [`eqx_ppo.nn.LSTM`][].

    **Arguments:** as in [`eqx_ppo.nn.LSTM`][], with `h` alone as the carry,
    `gate_fn` for the `r` and `z` gates, `activation_fn` for the candidate
    `n`, and `bias_init` for every bias.
    """

    recurrent_bias: Float[Array, " hidden_size"]
    initial_h: Float[Array, " hidden_size"] | None

    def _init_arrays(self, key, inits, trainable):
        keys = jax.random.split(key, 4)
        self._init_gates(3, keys[:3], inits)
        bias_init = jax.nn.initializers.zeros if inits[2] is None else inits[2]
        self.recurrent_bias = bias_init(keys[3], (self.hidden_size,), jnp.float32)
        self.initial_h = initial_parameter(trainable, self.hidden_size)

    def initial_state(self) -> Float[Array, " hidden_size"]:
        """`h0`: the learned initial state, or zeros."""
        return initial_carry(self.hidden_size, self.initial_h)

    def __call__(self, state, x, extras=None, *, key=None) -> StatefulModuleOutput:
        del extras, key
        check_input(self, x, (self.in_size,))
        h = state
        x_r, x_z, x_n = jnp.split(x @ self.kernel + self.bias, 3)
        h_r, h_z, h_n = jnp.split(h @ self.recurrent_kernel, 3)
        r = self.gate_fn(x_r + h_r)
        z = self.gate_fn(x_z + h_z)
        n = self.activation_fn(x_n + r * (h_n + self.recurrent_bias))
        h = (1.0 - z) * n + z * h
        return StatefulModuleOutput(h, h, zero_loss(), {}, None)
