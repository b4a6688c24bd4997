"""Recurrent layers: LSTM (carry `(h, c)`) and GRU (carry `h`)."""

import abc
from collections.abc import Callable
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Key, PRNGKeyArray

from ._dense import (
    Initializer,
    check_size,
    check_vector,
    get_activation,
    init_param,
    orthogonal,
)
from ._keys import check_key
from ._module import (
    AbstractStatefulModule,
    State,
    StatefulModuleOutput,
    zero_loss,
)

Activation = str | Callable[[Array], Array]

LSTMState = tuple[Float[Array, " hidden"], Float[Array, " hidden"]]
"""An LSTM carry `(h, c)`: hidden state first, cell state second."""


def _init_gates(
    name: str,
    init: Initializer,
    key: PRNGKeyArray,
    shape: tuple[int, ...],
    n_gates: int,
) -> Float[Array, "..."]:
    """Initialise each gate's block separately and concatenate on the last axis.

    Per-gate calls match flax (e.g. each recurrent block is its own orthogonal
    matrix) while the layer still does one fused matmul per step.
    """
    keys = jax.random.split(key, n_gates)
    return jnp.concatenate([init_param(name, init, k, shape) for k in keys], axis=-1)


def _init_input_weights(
    layer: str,
    in_size: int,
    hidden_size: int,
    n_gates: int,
    keys: tuple[PRNGKeyArray, PRNGKeyArray],
    kernel_init: Initializer | None,
    bias_init: Initializer | None,
) -> tuple[Array, Array]:
    """The gate-stacked input `kernel` and `bias` of a layer.

    `keys` are the kernel's and bias's keys. Defaults: LeCun-normal kernels,
    zero biases.
    """
    check_size(f"{layer}(in_size=...)", in_size)
    check_size(f"{layer}(hidden_size=...)", hidden_size)
    kernel_key, bias_key = keys
    kernel = _init_gates(
        f"{layer}(kernel_init=...)",
        jax.nn.initializers.lecun_normal() if kernel_init is None else kernel_init,
        kernel_key,
        (in_size, hidden_size),
        n_gates,
    )
    bias = _init_gates(
        f"{layer}(bias_init=...)",
        jax.nn.initializers.zeros if bias_init is None else bias_init,
        bias_key,
        (hidden_size,),
        n_gates,
    )
    return kernel, bias


def _init_weights(
    layer: str,
    in_size: int,
    hidden_size: int,
    n_gates: int,
    keys: Key[Array, " 3"] | list[PRNGKeyArray],
    kernel_init: Initializer | None,
    recurrent_init: Initializer | None,
    bias_init: Initializer | None,
) -> tuple[Array, Array, Array]:
    """The gate-stacked `kernel`, `recurrent_kernel` and `bias` of a layer.

    `keys` are the kernel's, recurrent kernel's and bias's keys. Defaults:
    LeCun-normal input kernels, orthogonal recurrent kernels, zero biases.
    """
    kernel_key, recurrent_key, bias_key = keys
    kernel, bias = _init_input_weights(
        layer,
        in_size,
        hidden_size,
        n_gates,
        (kernel_key, bias_key),
        kernel_init,
        bias_init,
    )
    recurrent_kernel = _init_gates(
        f"{layer}(recurrent_init=...)",
        orthogonal() if recurrent_init is None else recurrent_init,
        recurrent_key,
        (hidden_size, hidden_size),
        n_gates,
    )
    return kernel, recurrent_kernel, bias


def _initial_parameter(
    trainable: bool, hidden_size: int
) -> Float[Array, " hidden_size"] | None:
    """A learned initial carry part (zeros until trained), or `None` for none."""
    return jnp.zeros(hidden_size, jnp.float32) if trainable else None


def _check_hidden(layer: str, what: str, h: Any, size: int) -> None:
    if jnp.shape(h) != (size,):
        raise ValueError(
            f"{layer} carry {what} has shape {jnp.shape(h)}, expected ({size},). "
            "Build it with `initial_state()` (one env) and vmap over envs."
        )


