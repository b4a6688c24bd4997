import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from eqx_ppo.nn import Dense, trainable
from eqx_ppo.nn._dense import get_activation
from tests._helpers import assert_ulp_close


def _hand_dense(getkey, activation=None):
    layer = Dense(2, 3, activation=activation, key=getkey())
    kernel = jnp.array([[1.0, -2.0, 0.5], [3.0, 0.0, -1.0]])
    bias = jnp.array([0.5, 1.0, -1.0])
    return eqx.tree_at(lambda d: (d.kernel, d.bias), layer, (kernel, bias))


def test_exact_output(getkey):
    layer = _hand_dense(getkey)
    out = layer((), jnp.array([1.0, 2.0]))
    # x @ kernel = [1*1 + 2*3, 1*-2 + 2*0, 1*0.5 + 2*-1] = [7, -2, -1.5]; + bias
    np.testing.assert_allclose(out.output, [7.5, -1.0, -2.5])
    assert out.next_state == ()
    assert out.metrics == {}
    assert out.extras is None
    assert out.regularization_loss.shape == ()
    assert out.regularization_loss.dtype == jnp.float32
    assert out.regularization_loss == 0.0


def test_activation_by_name(getkey):
    layer = _hand_dense(getkey, activation="relu")
    out = layer((), jnp.array([1.0, 2.0]))
    np.testing.assert_allclose(out.output, [7.5, 0.0, 0.0])


def test_activation_callable(getkey):
    layer = _hand_dense(getkey, activation=lambda y: 2.0 * y)
    out = layer((), jnp.array([1.0, 2.0]))
    np.testing.assert_allclose(out.output, [15.0, -2.0, -5.0])


@pytest.mark.parametrize(
    "name, fn",
    [
        ("relu", jax.nn.relu),
        ("tanh", jnp.tanh),
        ("swish", jax.nn.swish),
        ("silu", jax.nn.swish),
        ("gelu", jax.nn.gelu),
        ("sigmoid", jax.nn.sigmoid),
        ("elu", jax.nn.elu),
        ("identity", lambda y: y),
    ],
)
def test_get_activation_names(name, fn):
    y = jnp.linspace(-3.0, 3.0, 7)
    np.testing.assert_allclose(get_activation(name)(y), fn(y))


def test_get_activation_none_and_callable():
    y = jnp.array([-1.0, 2.0])
    np.testing.assert_array_equal(get_activation(None)(y), y)
    assert get_activation(jnp.sin) is jnp.sin


def test_activation_names_are_declared():
    # The suite checks annotations at run time: an unknown name is refused with
    # the declared names listed.
    with pytest.raises(TypeError, match="'relu'.*'tanh'"):
        Dense(2, 3, activation="rellu", key=jax.random.key(0))
    with pytest.raises(TypeError, match="activation"):
        get_activation(3)


def test_default_init_is_lecun_normal_and_zero_bias(getkey):
    in_size, out_size = 400, 50
    layer = Dense(in_size, out_size, key=getkey())
    assert layer.kernel.shape == (in_size, out_size)
    assert layer.kernel.dtype == jnp.float32
    np.testing.assert_array_equal(layer.bias, np.zeros(out_size))
    w = np.asarray(layer.kernel)
    # Variance 1/in_size; truncation at two (pre-rescaling) stddevs bounds |w|.
    np.testing.assert_allclose(w.var(), 1.0 / in_size, rtol=0.05)
    assert abs(w.mean()) < 0.01
    assert np.abs(w).max() <= 2.0 * np.sqrt(1.0 / in_size) / 0.87962566 + 1e-6
    # Same key => same parameters, the flax initialiser with the same key split.
    key = getkey()
    a, b = Dense(3, 2, key=key), Dense(3, 2, key=key)
    np.testing.assert_array_equal(a.kernel, b.kernel)
    expected = jax.nn.initializers.lecun_normal()(
        jax.random.split(key)[0], (3, 2), jnp.float32
    )
    np.testing.assert_array_equal(a.kernel, expected)


def test_custom_initialisers_and_no_bias(getkey):
    layer = Dense(
        3,
        2,
        kernel_init=jax.nn.initializers.constant(0.5),
        bias_init=jax.nn.initializers.ones,
        key=getkey(),
    )
    np.testing.assert_array_equal(layer.kernel, np.full((3, 2), 0.5))
    np.testing.assert_array_equal(layer.bias, np.ones(2))
    out = layer((), jnp.array([1.0, 2.0, 3.0]))
    np.testing.assert_allclose(out.output, [4.0, 4.0])  # 0.5*6 + 1

    no_bias = Dense(3, 2, use_bias=False, key=getkey())
    assert no_bias.bias is None
    x = jnp.array([1.0, 2.0, 3.0])
    np.testing.assert_allclose(no_bias((), x).output, x @ no_bias.kernel)


def test_variance_scaling_uses_fan_in(getkey):
    # Kernel stored [in, out] so fan_in really is in_size.
    init = jax.nn.initializers.variance_scaling(1.0, "fan_in", "uniform")
    layer = Dense(300, 2, kernel_init=init, key=getkey())
    limit = np.sqrt(3.0 / 300)
    assert np.abs(np.asarray(layer.kernel)).max() <= limit
    assert np.abs(np.asarray(layer.kernel)).max() > 0.9 * limit


def test_bad_constructor_arguments(getkey):
    with pytest.raises(TypeError, match="out_size"):
        Dense(2, 3.0, key=getkey())
    with pytest.raises(TypeError, match="key"):
        Dense(2, 3, key=jax.random.PRNGKey(0))  # raw key data: not a typed key


def test_bad_input_shape(unchecked, getkey):
    layer = Dense(2, 3, key=getkey())
    with pytest.raises(ValueError, match=r"shape \(4, 2\)\. Layers work on a single"):
        layer((), jnp.ones((4, 2)))
    with pytest.raises(ValueError, match=r"shape \(2,\), got shape \(3,\)"):
        layer((), jnp.ones(3))


def test_transforms(getkey):
    layer = Dense(2, 3, activation="tanh", key=getkey())
    xs = jax.random.normal(getkey(), (5, 2))
    loop = jnp.stack([layer((), x).output for x in xs])

    # Batched, compiled and scanned programs may round differently from eager.
    jitted = eqx.filter_jit(lambda m, x: m((), x).output)
    assert_ulp_close(jax.vmap(lambda x: jitted(layer, x))(xs), loop)
    assert_ulp_close(jax.jit(lambda x: layer((), x).output)(xs[0]), loop[0])

    def step(carry, x):
        out = layer(carry, x)
        return out.next_state, out.output

    _, scanned = jax.lax.scan(step, (), xs)
    assert_ulp_close(scanned, loop)

    def loss(model):
        return jnp.sum(jax.vmap(lambda x: model((), x).output)(xs))

    grads = eqx.filter_grad(loss)(layer)
    # d/dbias sum(tanh(xW+b)) = sum over samples of 1 - tanh^2.
    np.testing.assert_allclose(grads.bias, jnp.sum(1 - loop**2, axis=0), rtol=1e-5)
    assert jax.tree.all(trainable(layer))


def test_compiles_once(getkey):
    layer = Dense(2, 3, key=getkey())

    @eqx.filter_jit
    @eqx.debug.assert_max_traces(max_traces=1)
    def call(model, x):
        return model((), x).output

    for i in range(3):
        call(layer, jnp.full(2, float(i), jnp.float32))
    # New parameter values with the same structure reuse the compilation.
    call(Dense(2, 3, key=getkey()), jnp.ones(2))
