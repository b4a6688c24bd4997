"""Convolutions for pixel observations, and the standard CNN encoders.

Observations from gymnax, popgym-arcade and most pixel environments are
channels-last, `[H, W, C]`; `equinox.nn.Conv2d` wants channels-first,
`[C, H, W]`. [`eqx_ppo.nn.Conv2d`][] wraps Equinox's convolution and
transposes, so a network takes observations as the environment gives them.
"""

import math
from collections.abc import Callable, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, PRNGKeyArray, Shaped

from ._containers import Sequential
from ._dense import Dense, Initializer, check_size, get_activation, init_param
from ._keys import check_key
from ._module import AbstractStatefulModule, AbstractStatelessLayer
from ._utils import Flattener

Padding = str | int
"""`"VALID"` (no padding), `"SAME"` (output size `ceil(size / stride)`), or
`p >= 0` zeros on every side."""

ConvSpec = Sequence[Sequence[int]]
"""A CNN stack: one `(out_channels, kernel_size, stride)` per `"VALID"` conv."""

_KINDS: dict[str, tuple[tuple[tuple[int, int, int], ...], int]] = {
    # Mnih et al. 2015 (Nature DQN), as in CleanRL / PureJaxRL's Atari PPO.
    "nature": (((32, 8, 4), (64, 4, 2), (64, 3, 1)), 512),
    # Mnih et al. 2013 (the first DQN), IMPALA's "shallow" network.
    "impala_small": (((16, 8, 4), (32, 4, 2)), 256),
}


def _pair(name: str, value: int | tuple[int, int]) -> tuple[int, int]:
    pair = value if isinstance(value, tuple) else (value, value)
    if len(pair) != 2:
        raise ValueError(f"{name} must be an int or a pair of ints; got {value!r}.")
    for v in pair:
        check_size(name, v)
    return pair


def _check_padding(padding: Any) -> str | int:
    if isinstance(padding, str) and padding.upper() in ("VALID", "SAME"):
        return padding.upper()
    if isinstance(padding, int) and not isinstance(padding, bool) and padding >= 0:
        return padding
    raise ValueError(
        f"Conv2d(padding={padding!r}) must be 'VALID', 'SAME' or an int >= 0 "
        "(zeros added on every side)."
    )


