import ast

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from eqx_ppo import make_mlp_actor_critic
from eqx_ppo.nn._containers import Sequential
from eqx_ppo.nn._conv import Conv2d, PixelScale, make_cnn_encoder
from eqx_ppo.nn._dense import Dense
from eqx_ppo.nn._filters import trainable
from eqx_ppo.nn._utils import Flattener
from tests._helpers import assert_ulp_close


def _hand_conv(getkey, stride):
    conv = Conv2d(1, 1, 2, stride=stride, key=getkey())
    # Equinox's weight is [out, in, kh, kw]; the kernel is [[1, 2], [3, 4]].
    weight = jnp.array([[1.0, 2.0], [3.0, 4.0]])[None, None]
    bias = jnp.full((1, 1, 1), 0.5)
    return eqx.tree_at(lambda c: (c.conv.weight, c.conv.bias), conv, (weight, bias))


IMAGE = jnp.arange(1.0, 10.0).reshape(3, 3, 1)  # [[1, 2, 3], [4, 5, 6], [7, 8, 9]]


def test_hand_computed_stride_1(getkey):
    out = _hand_conv(getkey, stride=1)((), IMAGE)
    # Each output is kernel . window:
    # top-left    1*1 + 2*2 + 3*4 + 4*5 = 37   top-right    1*2 + 2*3 + 3*5 + 4*6 = 47
    # bottom-left 1*4 + 2*5 + 3*7 + 4*8 = 67   bottom-right 1*5 + 2*6 + 3*8 + 4*9 = 77
    expected = jnp.array([[37.0, 47.0], [67.0, 77.0]])[..., None] + 0.5
    np.testing.assert_array_equal(out.output, expected)
    assert out.next_state == ()
    assert out.metrics == {}
    assert out.extras is None
    assert out.regularization_loss == 0.0


def test_hand_computed_stride_2(getkey):
    out = _hand_conv(getkey, stride=2)((), IMAGE)
    # Only the top-left window fits: 37 + 0.5.
    np.testing.assert_array_equal(out.output, jnp.full((1, 1, 1), 37.5))


@pytest.mark.parametrize(
    "stride, padding, lax_padding",
    [(1, "VALID", "VALID"), (2, "SAME", "SAME"), ((2, 1), 1, [(1, 1), (1, 1)])],
)
def test_equals_lax_conv_nhwc(getkey, stride, padding, lax_padding):
    conv = Conv2d(3, 5, (3, 2), stride=stride, padding=padding, key=getkey())
    conv = eqx.tree_at(
        lambda c: c.conv.bias, conv, jax.random.normal(getkey(), (5, 1, 1))
    )
    x = jax.random.normal(getkey(), (7, 9, 3))
    strides = stride if isinstance(stride, tuple) else (stride, stride)
    kernel_hwio = jnp.transpose(conv.conv.weight, (2, 3, 1, 0))
    expected = (
        jax.lax.conv_general_dilated(
            x[None],
            kernel_hwio,
            strides,
            lax_padding,
            dimension_numbers=("NHWC", "HWIO", "NHWC"),
        )[0]
        + conv.conv.bias[:, 0, 0]
    )
    out = conv((), x).output
    assert out.shape == expected.shape == (*conv.output_shape(7, 9),)
    assert_ulp_close(out, expected)


@pytest.fixture(scope="module")
def small_encoder():
    """A custom two-conv stack; the tests share it, as building costs compiles."""
    encoder, size = make_cnn_encoder(
        (12, 12, 3), kind=((4, 3, 2), (8, 3, 1)), out_size=16, key=jax.random.key(0)
    )
    assert size == 16
    return encoder


def _abstract_encoder(obs_shape, **kwargs):
    """`make_cnn_encoder` traced abstractly: the structure, with no init run."""
    return eqx.filter_eval_shape(
        make_cnn_encoder, obs_shape, key=jax.random.key(0), **kwargs
    )


def test_init_layout_and_activation(getkey, small_encoder):
    conv = small_encoder[1]  # Conv2d(4, 8, 3, activation="relu")
    assert (conv.in_channels, conv.out_channels) == (4, 8)
    assert conv.conv.weight.shape == (8, 4, 3, 3)
    np.testing.assert_array_equal(conv.conv.bias, jnp.zeros((8, 1, 1)))
    # LeCun normal: variance 1 / fan_in, fan_in = 3 * 3 * 4 = 36.
    assert 0.5 / 36 < float(jnp.var(conv.conv.weight)) < 1.5 / 36
    out = conv((), jax.random.normal(getkey(), (5, 5, 4))).output
    assert out.shape == (3, 3, 8) and bool((out >= 0).all())
    assert Conv2d(4, 8, 3, use_bias=False, key=getkey()).conv.bias is None


