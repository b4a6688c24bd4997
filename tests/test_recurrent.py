import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from eqx_ppo.nn import GRU, LSTM, trainable
from eqx_ppo.nn._module import reset_where
from tests._helpers import assert_ulp_close, rtol

normal_init = jax.nn.initializers.normal(0.5)


def _sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def _numpy_lstm(lstm, xs, h, c):
    """Slow reference: the LSTM equations gate by gate, float64."""
    kernel, recurrent, bias = (
        np.asarray(a, np.float64)
        for a in (lstm.kernel, lstm.recurrent_kernel, lstm.bias)
    )
    n = lstm.hidden_size
    h, c = np.asarray(h, np.float64), np.asarray(c, np.float64)
    outs = []
    for x in np.asarray(xs, np.float64):
        pre = {}
        for g, name in enumerate("ifgo"):
            cols = slice(g * n, (g + 1) * n)
            pre[name] = x @ kernel[:, cols] + h @ recurrent[:, cols] + bias[cols]
        c = _sigmoid(pre["f"]) * c + _sigmoid(pre["i"]) * np.tanh(pre["g"])
        h = _sigmoid(pre["o"]) * np.tanh(c)
        outs.append(h)
    return np.stack(outs), h, c


def _numpy_gru(gru, xs, h):
    """Slow reference: the GRU equations gate by gate, float64."""
    kernel, recurrent, bias, rbias = (
        np.asarray(a, np.float64)
        for a in (gru.kernel, gru.recurrent_kernel, gru.bias, gru.recurrent_bias)
    )
    n = gru.hidden_size
    h = np.asarray(h, np.float64)
    outs = []
    for x in np.asarray(xs, np.float64):
        blk = [slice(g * n, (g + 1) * n) for g in range(3)]
        r = _sigmoid(x @ kernel[:, blk[0]] + bias[blk[0]] + h @ recurrent[:, blk[0]])
        z = _sigmoid(x @ kernel[:, blk[1]] + bias[blk[1]] + h @ recurrent[:, blk[1]])
        cand = np.tanh(
            x @ kernel[:, blk[2]]
            + bias[blk[2]]
            + r * (h @ recurrent[:, blk[2]] + rbias)
        )
        h = (1.0 - z) * cand + z * h
        outs.append(h)
    return np.stack(outs), h


def _run(module, state, xs):
    outs = []
    for x in xs:
        out = module(state, x)
        state = out.next_state
        outs.append(out.output)
    return jnp.stack(outs), state


def test_lstm_matches_numpy_reference(getkey):
    lstm = LSTM(3, 4, bias_init=normal_init, key=getkey())
    xs = jax.random.normal(getkey(), (5, 3))
    h0, c0 = jax.random.normal(getkey(), (2, 4))
    outs, (h, c) = _run(lstm, (h0, c0), xs)
    ref_outs, ref_h, ref_c = _numpy_lstm(lstm, xs, h0, c0)
    np.testing.assert_allclose(outs, ref_outs, rtol=rtol(1e-5), atol=1e-6)
    np.testing.assert_allclose(h, ref_h, rtol=rtol(1e-5), atol=1e-6)
    np.testing.assert_allclose(c, ref_c, rtol=rtol(1e-5), atol=1e-6)


def test_gru_matches_numpy_reference(getkey):
    gru = GRU(3, 4, bias_init=normal_init, key=getkey())
    xs = jax.random.normal(getkey(), (5, 3))
    h0 = jax.random.normal(getkey(), (4,))
    outs, h = _run(gru, h0, xs)
    ref_outs, ref_h = _numpy_gru(gru, xs, h0)
    np.testing.assert_allclose(outs, ref_outs, rtol=rtol(1e-5), atol=1e-6)
    np.testing.assert_allclose(h, ref_h, rtol=rtol(1e-5), atol=1e-6)


def _zero_lstm(getkey, bias=(0.0, 0.0, 0.0, 0.0)):
    zeros = jax.nn.initializers.zeros
    lstm = LSTM(1, 1, kernel_init=zeros, recurrent_init=zeros, key=getkey())
    return eqx.tree_at(lambda m: m.bias, lstm, jnp.array(bias))


def test_lstm_carry_is_h_then_c(getkey):
    lstm = _zero_lstm(getkey)
    out = lstm((jnp.array([0.3]), jnp.array([2.0])), jnp.array([1.0]))
    # All gates see 0: i = f = o = 0.5, g = tanh(0) = 0.
    # c' = 0.5 * 2 + 0.5 * 0 = 1;  h' = 0.5 * tanh(1).
    h, c = out.next_state
    np.testing.assert_allclose(c, [1.0])
    np.testing.assert_allclose(h, [0.5 * np.tanh(1.0)], rtol=rtol(1e-6))
    np.testing.assert_array_equal(out.output, h)