def _output_size(size: int, kernel: int, stride: int, padding: str | int) -> int:
    """The length of one spatial axis after a convolution; < 1 if too short."""
    if padding == "SAME":
        return -(-size // stride)
    pad = 0 if padding == "VALID" else padding
    return (size + 2 * pad - kernel) // stride + 1


class Conv2d(AbstractStatelessLayer):
    """A 2-D convolution `activation(conv(x) + bias)` on one env's `[H, W, C]` image.

    Wraps `equinox.nn.Conv2d`, which holds the weight (`[out, in, kh, kw]`)
    and runs the convolution on `[C, H, W]`; this layer moves the channel
    axis to the front and back, so its input and output are channels-last
    like the observations. Integer inputs (e.g. `uint8` pixels) are cast to
    float first; scale them with [`eqx_ppo.nn.PixelScale`][] if wanted.

    The initialisers follow [`eqx_ppo.nn.Dense`][] and flax: a LeCun-normal
    kernel and a zero bias. The initialiser is called on the kernel's
    `[kh, kw, in, out]` shape (flax's layout), so any `jax.nn.initializers`
    initialiser gets the fan-in `kh * kw * in` and fan-out `kh * kw * out`.
    Stateless: the carry is `()`, no regularisation, no metrics.

    **Shapes:** input `[H, W, in_channels]`, output
    `[H', W', out_channels]`, with `H' = (H + 2p - kh) // stride + 1` for
    padding `p` (`"VALID"`: `p = 0`) and `H' = ceil(H / stride)` for `"SAME"`.

    ```python
    conv = Conv2d(3, 16, 8, stride=4, activation="relu", key=jax.random.key(0))
    out = conv((), jnp.zeros((84, 84, 3)))  # out.output has shape (20, 20, 16)
    ```
    """

    conv: eqx.nn.Conv2d
    activation: Callable[[Array], Array] = eqx.field(static=True)

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int],
        *,
        key: PRNGKeyArray,
        stride: int | tuple[int, int] = 1,
        padding: Padding = "VALID",
        activation: str | Callable[[Array], Array] | None = None,
        use_bias: bool = True,
        kernel_init: Initializer | None = None,
        bias_init: Initializer | None = None,
    ):
        """**Arguments:**

        - `in_channels`: channels of the input, its last axis.
        - `out_channels`: channels of the output.
        - `kernel_size`: `k` or `(kh, kw)`.
        - `key`: PRNG key for the initialisers.
        - `stride`: `s` or `(sh, sw)`.
        - `padding`: `"VALID"` (none), `"SAME"`, or zeros added on every side.
        - `activation`: `None` (linear), a callable, or a name accepted by
            [`eqx_ppo.nn.get_activation`][].
        - `use_bias`: whether to add a bias (one per output channel).
        - `kernel_init`: initialiser for the `[kh, kw, in, out]` kernel;
            default `jax.nn.initializers.lecun_normal()`.
        - `bias_init`: initialiser for the `[out]` bias; default zeros.
        """
        check_key("Conv2d", key)
        check_size("Conv2d(in_channels=...)", in_channels)
        check_size("Conv2d(out_channels=...)", out_channels)
        kernel_size = _pair("Conv2d(kernel_size=...)", kernel_size)
        stride = _pair("Conv2d(stride=...)", stride)
        padding = _check_padding(padding)
        kernel_key, bias_key = jax.random.split(key)
        if kernel_init is None:
            kernel_init = jax.nn.initializers.lecun_normal()
        if bias_init is None:
            bias_init = jax.nn.initializers.zeros
        kernel = init_param(
            "Conv2d(kernel_init=...)",
            kernel_init,
            kernel_key,
            (*kernel_size, in_channels, out_channels),
        )
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
        bias = (
            init_param("Conv2d(bias_init=...)", bias_init, bias_key, (out_channels,))
            if use_bias
            else None
        )
        conv = eqx.tree_at(
            lambda c: (c.weight, c.bias),
            conv,
            (
                jnp.transpose(kernel, (3, 2, 0, 1)),
                None if bias is None else bias[:, None, None],
            ),
            is_leaf=lambda x: x is None,
        )
        self.conv = conv
        self.activation = get_activation(activation)

    @property
    def in_channels(self) -> int:
        return self.conv.in_channels

    @property
    def out_channels(self) -> int:
        return self.conv.out_channels

    def output_shape(self, height: int, width: int) -> tuple[int, int, int]:
        """The output shape `(H', W', out_channels)` for an `[height, width, C]` input.

        A spatial size below 1 means the image is too small for the kernel.
        """
        (kh, kw), (sh, sw) = self.conv.kernel_size, self.conv.stride
        padding = self.conv.padding
        # Equinox stores an int padding as ((p, p), (p, p)).
        pad = padding if isinstance(padding, str) else padding[0][0]
        return (
            _output_size(height, kh, sh, pad),
            _output_size(width, kw, sw, pad),
            self.out_channels,
        )

    def _check_input(self, x: Array) -> None:
        shape = jnp.shape(x)
        described = (
            f"`Conv2d(in_channels={self.in_channels})` got input of shape {shape}"
        )
        if len(shape) != 3 or shape[-1] != self.in_channels:
            raise ValueError(
                f"{described}; observations must be [H, W, C] for one env, with "
                f"C = {self.in_channels} channels last. Layers work on a single env: "
                "vmap over the env axis, or use `eqx_ppo.nn.apply_batched`; add a "
                "channel axis to a grayscale image (`obs[..., None]`)."
            )
        out_h, out_w, _ = self.output_shape(shape[0], shape[1])
        if out_h < 1 or out_w < 1:
            raise ValueError(
                f"{described}: the image is smaller than the "
                f"{self.conv.kernel_size} kernel; use a smaller kernel_size, "
                "padding='SAME', or larger observations."
            )

    def forward(
        self, x: Shaped[Array, "..."]
    ) -> Float[Array, "out_height out_width out_channels"]:
        """Apply the layer to one env's `[H, W, in_channels]` image."""
        self._check_input(x)
        if not jnp.issubdtype(x.dtype, jnp.floating):
            x = x.astype(self.conv.weight.dtype)
        y = self.conv(jnp.moveaxis(x, -1, 0))
        return self.activation(jnp.moveaxis(y, 0, -1))