class _AbstractRecurrentCell(AbstractStatefulModule):
    """What the recurrent layers share: a checked, deterministic `step`.

    `__call__` checks one env's input and carry, then runs `step`; there is no
    loss, no metric and nothing to replay. The carry holds one `[hidden_size]`
    array per name in `carry_parts`: the array itself for one name, a tuple
    of them, in that order, for more. Each part starts an episode from the
    field `initial_<part>`: a learned parameter, or `None` for zeros.
    """

    in_size: eqx.AbstractVar[int]
    hidden_size: eqx.AbstractVar[int]
    carry_parts: eqx.AbstractClassVar[tuple[str, ...]]

    def initial_state(self) -> State:
        """The carry at an episode start: each part's learned initial value
        (with `trainable_initial_state=True`), or zeros."""
        initial = (getattr(self, f"initial_{part}") for part in self.carry_parts)
        parts = tuple(
            jnp.zeros(self.hidden_size, jnp.float32) if h is None else h
            for h in initial
        )
        return parts if len(parts) > 1 else parts[0]

    @abc.abstractmethod
    def step(self, state: State, x: Float[Array, " in_size"]) -> tuple[State, Array]:
        """The next carry and the output of one env's step."""

    def _check_step(self, state: Any, x: Any) -> None:
        """Raise at trace time unless `state` and `x` are one env's carry and input."""
        layer = type(self).__name__
        check_vector(layer, x, self.in_size)
        if len(self.carry_parts) == 1:
            _check_hidden(layer, self.carry_parts[0], state, self.hidden_size)
            return
        if not (isinstance(state, tuple) and len(state) == len(self.carry_parts)):
            raise ValueError(
                f"{layer} carry must be the tuple ({', '.join(self.carry_parts)}); "
                f"got {type(state).__name__}. Use `initial_state()`."
            )
        for part, h in zip(self.carry_parts, state, strict=True):
            _check_hidden(layer, part, h, self.hidden_size)

    def __call__(
        self,
        state: State,
        x: Float[Array, " in_size"],
        extras: Any = None,
        *,
        key: PRNGKeyArray | None = None,
    ) -> StatefulModuleOutput:
        """One step for one env: `step(state, x)`, after checking both."""
        del extras, key
        self._check_step(state, x)
        next_state, output = self.step(state, x)
        return StatefulModuleOutput(next_state, output, zero_loss(), {}, None)


class LSTM(_AbstractRecurrentCell):
    """A long short-term memory layer for one env; the output is `h`.

    The carry is the tuple **`(h, c)`, hidden state first, cell state
    second**. Each step computes, with gates stacked in the order
    `i, f, g, o` along the last axis of `kernel`, `recurrent_kernel` and
    `bias`:

    ```
    i = gate_fn(x W_i + h U_i + b_i)        f = gate_fn(x W_f + h U_f + b_f)
    g = activation_fn(x W_g + h U_g + b_g)  o = gate_fn(x W_o + h U_o + b_o)
    c' = f * c + i * g                      h' = o * activation_fn(c')
    ```

    The defaults follow flax's `LSTMCell`: LeCun-normal input kernels,
    orthogonal recurrent kernels (one per gate) and **zero biases for every
    gate, including the forget gate** (no `+1` forget bias). For a forget
    bias, set `bias[hidden_size:2 * hidden_size]` with `eqx.tree_at`.

    With `trainable_initial_state=True`, `initial_state()` returns the
    parameters `(initial_h, initial_c)` themselves, so every episode start
    (and every reset in the loss replay) passes gradient to them.
    """

    kernel: Float[Array, "in_size gates"]
    recurrent_kernel: Float[Array, "hidden_size gates"]
    bias: Float[Array, " gates"]
    initial_h: Float[Array, " hidden_size"] | None
    initial_c: Float[Array, " hidden_size"] | None
    gate_fn: Callable[[Array], Array] = eqx.field(static=True)
    activation_fn: Callable[[Array], Array] = eqx.field(static=True)
    in_size: int = eqx.field(static=True)
    hidden_size: int = eqx.field(static=True)
    carry_parts: ClassVar[tuple[str, ...]] = ("h", "c")

    def __init__(
        self,
        in_size: int,
        hidden_size: int,
        *,
        key: PRNGKeyArray,
        trainable_initial_state: bool = False,
        gate_fn: Activation = jax.nn.sigmoid,
        activation_fn: Activation = jnp.tanh,
        kernel_init: Initializer | None = None,
        recurrent_init: Initializer | None = None,
        bias_init: Initializer | None = None,
    ):
        """**Arguments:**

        - `in_size`: input features.
        - `hidden_size`: size of `h` and `c`, and of the output.
        - `key`: PRNG key for the initialisers.
        - `trainable_initial_state`: learn `(h0, c0)` (initialised to zeros)
            instead of starting every episode from zeros.
        - `gate_fn`: squashing of the `i`, `f`, `o` gates (callable or name).
        - `activation_fn`: activation of the candidate `g` and of the output
            cell state (callable or name).
        - `kernel_init`: initialiser of each gate's `[in_size, hidden_size]`
            input kernel; default LeCun normal.
        - `recurrent_init`: initialiser of each gate's
            `[hidden_size, hidden_size]` recurrent kernel; default orthogonal.
        - `bias_init`: initialiser of each gate's bias; default zeros.
        """
        check_key("LSTM", key)
        self.kernel, self.recurrent_kernel, self.bias = _init_weights(
            "LSTM",
            in_size,
            hidden_size,
            4,
            jax.random.split(key, 3),
            kernel_init,
            recurrent_init,
            bias_init,
        )
        self.initial_h = _initial_parameter(trainable_initial_state, hidden_size)
        self.initial_c = _initial_parameter(trainable_initial_state, hidden_size)
        self.gate_fn = get_activation(gate_fn)
        self.activation_fn = get_activation(activation_fn)
        self.in_size = in_size
        self.hidden_size = hidden_size

    def step(
        self, state: LSTMState, x: Float[Array, " in_size"]
    ) -> tuple[LSTMState, Float[Array, " hidden_size"]]:
        """One step for one env; returns `(h', c')` as carry and `h'` as output."""
        h, c = state
        z = x @ self.kernel + h @ self.recurrent_kernel + self.bias
        i, f, g, o = jnp.split(z, 4)
        c = self.gate_fn(f) * c + self.gate_fn(i) * self.activation_fn(g)
        h = self.gate_fn(o) * self.activation_fn(c)
        return (h, c), h


