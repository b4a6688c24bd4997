"""Convolutions for channels-last `[H, W, C]` pixel observations (as gymnax
and popgym-arcade give them), and the standard CNN encoders."""

from collections.abc import Callable
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Key, Shaped

from .._typecheck import Int, check_range, checked, each
from ._containers import Sequential
from ._dense import Activation, Dense, Initializer, get_activation, kernel_and_bias
from ._module import AbstractStatefulModule, AbstractStatelessLayer
from ._utils import Flattener

Padding = Literal["VALID", "SAME"] | int
"""`"VALID"` (no padding), `"SAME"` (output size `ceil(size / stride)`), or
`p >= 0` zeros on every side."""

ConvSpec = each(tuple, tuple[Int, Int, Int])
"""A CNN stack: one `(out_channels, kernel_size, stride)` per `"VALID"` conv."""

Kind = Literal["nature", "impala_small"]
"""A standard CNN stack by name."""

_KINDS: dict[str, tuple[tuple[tuple[int, int, int], ...], int]] = {
    # Mnih et al. 2015 (Nature DQN), as in CleanRL / PureJaxRL's Atari PPO.
    "nature": (((32, 8, 4), (64, 4, 2), (64, 3, 1)), 512),
    # Mnih et al. 2013 (the first DQN), IMPALA's "shallow" network.
    "impala_small": (((16, 8, 4), (32, 4, 2)), 256),
}


def _output_size(size: int, kernel: int, stride: int, padding: str | int) -> int:
    """The length of one spatial axis after a convolution; < 1 if too short."""
    if padding == "SAME":
        return -(-size // stride)
    pad = 0 if padding == "VALID" else padding
    return (size + 2 * pad - kernel) // stride + 1


@checked
class Conv2d(AbstractStatelessLayer):
    """A 2-D convolution `activation(conv(x) + bias)` on one env's `[H, W, C]` image.

    Wraps `equinox.nn.Conv2d` (on `[C, H, W]`), moving the channel axis so
    that input and output are channels-last like the observations; integer
    inputs (e.g. `uint8` pixels) are cast to float. As in flax, the kernel
    is LeCun normal, its initialiser given the shape `[kh, kw, in, out]`,
    and the bias zero. The output is `[H', W', out_channels]`, with
    `H' = (H + 2p - kh) // stride + 1` (`"SAME"`: `ceil(H / stride)`).
    """

    conv: eqx.nn.Conv2d
    activation: Callable[[Array], Array] = eqx.field(static=True)

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int],
        *,
        key: Key[Array, ""],
        stride: int | tuple[int, int] = 1,
        padding: Padding = "VALID",
        activation: Activation | None = None,
        use_bias: bool = True,
        kernel_init: Initializer | None = None,
        bias_init: Initializer | None = None,
    ):
        """**Arguments:**

        - `in_channels`, `out_channels`: channels of the input and output.
        - `kernel_size`: `k` or `(kh, kw)`.
        - `key`: PRNG key for the initialisers.
        - `stride`: `s` or `(sh, sw)`.
        - `padding`: `"VALID"` (none), `"SAME"`, or zeros added on every side.
        - `activation`, `use_bias`, `kernel_init`, `bias_init`: as in
            [`eqx_ppo.nn.Dense`][].
        """
        kernel_size, stride = (
            v if isinstance(v, tuple) else (v, v) for v in (kernel_size, stride)
        )
        shape = (*kernel_size, in_channels, out_channels)
        kernel, bias = kernel_and_bias(key, shape, use_bias, kernel_init, bias_init)
        # Only Equinox's structure is wanted; our initialisers fill it, so its
        # own (PyTorch-style) initialisation is traced abstractly, never run.
        conv = eqx.filter_eval_shape(
            eqx.nn.Conv2d,
            in_channels,
            out_channels,
            kernel_size,
            stride=stride,
            padding=padding,
            use_bias=use_bias,
            dtype=jnp.float32,
            key=key,
        )
        self.conv = eqx.tree_at(
            lambda c: (c.weight, c.bias),
            conv,
            (
                jnp.transpose(kernel, (3, 2, 0, 1)),
                None if bias is None else bias[:, None, None],
            ),
            is_leaf=lambda x: x is None,
        )
        self.activation = get_activation(activation)

    @property
    def in_channels(self) -> int:
        return self.conv.in_channels

    @property
    def out_channels(self) -> int:
        return self.conv.out_channels

    def output_shape(self, height: int, width: int) -> tuple[int, int, int]:
        """The output shape `(H', W', out_channels)` for an `[height, width, C]`
        input; a spatial size below 1 means the image is too small."""
        (kh, kw), (sh, sw) = self.conv.kernel_size, self.conv.stride
        padding = self.conv.padding
        # Equinox stores an int padding as ((p, p), (p, p)).
        pad = padding if isinstance(padding, str) else padding[0][0]
        return (
            _output_size(height, kh, sh, pad),
            _output_size(width, kw, sw, pad),
            self.out_channels,
        )

    def forward(
        self, x: Shaped[Array, "..."]
    ) -> Float[Array, "out_height out_width out_channels"]:
        """Apply the layer to one env's `[H, W, in_channels]` image."""
        shape = jnp.shape(x)
        if len(shape) != 3 or shape[-1] != self.in_channels:
            raise ValueError(
                f"`Conv2d(in_channels={self.in_channels})` got input of shape "
                f"{shape}; observations must be [H, W, C] for one env, with "
                f"C = {self.in_channels} channels last. Layers work on a single env: "
                "vmap over the env axis, or use `eqx_ppo.nn.apply_batched`; add a "
                "channel axis to a grayscale image (`obs[..., None]`)."
            )
        if not jnp.issubdtype(x.dtype, jnp.floating):
            x = x.astype(self.conv.weight.dtype)
        y = self.conv(jnp.moveaxis(x, -1, 0))
        return self.activation(jnp.moveaxis(y, 0, -1))