def test_lstm_gate_order_is_ifgo(getkey):
    # Bias blocks [i, f, g, o]: input gate shut, forget gate open, output open.
    lstm = _zero_lstm(getkey, bias=(-100.0, 100.0, 5.0, 100.0))
    out = lstm((jnp.array([0.0]), jnp.array([2.0])), jnp.array([1.0]))
    # c' = 1 * 2 + 0 * tanh(5) = 2;  h' = 1 * tanh(2).
    np.testing.assert_allclose(out.next_state[1], [2.0])
    np.testing.assert_allclose(out.output, [np.tanh(2.0)], rtol=rtol(1e-6))


def test_gru_gate_order_is_rzn(getkey):
    zeros = jax.nn.initializers.zeros
    gru = GRU(1, 1, kernel_init=zeros, recurrent_init=zeros, key=getkey())
    # Bias blocks [r, z, n]: z = sigmoid(0) = 0.5, n = tanh(1 + r * 0) = tanh(1).
    gru = eqx.tree_at(lambda m: m.bias, gru, jnp.array([3.0, 0.0, 1.0]))
    out = gru(jnp.array([0.4]), jnp.array([1.0]))
    # h' = 0.5 * tanh(1) + 0.5 * 0.4.
    np.testing.assert_allclose(out.output, [0.5 * np.tanh(1.0) + 0.2], rtol=rtol(1e-6))
    # r multiplies only the recurrent candidate term h U_n + recurrent_bias.
    gru = eqx.tree_at(lambda m: m.recurrent_bias, gru, jnp.array([2.0]))
    gru = eqx.tree_at(lambda m: m.bias, gru, jnp.array([-100.0, 0.0, 1.0]))
    out = gru(jnp.array([0.4]), jnp.array([1.0]))
    np.testing.assert_allclose(out.output, [0.5 * np.tanh(1.0) + 0.2], rtol=rtol(1e-6))


@pytest.mark.parametrize("cls, n_gates", [(LSTM, 4), (GRU, 3)])
def test_default_init(getkey, cls, n_gates):
    layer = cls(3, 4, key=getkey())
    assert layer.kernel.shape == (3, 4 * n_gates)
    assert layer.recurrent_kernel.shape == (4, 4 * n_gates)
    np.testing.assert_array_equal(layer.bias, np.zeros(4 * n_gates))
    for g in range(n_gates):
        block = layer.recurrent_kernel[:, 4 * g : 4 * (g + 1)]
        np.testing.assert_allclose(block.T @ block, np.eye(4), atol=1e-5)
    zeros = jnp.zeros(4)
    if cls is LSTM:
        assert layer.initial_h is None and layer.initial_c is None
        h0, c0 = layer.initial_state()
        np.testing.assert_array_equal(h0, zeros)
        np.testing.assert_array_equal(c0, zeros)
    else:
        assert layer.initial_h is None
        np.testing.assert_array_equal(layer.initial_state(), zeros)


def test_gate_and_activation_functions_are_configurable(getkey):
    lstm = _zero_lstm(getkey)
    relu_lstm = LSTM(
        1,
        1,
        gate_fn=lambda v: jnp.full_like(v, 1.0),
        activation_fn="identity",
        kernel_init=jax.nn.initializers.ones,
        recurrent_init=jax.nn.initializers.zeros,
        key=getkey(),
    )
    out = relu_lstm((jnp.array([0.0]), jnp.array([2.0])), jnp.array([3.0]))
    # gates = 1, g = 3: c' = 2 + 3 = 5, h' = 5.
    np.testing.assert_allclose(out.next_state[1], [5.0])
    np.testing.assert_allclose(out.output, [5.0])
    assert lstm.gate_fn is jax.nn.sigmoid


@pytest.mark.parametrize("cls", [LSTM, GRU])
def test_scan_equals_loop(getkey, cls):
    layer = cls(2, 3, bias_init=normal_init, key=getkey())
    xs = jax.random.normal(getkey(), (6, 2))

    def step(state, x):
        out = layer(state, x)
        return out.next_state, out.output

    final, scanned = jax.lax.scan(step, layer.initial_state(), xs)
    loop, loop_final = _run(layer, layer.initial_state(), xs)
    # A compiled scan and an eager loop are two programs: equal up to rounding.
    assert_ulp_close(scanned, loop)
    assert_ulp_close(final, loop_final)


