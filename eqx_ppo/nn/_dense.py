"""Dense: a linear layer with an optional activation, and activation lookup."""

from collections.abc import Callable
from typing import Any, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Key

from .._typecheck import checked
from ._errors import check_input
from ._module import AbstractStatelessLayer

Initializer = Callable[..., Array]
"""A `jax.nn.initializers`-style callable `(key, shape, dtype) -> array`."""


def identity(x: Any) -> Any:
    """Returns its input: the activation of a purely linear layer."""
    return x


_ACTIVATIONS: dict[str, Callable[[Array], Array]] = {
    "relu": jax.nn.relu,
    "tanh": jnp.tanh,
    "swish": jax.nn.swish,
    "silu": jax.nn.silu,
    "gelu": jax.nn.gelu,
    "sigmoid": jax.nn.sigmoid,
    "elu": jax.nn.elu,
    "identity": identity,
}


ActivationName = Literal[
    "relu", "tanh", "swish", "silu", "gelu", "sigmoid", "elu", "identity"
]
"""An activation by name: `"swish"` is `"silu"`, `"identity"` is none."""

Activation = ActivationName | Callable[[Array], Array]
"""An activation by name, or any callable from array to array."""


def get_activation(activation: Activation | None) -> Callable[[Array], Array]:
    """The callable of an activation; `None` is the identity."""
    if activation is None:
        return identity
    return _ACTIVATIONS[activation] if isinstance(activation, str) else activation


def orthogonal(scale: float = 1.0) -> Initializer:
    """`jax.nn.initializers.orthogonal(scale)`, safe to `vmap` on CPU.

    Vmapped, JAX's initialiser is one batched QR per matrix, and XLA:CPU can
    deadlock running as many of them as it has pool threads; here a vmapped
    call loops over the batch (`jax.lax.map`) instead. Same values.
    """
    base = jax.nn.initializers.orthogonal(scale)

    def init(key: Key[Array, ""], shape: tuple[int, ...], dtype: Any = jnp.float32):
        @jax.custom_batching.custom_vmap
        def one(k):
            return base(k, shape, dtype)

        @one.def_vmap
        def _one_per_key(axis_size, in_batched, k):
            return jax.lax.map(one, k), True

        return one(key)

    return init


def kernel_and_bias(
    key: Key[Array, ""],
    shape: tuple[int, ...],
    use_bias: bool = True,
    kernel_init: Initializer | None = None,
    bias_init: Initializer | None = None,
) -> tuple[Array, Array | None]:
    """A float32 kernel of `shape` (LeCun normal unless `kernel_init`) and,
    with `use_bias`, a bias of its last axis (zeros unless `bias_init`)."""
    kernel_key, bias_key = jax.random.split(key)
    kernel_init = kernel_init or jax.nn.initializers.lecun_normal()
    bias_init = bias_init or jax.nn.initializers.zeros
    kernel = kernel_init(kernel_key, shape, jnp.float32)
    bias = bias_init(bias_key, shape[-1:], jnp.float32) if use_bias else None
    return kernel, bias


@checked
class Dense(AbstractStatelessLayer):
    """A linear layer `activation(x @ kernel + bias)` for one env; no carry.

    As in flax: a LeCun-normal kernel stored `[in, out]` (so any
    `jax.nn.initializers` initialiser sees the usual fan-in) and a zero bias.
    """

    kernel: Float[Array, "in_size out_size"]
    bias: Float[Array, " out_size"] | None
    activation: Callable[[Array], Array] = eqx.field(static=True)
    in_size: int = eqx.field(static=True)
    out_size: int = eqx.field(static=True)

    def __init__(
        self,
        in_size: int,
        out_size: int,
        *,
        key: Key[Array, ""],
        activation: Activation | None = None,
        use_bias: bool = True,
        kernel_init: Initializer | None = None,
        bias_init: Initializer | None = None,
    ):
        """**Arguments:**

        - `in_size`: input features.
        - `out_size`: output features.
        - `key`: PRNG key for the initialisers.
        - `activation`: `None` (linear), a callable, or a name: `"relu"`, `"tanh"`,
            `"swish"` (= `"silu"`), `"gelu"`, `"sigmoid"`, `"elu"`, `"identity"`.
        - `use_bias`: whether to add a bias.
        - `kernel_init`: initialiser of the `[in_size, out_size]` kernel.
        - `bias_init`: initialiser of the bias.
        """
        self.kernel, self.bias = kernel_and_bias(
            key, (in_size, out_size), use_bias, kernel_init, bias_init
        )
        self.activation = get_activation(activation)
        self.in_size = in_size
        self.out_size = out_size

    def forward(self, x: Float[Array, " in_size"]) -> Float[Array, " out_size"]:
        """Apply the layer to one env's input."""
        check_input(self, x, (self.in_size,))
        y = x @ self.kernel
        if self.bias is not None:
            y = y + self.bias
        return self.activation(y)
