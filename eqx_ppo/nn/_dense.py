"""Dense: a linear layer with an optional activation, and activation lookup."""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray

from ._errors import input_shape_fix
from ._keys import check_key
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


def get_activation(
    activation: str | Callable[[Array], Array] | None,
) -> Callable[[Array], Array]:
    """Resolve an activation given by name, as a callable, or `None` (identity).

    Names: `"relu"`, `"tanh"`, `"swish"` (= `"silu"`), `"gelu"`, `"sigmoid"`,
    `"elu"`, `"identity"`. A callable is returned unchanged.
    """
    if activation is None:
        return identity
    if isinstance(activation, str):
        try:
            return _ACTIVATIONS[activation]
        except KeyError:
            raise ValueError(
                f"activation={activation!r} is not a known activation name; "
                f"expected one of {sorted(_ACTIVATIONS)}, a callable, or None."
            ) from None
    if callable(activation):
        return activation
    raise TypeError(
        "activation must be a name, a callable or None; got "
        f"{type(activation).__name__} {activation!r}."
    )


def check_size(name: str, value: Any) -> None:
    """Raise unless `value` is a positive Python int (a layer width)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"{name} must be a positive int; got {type(value).__name__} {value!r}."
        )
    if value < 1:
        raise ValueError(f"{name} must be a positive int; got {value}.")


def check_int(where: str, value: Any, minimum: int, meaning: str) -> None:
    """Raise unless `value` is a Python int (not a bool) of at least `minimum`.

    `where` names the argument as the call spelt it; `meaning` says, in the
    range error, what the bound means or how to do without it.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"{where} must be an int >= {minimum}; got {type(value).__name__} "
            f"{value!r}."
        )
    if value < minimum:
        raise ValueError(f"{where} must be >= {minimum} ({meaning}); got {value}.")


def check_vector(layer: str, x: Any, size: int) -> None:
    """Raise at trace time unless `x` is one env's feature vector of `size`."""
    shape = jnp.shape(x)
    if shape != (size,):
        raise ValueError(
            f"{layer} expects one env's input of shape ({size},), got shape {shape}. "
            + input_shape_fix(shape, (size,))
        )


def orthogonal(scale: float = 1.0) -> Initializer:
    """`jax.nn.initializers.orthogonal(scale)`, safe to `vmap` on CPU.

    Under `jax.vmap` (e.g. a network factory vmapped over seeds) JAX's
    initialiser becomes one batched QR custom call per matrix. XLA:CPU runs
    independent calls concurrently on its intra-op thread pool, and each
    batched LAPACK call then waits for sub-tasks on that same pool: with as
    many concurrent QRs as pool threads (two on a 2-core machine), every
    thread waits and the program hangs. Here a vmapped call loops over the
    batch instead (`jax.lax.map`), one unbatched QR at a time. The values are
    exactly those of `jax.nn.initializers.orthogonal`.
    """
    base = jax.nn.initializers.orthogonal(scale)

    def init(key: PRNGKeyArray, shape: tuple[int, ...], dtype: Any = jnp.float32):
        @jax.custom_batching.custom_vmap
        def one(k):
            return base(k, shape, dtype)

        @one.def_vmap
        def _one_per_key(axis_size, in_batched, k):
            return jax.lax.map(one, k), True

        return one(key)

    return init


def init_param(
    name: str, init: Initializer, key: PRNGKeyArray, shape: tuple[int, ...]
) -> Float[Array, "..."]:
    """Call an initialiser and check it returned the requested shape."""
    value = jnp.asarray(init(key, shape, jnp.float32))
    if value.shape != shape:
        raise ValueError(
            f"{name} returned shape {value.shape}, expected {shape}; it must be a "
            "`(key, shape, dtype) -> array` initialiser such as those in "
            "`jax.nn.initializers`."
        )
    return value


class Dense(AbstractStatelessLayer):
    """A linear layer `activation(x @ kernel + bias)` for one env.

    The defaults match flax: a LeCun-normal (truncated normal, variance
    `1 / in_size`) kernel and a zero bias. The kernel is stored `[in, out]` as
    in flax, so any `jax.nn.initializers` initialiser computes its fan-in and
    fan-out the usual way. Stateless: the carry is `()`, there is no
    regularisation, no metrics and nothing to replay.

    ```python
    layer = Dense(4, 8, activation="tanh", key=jax.random.key(0))
    out = layer((), jnp.ones(4))  # out.output has shape (8,)
    ```
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
        key: PRNGKeyArray,
        activation: str | Callable[[Array], Array] | None = None,
        use_bias: bool = True,
        kernel_init: Initializer | None = None,
        bias_init: Initializer | None = None,
    ):
        """**Arguments:**

        - `in_size`: input features.
        - `out_size`: output features.
        - `key`: PRNG key for the initialisers.
        - `activation`: `None` (linear), a callable, or a name accepted by
            [`eqx_ppo.nn.get_activation`][].
        - `use_bias`: whether to add a bias.
        - `kernel_init`: initialiser for the `[in_size, out_size]` kernel;
            default `jax.nn.initializers.lecun_normal()`.
        - `bias_init`: initialiser for the bias; default zeros.
        """
        check_key("Dense", key)
        check_size("Dense(in_size=...)", in_size)
        check_size("Dense(out_size=...)", out_size)
        kernel_key, bias_key = jax.random.split(key)
        if kernel_init is None:
            kernel_init = jax.nn.initializers.lecun_normal()
        if bias_init is None:
            bias_init = jax.nn.initializers.zeros
        self.kernel = init_param(
            "Dense(kernel_init=...)", kernel_init, kernel_key, (in_size, out_size)
        )
        self.bias = (
            init_param("Dense(bias_init=...)", bias_init, bias_key, (out_size,))
            if use_bias
            else None
        )
        self.activation = get_activation(activation)
        self.in_size = in_size
        self.out_size = out_size

    def forward(self, x: Float[Array, " in_size"]) -> Float[Array, " out_size"]:
        """Apply the layer to one env's input."""
        check_vector("Dense", x, self.in_size)
        y = x @ self.kernel
        if self.bias is not None:
            y = y + self.bias
        return self.activation(y)