@pytest.mark.parametrize("cls", [LSTM, GRU])
@pytest.mark.parametrize("trainable_initial_state", [False, True])
def test_reset_per_env_under_vmap(getkey, cls, trainable_initial_state):
    layer = cls(2, 3, trainable_initial_state=trainable_initial_state, key=getkey())
    if trainable_initial_state:
        new_h0 = jax.random.normal(getkey(), (3,))
        layer = eqx.tree_at(lambda m: m.initial_h, layer, new_h0)
    n_envs, n_steps = 3, 4
    xs = jax.random.normal(getkey(), (n_steps, n_envs, 2))
    # Env 1 ends its episode after step 1; the others never do.
    dones = jnp.zeros((n_steps, n_envs), bool).at[1, 1].set(True)

    def step(state, inputs):
        x, done = inputs
        out = jax.vmap(layer)(state, x)
        state = jax.vmap(lambda d, s: reset_where(layer, d, s))(done, out.next_state)
        return state, out.output

    _, outs = jax.lax.scan(step, layer.initialize_state(n_envs), (xs, dones))
    for env in range(n_envs):
        if env == 1:
            first, _ = _run(layer, layer.initial_state(), xs[:2, env])
            second, _ = _run(layer, layer.initial_state(), xs[2:, env])
            expected = jnp.concatenate([first, second])
        else:
            expected, _ = _run(layer, layer.initial_state(), xs[:, env])
        np.testing.assert_allclose(outs[:, env], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cls", [LSTM, GRU])
def test_trainable_initial_state_gets_gradient_through_reset(getkey, cls):
    layer = cls(2, 3, trainable_initial_state=True, key=getkey())
    spec = trainable(layer)
    assert spec.initial_h is True
    garbage = jax.tree.map(lambda s: jnp.full_like(s, 7.0), layer.initial_state())
    xs = jax.random.normal(getkey(), (3, 2))

    def loss(model_and_carry):
        model, carry = model_and_carry
        # The episode starts at t=0, so the replay resets the stale carry.
        carry = reset_where(model, jnp.array(True), carry)
        total = jnp.zeros(())
        for x in xs:
            out = model(carry, x)
            carry = out.next_state
            total = total + jnp.sum(out.output)
        return total

    grads, carry_grads = eqx.filter_grad(loss)((layer, garbage))
    assert np.all(np.abs(np.asarray(grads.initial_h)) > 0)
    if cls is LSTM:
        assert np.all(np.abs(np.asarray(grads.initial_c)) > 0)
    for leaf in jax.tree.leaves(carry_grads):
        np.testing.assert_array_equal(leaf, np.zeros_like(leaf))
    # A learned initial state is what the layer starts from.
    moved = eqx.tree_at(lambda m: m.initial_h, layer, jnp.ones(3))
    np.testing.assert_array_equal(
        jax.tree.leaves(moved.initial_state())[0], jnp.ones(3)
    )


@pytest.mark.parametrize("cls", [LSTM, GRU])
def test_jit_grad_and_compiles_once(getkey, cls):
    layer = cls(2, 3, key=getkey())

    @eqx.filter_jit
    @eqx.debug.assert_max_traces(max_traces=1)
    def unroll(model, xs):
        def step(state, x):
            out = model(state, x)
            return out.next_state, out.output

        return jax.lax.scan(step, model.initial_state(), xs)[1]

    for _ in range(3):
        unroll(layer, jax.random.normal(getkey(), (4, 2)))
    unroll(cls(2, 3, key=getkey()), jax.random.normal(getkey(), (4, 2)))

    xs = jax.random.normal(getkey(), (4, 2))
    grads = eqx.filter_grad(lambda m: jnp.sum(unroll(m, xs)))(layer)
    assert np.any(np.asarray(grads.recurrent_kernel) != 0)
    assert np.all(np.isfinite(np.asarray(grads.kernel)))


def test_bad_arguments_and_inputs(getkey):
    # The declared types refuse a non-int size (the suite checks them at run
    # time); the layer names an input that is not one env's.
    with pytest.raises(TypeError, match="in_size"):
        GRU(2.5, 3, key=getkey())
    with pytest.raises(TypeError, match="gate_fn"):
        LSTM(2, 3, gate_fn="sigmod", key=getkey())


def test_an_input_that_is_not_one_envs_is_named(unchecked, getkey):
    for layer in (LSTM(2, 3, key=getkey()), GRU(2, 3, key=getkey())):
        name = type(layer).__name__
        with pytest.raises(
            ValueError, match=rf"{name} expects one env's input of shape \(2,\)"
        ):
            layer(layer.initial_state(), jnp.ones(5))
        with pytest.raises(ValueError, match=r"\(4, 2\)\. Layers work on a single"):
            layer(layer.initial_state(), jnp.ones((4, 2)))