def test_integer_pixels_and_scale(getkey, small_encoder):
    scaled = Sequential([PixelScale(1 / 255), *small_encoder.layers])
    pixels = jax.random.randint(getkey(), (12, 12, 3), 0, 256).astype(jnp.uint8)
    floats = pixels.astype(jnp.float32) * (1 / 255)
    assert_ulp_close(
        scaled(scaled.initial_state(), pixels).output,
        small_encoder(small_encoder.initial_state(), floats).output,
    )
    conv = small_encoder[0]
    assert_ulp_close(
        conv((), pixels).output, conv((), pixels.astype(jnp.float32)).output
    )
    encoder, _ = _abstract_encoder((84, 84, 4), scale=1 / 255)
    assert isinstance(encoder[0], PixelScale) and encoder[0].factor == 1 / 255
    assert isinstance(encoder[1], Conv2d) and len(encoder) == 6


@pytest.mark.parametrize(
    "obs_shape, kind, flat, out_size",
    [
        ((84, 84, 4), "nature", 7 * 7 * 64, 512),  # 84 -> 20 -> 9 -> 7
        ((64, 64, 3), "nature", 4 * 4 * 64, 512),  # 64 -> 15 -> 6 -> 4
        ((84, 84, 4), "impala_small", 9 * 9 * 32, 256),  # 84 -> 20 -> 9
        ((64, 64, 3), "impala_small", 6 * 6 * 32, 256),  # 64 -> 15 -> 6
        ((10, 10, 2), ((8, 3, 1), (16, 3, 2)), 3 * 3 * 16, 256),  # 10 -> 8 -> 3
    ],
)
def test_encoder_shapes(obs_shape, kind, flat, out_size):
    encoder, size = _abstract_encoder(obs_shape, kind=kind)
    assert size == out_size
    assert all(isinstance(layer, Conv2d) for layer in encoder.layers[:-2])
    assert isinstance(encoder[-2], Flattener) and isinstance(encoder[-1], Dense)
    assert encoder[-1].in_size == flat and encoder[-1].out_size == out_size
    out = eqx.filter_eval_shape(
        lambda net, x: net(net.initial_state(), x).output,
        encoder,
        jax.ShapeDtypeStruct(obs_shape, jnp.float32),
    )
    assert out.shape == (out_size,) and out.dtype == jnp.float32
    assert _abstract_encoder(obs_shape, kind=kind, out_size=32)[1] == 32


def test_vmap_over_envs_equals_loop(getkey, small_encoder):
    obs = jax.random.normal(getkey(), (4, 12, 12, 3))
    state = small_encoder.initialize_state(4)
    batched = eqx.filter_jit(jax.vmap(lambda s, x: small_encoder(s, x).output))(
        state, obs
    )
    looped = jnp.stack(
        [small_encoder(small_encoder.initial_state(), x).output for x in obs]
    )
    assert_ulp_close(batched, looped)


def test_jit_compiles_once(getkey, small_encoder):
    @eqx.filter_jit
    @eqx.debug.assert_max_traces(max_traces=1)
    def f(net, x):
        return net(net.initial_state(), x).output

    f(small_encoder, jax.random.normal(getkey(), (12, 12, 3)))
    f(small_encoder, jax.random.normal(getkey(), (12, 12, 3)))


def test_grads_finite_for_every_kernel(getkey, small_encoder):
    x = jax.random.normal(getkey(), (12, 12, 3))

    @eqx.filter_jit
    @eqx.filter_grad
    def grad(net):
        return jnp.sum(net(net.initial_state(), x).output ** 2)

    grads = grad(small_encoder)
    kernels = [g.conv.weight for g in grads.layers[:-2]] + [grads[-1].kernel]
    assert len(kernels) == 3
    for kernel in kernels:
        assert bool(jnp.isfinite(kernel).all()) and bool((kernel != 0).any())
    params = eqx.filter(small_encoder, trainable(small_encoder))
    assert len(jax.tree.leaves(params)) == 6  # two convs and a Dense, with biases