class PixelScale(AbstractStatelessLayer):
    """Casts an image to float32 and multiplies it by `factor`, e.g. `1 / 255`
    for `uint8` pixels. Unlike `Scale` it takes integer inputs."""

    factor: float = eqx.field(static=True, converter=float)

    def __check_init__(self):
        fix = "pass e.g. 1 / 255 for uint8 pixels."
        check_range("PixelScale(factor=", self.factor, 0, open_low=True, fix=fix)

    def forward(self, x: Shaped[Array, "*shape"]) -> Float[Array, "*shape"]:
        return x.astype(jnp.float32) * self.factor


def _stack(kind: Kind | ConvSpec) -> tuple[ConvSpec, int]:
    """The conv stack and default `out_size` of a `kind`."""
    return _KINDS[kind] if isinstance(kind, str) else (kind, 256)


def _fitting_kind(stack: ConvSpec, height: int, width: int) -> Kind | ConvSpec:
    """A `kind` that fits an image too small for `stack`: a built-in one, a
    small custom one, or one conv as wide as the image's shorter side."""
    for kind in (*_KINDS, ((16, 3, 1), (32, 3, 2)), ((16, 3, 1),)):
        layers, size = _stack(kind)[0], (height, width)
        for _, kernel, stride in layers:
            size = [_output_size(n, kernel, stride, "VALID") for n in size]
        # A size below 1 stays below 1 through later layers.
        if layers != stack and min(size) >= 1:
            return kind
    return ((16, min(height, width), 1),)


@checked
def make_cnn_encoder(
    obs_shape: tuple[int, int, int],
    *,
    key: Key[Array, ""],
    kind: Kind | ConvSpec = "nature",
    out_size: int | None = None,
    activation: Activation = "relu",
    scale: float | None = None,
    kernel_init: Initializer | None = None,
) -> tuple[Sequential, int]:
    """A CNN encoder: `"VALID"` convolutions, `Flattener`, then one `Dense`.

    Maps one env's `[H, W, C]` image to `out_size` features, every layer
    followed by `activation`; a stack too deep for `obs_shape` fails here.

    **Arguments:**

    - `obs_shape`: one env's observation shape `(H, W, C)`, channels last.
    - `key`: PRNG key for the initialisers.
    - `kind`: `"nature"` (Nature DQN, images of at least 36x36),
      `"impala_small"` (IMPALA's shallow network, at least 20x20), or a tuple
      of `(out_channels, kernel_size, stride)`, e.g. `((16, 3, 1), (32, 3, 2))`.
    - `out_size`: features out; default 512 for `"nature"`, 256 otherwise.
    - `activation`: a name, as in [`eqx_ppo.nn.Dense`][], or a callable.
    - `scale`: if given, a first layer casts to float32 and multiplies by it.
    - `kernel_init`: every layer's kernel initialiser; default LeCun normal.

    **Returns:** `(encoder, out_size)`: a stateless
    [`eqx_ppo.nn.Sequential`][] and its `out_size`.
    """
    height, width, channels = obs_shape
    stack, default_out = _stack(kind)
    out_size = default_out if out_size is None else out_size
    keys = jax.random.split(key, len(stack) + 1)
    layers: list[AbstractStatefulModule] = [] if scale is None else [PixelScale(scale)]
    for i, (out_channels, kernel, stride) in enumerate(stack):
        conv = Conv2d(
            channels,
            out_channels,
            kernel,
            stride=stride,
            activation=activation,
            kernel_init=kernel_init,
            key=keys[i],
        )
        new_height, new_width, _ = conv.output_shape(height, width)
        if new_height < 1 or new_width < 1:
            raise ValueError(
                f"make_cnn_encoder(obs_shape={tuple(obs_shape)!r}, kind={kind!r}): "
                f"the image is too small for this stack: conv layer {i} "
                f"({out_channels} {kernel}x{kernel} stride {stride}) gets a "
                f"{height}x{width} input and would output "
                f"{new_height}x{new_width}. Use "
                f"kind={_fitting_kind(stack, *obs_shape[:2])!r}, which fits a "
                f"{obs_shape[0]}x{obs_shape[1]} image, or larger observations."
            )
        layers.append(conv)
        height, width, channels = new_height, new_width, out_channels
    dense = Dense(
        height * width * channels,
        out_size,
        activation=activation,
        kernel_init=kernel_init,
        key=keys[-1],
    )
    return Sequential([*layers, Flattener(), dense]), out_size