class PixelScale(AbstractStatelessLayer):
    """Casts an image to float32 and multiplies it by `factor`.

    `PixelScale(1 / 255)` maps `uint8` pixels to `[0, 1]`. Unlike
    [`eqx_ppo.nn.Scale`][], it accepts integer inputs (a float factor times a
    `uint8` array has no implicit dtype promotion under strict promotion).

    **Arguments:**

    - `factor`: the multiplier, finite and `> 0`; static configuration, never
      trained.
    """

    factor: float = eqx.field(static=True)

    def __init__(self, factor: float):
        check_pixel_scale("PixelScale(factor=...)", factor)
        self.factor = float(factor)

    def forward(self, x: Shaped[Array, "*shape"]) -> Float[Array, "*shape"]:
        return x.astype(jnp.float32) * self.factor


def check_pixel_scale(name: str, value: Any) -> None:
    """Raise unless `value` is a finite number > 0 (a pixel multiplier)."""
    if not 0 < value < math.inf:
        raise ValueError(
            f"{name} must be a finite number > 0, e.g. 1 / 255 for uint8 pixels; "
            f"got {value}."
        )


def _spec(kind: str | ConvSpec) -> tuple[tuple[tuple[int, int, int], ...], int]:
    """The conv stack and default `out_size` of a `kind`."""
    if isinstance(kind, str):
        if kind not in _KINDS:
            raise ValueError(
                f"make_cnn_encoder(kind={kind!r}) is not a known kind; expected one "
                f"of {sorted(_KINDS)} or a tuple of (channels, kernel, stride)."
            )
        return _KINDS[kind]
    layers = tuple(tuple(layer) for layer in kind)
    valid = all(
        len(layer) == 3
        and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in layer)
        for layer in layers
    )
    if not layers or not valid:
        raise ValueError(
            f"make_cnn_encoder(kind={kind!r}): a custom spec must be a non-empty "
            "tuple of (channels, kernel, stride) triples of positive ints, e.g. "
            "((16, 3, 1), (32, 3, 2))."
        )
    return layers, 256


def _fits(stack: tuple[tuple[int, int, int], ...], height: int, width: int) -> bool:
    for _, kernel, stride in stack:
        height, width = (
            _output_size(n, kernel, stride, "VALID") for n in (height, width)
        )
        if height < 1 or width < 1:
            return False
    return True


def _fitting_kind(
    stack: tuple[tuple[int, int, int], ...], height: int, width: int
) -> str:
    """A `kind=` to suggest for an image too small for `stack`: a built-in
    one, else a small custom spec, that fits it (one conv whose kernel is the
    image's shorter side always does)."""
    candidates: list[tuple[str, tuple[tuple[int, int, int], ...]]] = [
        (f"kind={name!r}", layers) for name, (layers, _) in _KINDS.items()
    ]
    for custom in (((16, 3, 1), (32, 3, 2)), ((16, 3, 1),)):
        candidates.append((f"kind={custom!r}", custom))
    for text, layers in candidates:
        if layers != stack and _fits(layers, height, width):
            return text
    return f"kind={((16, min(height, width), 1),)!r}"


def _check_obs_shape(obs_shape: Any) -> tuple[int, int, int]:
    shape = tuple(obs_shape)
    if len(shape) != 3 or not all(
        isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape
    ):
        raise ValueError(
            f"make_cnn_encoder(obs_shape={obs_shape!r}): obs_shape must be one env's "
            "image shape (height, width, channels) of positive ints, channels last, "
            "e.g. (84, 84, 4); for a grayscale (H, W) image add a channel axis "
            "(`obs[..., None]`) and pass (H, W, 1)."
        )
    return shape