def test_replay_equals_loop(getkey, small_encoder):
    n_steps, n_envs = 4, 2
    xs = jax.random.normal(getkey(), (n_steps, n_envs, 12, 12, 3))
    state0 = small_encoder.initialize_state(n_envs)
    done = jnp.zeros((n_steps, n_envs), bool)
    replay = eqx.filter_jit(small_encoder.replay)(state0, xs, None, None, done)
    looped = jax.vmap(
        jax.vmap(lambda x: small_encoder(small_encoder.initial_state(), x).output)
    )(xs)
    assert_ulp_close(replay.output, looped)
    assert replay.regularization_loss.shape == (n_steps, n_envs)
    assert replay.last_state == state0


@pytest.mark.parametrize(
    "obs_shape, kind, suggested",
    [
        ((32, 32, 3), "nature", "kind='impala_small'"),
        ((16, 16, 3), "impala_small", "kind=((16, 3, 1), (32, 3, 2))"),
        ((4, 4, 3), ((16, 3, 1), (32, 3, 2)), "kind=((16, 3, 1),)"),
        ((2, 5, 1), "nature", "kind=((16, 2, 1),)"),
    ],
)
def test_obs_shape_too_small_suggests_a_kind_that_fits(
    getkey, obs_shape, kind, suggested
):
    with pytest.raises(ValueError, match=r"too small") as error:
        make_cnn_encoder(obs_shape, kind=kind, key=getkey())
    message = str(error.value)
    assert f"obs_shape={obs_shape!r}" in message
    assert f"Use {suggested}, which fits a {obs_shape[0]}x{obs_shape[1]} image" in (
        message
    )
    fitting = ast.literal_eval(suggested.removeprefix("kind="))
    _abstract_encoder(obs_shape, kind=fitting)


def test_the_smallest_image_that_fits():
    _abstract_encoder((36, 36, 1), kind="nature")


@pytest.mark.parametrize("obs_shape", [(84, 84), (4, 84, 84, 4)])
def test_obs_shape_is_one_envs_image(getkey, obs_shape):
    # The declared `(height, width, channels)` refuses other ranks (the suite
    # checks annotations at run time).
    with pytest.raises(TypeError, match="obs_shape"):
        make_cnn_encoder(obs_shape, key=getkey())


def test_an_unknown_kind_is_refused_by_its_declared_names(getkey):
    with pytest.raises(TypeError, match="kind"):
        make_cnn_encoder((84, 84, 4), kind="resnet", key=getkey())


def test_every_layer_of_a_stack_is_checked(getkey):
    # beartype checks one random item of a tuple per call; a stack is checked
    # whole, so the bad layer is refused wherever it sits.
    for i in range(3):
        stack = [(16, 3, 1)] * 3
        stack[i] = (16, "3", 1)
        with pytest.raises(TypeError, match="kind"):
            make_cnn_encoder((84, 84, 4), kind=tuple(stack), key=getkey())
        with pytest.raises(TypeError, match="encoder"):
            make_mlp_actor_critic(
                (84, 84, 4), 2, [8], [8], encoder=tuple(stack), key=getkey()
            )


def test_wrong_input_at_call_time(getkey):
    conv = Conv2d(3, 4, 3, key=getkey())
    message = r"Conv2d\(in_channels=3\)` got input of shape \(64, 64, 1\).*\[H, W, C\]"
    with pytest.raises(ValueError, match=message):
        conv((), jnp.zeros((64, 64, 1)))
    with pytest.raises(ValueError, match=r"shape \(2, 64, 64, 3\).*apply_batched"):
        conv((), jnp.zeros((2, 64, 64, 3)))
    with pytest.raises(ValueError, match=r"shape \(64, 64\).*obs\[\.\.\., None\]"):
        jax.jit(lambda x: conv((), x).output)(jnp.zeros((64, 64)))


@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan"), float("inf")])
def test_pixel_scale_must_be_finite_and_positive(getkey, scale):
    message = rf"PixelScale\(factor={scale}\): must be finite and > 0\. Fix:"
    with pytest.raises(ValueError, match=message):
        PixelScale(scale)
    with pytest.raises(ValueError, match=message):
        make_cnn_encoder((12, 12, 3), kind=((4, 3, 2),), scale=scale, key=getkey())