class GRU(_AbstractRecurrentCell):
    """A gated recurrent unit layer for one env; the carry and output are `h`.

    The update follows flax's `GRUCell` (and cuDNN): gates stacked in the
    order `r, z, n` along the last axis of `kernel`, `recurrent_kernel` and
    `bias`; the recurrent side has a bias only for the candidate `n`:

    ```
    r = gate_fn(x W_r + b_r + h U_r)
    z = gate_fn(x W_z + b_z + h U_z)
    n = activation_fn(x W_n + b_n + r * (h U_n + recurrent_bias))
    h' = (1 - z) * n + z * h
    ```

    Defaults: LeCun-normal input kernels, orthogonal recurrent kernels (one
    per gate), zero biases. With `trainable_initial_state=True`,
    `initial_state()` returns the learned `initial_h`.
    """

    kernel: Float[Array, "in_size gates"]
    recurrent_kernel: Float[Array, "hidden_size gates"]
    bias: Float[Array, " gates"]
    recurrent_bias: Float[Array, " hidden_size"]
    initial_h: Float[Array, " hidden_size"] | None
    gate_fn: Callable[[Array], Array] = eqx.field(static=True)
    activation_fn: Callable[[Array], Array] = eqx.field(static=True)
    in_size: int = eqx.field(static=True)
    hidden_size: int = eqx.field(static=True)
    carry_parts: ClassVar[tuple[str, ...]] = ("h",)

    def __init__(
        self,
        in_size: int,
        hidden_size: int,
        *,
        key: PRNGKeyArray,
        trainable_initial_state: bool = False,
        gate_fn: Activation = jax.nn.sigmoid,
        activation_fn: Activation = jnp.tanh,
        kernel_init: Initializer | None = None,
        recurrent_init: Initializer | None = None,
        bias_init: Initializer | None = None,
    ):
        """**Arguments:**

        - `in_size`: input features.
        - `hidden_size`: size of `h`, and of the output.
        - `key`: PRNG key for the initialisers.
        - `trainable_initial_state`: learn `h0` (initialised to zeros)
            instead of starting every episode from zeros.
        - `gate_fn`: squashing of the `r` and `z` gates (callable or name).
        - `activation_fn`: activation of the candidate `n` (callable or name).
        - `kernel_init`: initialiser of each gate's `[in_size, hidden_size]`
            input kernel; default LeCun normal.
        - `recurrent_init`: initialiser of each gate's
            `[hidden_size, hidden_size]` recurrent kernel; default orthogonal.
        - `bias_init`: initialiser of every bias; default zeros.
        """
        check_key("GRU", key)
        *keys, recurrent_bias_key = jax.random.split(key, 4)
        self.kernel, self.recurrent_kernel, self.bias = _init_weights(
            "GRU", in_size, hidden_size, 3, keys, kernel_init, recurrent_init, bias_init
        )
        self.recurrent_bias = init_param(
            "GRU(bias_init=...)",
            jax.nn.initializers.zeros if bias_init is None else bias_init,
            recurrent_bias_key,
            (hidden_size,),
        )
        self.initial_h = _initial_parameter(trainable_initial_state, hidden_size)
        self.gate_fn = get_activation(gate_fn)
        self.activation_fn = get_activation(activation_fn)
        self.in_size = in_size
        self.hidden_size = hidden_size

    def step(
        self, state: Float[Array, " hidden_size"], x: Float[Array, " in_size"]
    ) -> tuple[Float[Array, " hidden_size"], Float[Array, " hidden_size"]]:
        """One step for one env; returns `h'` as both carry and output."""
        h = state
        x_r, x_z, x_n = jnp.split(x @ self.kernel + self.bias, 3)
        h_r, h_z, h_n = jnp.split(h @ self.recurrent_kernel, 3)
        r = self.gate_fn(x_r + h_r)
        z = self.gate_fn(x_z + h_z)
        n = self.activation_fn(x_n + r * (h_n + self.recurrent_bias))
        h = (1.0 - z) * n + z * h
        return h, h