def make_cnn_encoder(
    obs_shape: Sequence[int],
    *,
    key: PRNGKeyArray,
    kind: str | ConvSpec = "nature",
    out_size: int | None = None,
    activation: str | Callable[[Array], Array] = "relu",
    scale: float | None = None,
    kernel_init: Initializer | None = None,
) -> tuple[Sequential, int]:
    """A CNN encoder: `"VALID"` convolutions, `Flattener`, then one `Dense`.

    Maps one env's `[H, W, C]` image to `out_size` features, every layer
    followed by `activation`. The kinds are the standard Atari stacks:

    - `"nature"`: Nature DQN (Mnih et al. 2015): 32 8x8 stride 4, 64 4x4
      stride 2, 64 3x3 stride 1, Dense 512. Needs images of at least 36x36.
    - `"impala_small"`: the first DQN / IMPALA's shallow network: 16 8x8
      stride 4, 32 4x4 stride 2, Dense 256. Needs at least 20x20.
    - a custom tuple of `(out_channels, kernel_size, stride)`, e.g.
      `((16, 3, 1), (32, 3, 2))` for small images; Dense 256 by default.

    The image size is checked here, so a stack too deep for `obs_shape`
    fails at construction, not at the first rollout.

    **Arguments:**

    - `obs_shape`: one env's observation shape `(H, W, C)`, channels last.
    - `key`: PRNG key for the initialisers.
    - `kind`: `"nature"`, `"impala_small"` or a custom spec, as above.
    - `out_size`: features out; default 512 for `"nature"`, 256 otherwise.
    - `activation`: a name accepted by [`eqx_ppo.nn.get_activation`][] or a
      callable, applied after every layer, the final `Dense` included.
    - `scale`: if given, a [`eqx_ppo.nn.PixelScale`][] first layer casts the
      image to float and multiplies it by `scale` (`1 / 255` for `uint8`);
      finite and `> 0`.
    - `kernel_init`: the kernel initialiser of every layer; default
      LeCun-normal, as in [`eqx_ppo.nn.Conv2d`][] and [`eqx_ppo.nn.Dense`][].

    **Returns:** `(encoder, out_size)`: a [`eqx_ppo.nn.Sequential`][] of
    `[PixelScale] + Conv2d... + [Flattener, Dense]` (stateless, no key used)
    mapping `[H, W, C]` to `[out_size]`, and that `out_size`.

    ```python
    encoder, size = make_cnn_encoder((84, 84, 4), key=jax.random.key(0))
    out = encoder(encoder.initial_state(), jnp.zeros((84, 84, 4)))
    out.output.shape  # (512,)
    ```
    """
    height, width, channels = _check_obs_shape(obs_shape)
    stack, default_out = _spec(kind)
    out_size = default_out if out_size is None else out_size
    check_size("make_cnn_encoder(out_size=...)", out_size)
    if scale is not None:
        check_pixel_scale("make_cnn_encoder(scale=...)", scale)
    get_activation(activation)
    in_channels = []
    for i, (out_channels, kernel, stride) in enumerate(stack):
        new_height, new_width = (
            _output_size(size, kernel, stride, "VALID") for size in (height, width)
        )
        if new_height < 1 or new_width < 1:
            raise ValueError(
                f"make_cnn_encoder(obs_shape={tuple(obs_shape)!r}, kind={kind!r}): "
                f"the image is too small for this stack: conv layer {i} "
                f"({out_channels} {kernel}x{kernel} stride {stride}) gets a "
                f"{height}x{width} input and would output "
                f"{new_height}x{new_width}. Use "
                f"{_fitting_kind(stack, *obs_shape[:2])}, which fits a "
                f"{obs_shape[0]}x{obs_shape[1]} image, or larger observations."
            )
        in_channels.append(channels)
        height, width, channels = new_height, new_width, out_channels
    keys = jax.random.split(key, len(stack) + 1)
    layers: list[AbstractStatefulModule] = [] if scale is None else [PixelScale(scale)]
    for i, (out_channels, kernel, stride) in enumerate(stack):
        layers.append(
            Conv2d(
                in_channels[i],
                out_channels,
                kernel,
                stride=stride,
                activation=activation,
                kernel_init=kernel_init,
                key=keys[i],
            )
        )
    dense = Dense(
        height * width * channels,
        out_size,
        activation=activation,
        kernel_init=kernel_init,
        key=keys[-1],
    )
    return Sequential([*layers, Flattener(), dense]), out_size
