import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from eqx_ppo.nn import AR1VariationalBottleneck, VariationalBottleneck, apply_batched
from eqx_ppo.nn._module import reset_where
from tests._helpers import assert_ulp_close, rtol

KEY = jax.random.key(0)


def _inverse_softplus(y):
    return float(np.log(np.expm1(y)))


def _fixed(layer, mu, std_pre):
    """Make the projection ignore its input: `(mu, pre_std)` come from the bias."""
    return eqx.tree_at(
        lambda m: (m.head.kernel, m.head.bias),
        layer,
        (jnp.zeros_like(layer.head.kernel), jnp.array([*mu, *std_pre], jnp.float32)),
    )


def _plain(ar1):
    """The VariationalBottleneck with the same projection and KL weight."""
    plain = VariationalBottleneck(
        ar1.head.in_size, ar1.head.latent_size, kl_weight=ar1.kl_weight, key=KEY
    )
    return eqx.tree_at(lambda m: m.head, plain, ar1.head)


def test_kl_exact_on_hand_values(getkey):
    layer = VariationalBottleneck(3, 2, kl_weight=0.5, min_std=1e-6, key=getkey())
    # mu = [1, 0]; softplus(pre_std) = [1, 2], so std = [1, 2] + 1e-6.
    layer = _fixed(layer, [1.0, 0.0], [_inverse_softplus(1.0), _inverse_softplus(2.0)])
    out = layer((), jnp.ones(3), key=getkey())
    # KL = 0.5 * [(1 + 1 - 0 - 1) + (0 + 4 - 2 log 2 - 1)] = 0.5 + 1.5 - log 2.
    kl = 2.0 - np.log(2.0)
    np.testing.assert_allclose(out.metrics["kl"], kl, rtol=rtol(1e-5))
    np.testing.assert_allclose(out.regularization_loss, 0.5 * kl, rtol=rtol(1e-5))
    np.testing.assert_allclose(out.metrics["mu"], [1.0, 0.0])
    np.testing.assert_allclose(out.metrics["sigma"], [1.0, 2.0], rtol=rtol(1e-5))
    assert out.regularization_loss.shape == () and out.next_state == ()
    assert out.extras is None


def test_kl_zero_at_prior_and_sample_is_reparameterised(getkey):
    layer = VariationalBottleneck(2, 3, min_std=1e-6, key=getkey())
    layer = _fixed(layer, [0.0, 1.0, -2.0], [_inverse_softplus(1.0 - 1e-6)] * 3)
    key = getkey()
    out = layer((), jnp.zeros(2), key=key)
    np.testing.assert_allclose(out.metrics["kl"] - 2.5, 0.0, atol=1e-5)  # mu^2/2
    eps = jax.random.normal(key, (3,))
    np.testing.assert_allclose(
        out.output, jnp.array([0.0, 1.0, -2.0]) + eps, rtol=rtol(1e-5)
    )


def test_replay_with_same_key_is_bit_identical(getkey):
    layer = VariationalBottleneck(4, 3, key=getkey())
    x = jax.random.normal(getkey(), (4,))
    key = getkey()
    first = layer((), x, key=key)
    again = layer((), x, key=key)
    call = eqx.filter_jit(lambda m, x, k: m((), x, key=k).output)
    np.testing.assert_array_equal(first.output, again.output)
    np.testing.assert_array_equal(call(layer, x, key), call(layer, x, key))
    # Eager and compiled code may round differently in the last bits.
    assert_ulp_close(first.output, call(layer, x, key))
    assert not np.array_equal(first.output, layer((), x, key=getkey()).output)
    # Batched: apply_batched splits the key per env exactly like per-env calls.
    xs = jax.random.normal(getkey(), (5, 4))
    batched = apply_batched(layer, layer.initialize_state(5), xs, key=key)
    keys = jax.random.split(key, 5)
    for i in range(5):
        assert_ulp_close(batched.output[i], layer((), xs[i], key=keys[i]).output)


def test_inference_mode_returns_mu(getkey):
    layer = VariationalBottleneck(2, 2, key=getkey())
    det = eqx.nn.inference_mode(layer)
    assert det.inference and not layer.inference
    x = jnp.array([0.5, -1.0])
    out = det((), x)  # no key needed
    np.testing.assert_array_equal(out.output, out.metrics["mu"])
    ar1 = eqx.nn.inference_mode(AR1VariationalBottleneck(2, 2, key=getkey()))
    out = ar1(ar1.initial_state(), x)
    np.testing.assert_array_equal(out.output, out.metrics["mu"])


def _fixed_ar1(getkey, mu, ar1_weight, backprop_through_time=False):
    layer = AR1VariationalBottleneck(
        2,
        len(mu),
        kl_weight=0.0,
        min_std=1e-6,
        ar1_weight=ar1_weight,
        backprop_through_time=backprop_through_time,
        key=getkey(),
    )
    # pre_std = -30: softplus ~ 1e-13, so z = mu + 1e-6 * eps ~= mu.
    return _fixed(layer, mu, [-30.0] * len(mu))


def test_ar1_penalty_exact_on_hand_values(getkey):
    layer = _fixed_ar1(getkey, [2.0, 0.0], ar1_weight=0.2)
    state = {"prev": jnp.array([1.0, 2.0]), "valid": jnp.array(True)}
    out = layer(state, jnp.ones(2), key=getkey())
    # l2_diff = mean([(2 - 1)^2, (0 - 2)^2]) = 2.5; loss = 0.2 * 2.5 (KL weight 0).
    np.testing.assert_allclose(out.metrics["l2_diff"], 2.5, rtol=1e-5)
    np.testing.assert_allclose(out.regularization_loss, 0.5, rtol=1e-5)
    np.testing.assert_array_equal(out.next_state["prev"], out.output)
    assert out.next_state["valid"]
    assert set(out.metrics) == {"mu", "sigma", "kl", "l2_diff"}


def test_ar1_total_loss_adds_kl(getkey):
    layer = AR1VariationalBottleneck(3, 2, kl_weight=0.3, ar1_weight=0.7, key=getkey())
    state = {"prev": jnp.array([0.5, -0.5]), "valid": jnp.array(True)}
    key = getkey()
    x = jnp.array([1.0, 2.0, -1.0])
    out = layer(state, x, key=key)
    plain = _plain(layer)((), x, key=key)
    np.testing.assert_array_equal(out.output, plain.output)
    expected = 0.3 * plain.metrics["kl"] + 0.7 * jnp.mean(
        jnp.square(plain.output - state["prev"])
    )
    np.testing.assert_allclose(out.regularization_loss, expected, rtol=1e-6)


def test_ar1_no_penalty_at_episode_start(getkey):
    layer = _fixed_ar1(getkey, [2.0, 0.0], ar1_weight=1.0)
    first = layer(layer.initial_state(), jnp.ones(2), key=getkey())
    assert first.metrics["l2_diff"] == 0.0 and first.regularization_loss == 0.0
    second = layer(first.next_state, jnp.ones(2), key=getkey())
    assert second.next_state["valid"]
    # Both samples are mu + O(1e-6) noise: tiny but nonzero penalty.
    assert 0.0 < second.metrics["l2_diff"] < 1e-10


@pytest.mark.parametrize("backprop_through_time", [False, True])
def test_ar1_reset_safety_no_nan(getkey, backprop_through_time):
    layer = AR1VariationalBottleneck(
        2, 3, ar1_weight=1.0, backprop_through_time=backprop_through_time, key=getkey()
    )
    poisoned = {"prev": jnp.full(3, jnp.nan), "valid": jnp.array(False)}
    stale = {"prev": jnp.full(3, jnp.inf), "valid": jnp.array(True)}
    x, key = jnp.ones(2), getkey()

    def loss(model_and_state, state_fn):
        model, state = model_and_state
        return model(state_fn(model, state), x, key=key).regularization_loss

    for state, state_fn in [
        (poisoned, lambda m, s: s),  # garbage carry already marked invalid
        (stale, lambda m, s: reset_where(m, jnp.array(True), s)),  # reset at t=0
    ]:
        value, grads = eqx.filter_value_and_grad(loss)((layer, state), state_fn)
        clean = layer(layer.initial_state(), x, key=key).regularization_loss
        # Only the KL term (value_and_grad compiles its own forward pass).
        assert_ulp_close(value, clean)
        for leaf in jax.tree.leaves(grads):
            assert np.all(np.isfinite(np.asarray(leaf)))
        np.testing.assert_array_equal(grads[1]["prev"], np.zeros(3))


@pytest.mark.parametrize("backprop_through_time", [False, True])
def test_ar1_backprop_through_time(getkey, backprop_through_time):
    layer = _fixed_ar1(getkey, [2.0, 0.0], 0.2, backprop_through_time)
    key = getkey()

    def loss(prev):
        state = {"prev": prev, "valid": jnp.array(True)}
        return layer(state, jnp.ones(2), key=key).regularization_loss

    grad = jax.grad(loss)(jnp.array([1.0, 2.0]))
    if backprop_through_time:
        # d/dprev 0.2 * mean((z - prev)^2) = -0.2 * (z - prev) = -0.2 * [1, -2].
        np.testing.assert_allclose(grad, [-0.2, 0.4], rtol=1e-5)
    else:
        np.testing.assert_array_equal(grad, [0.0, 0.0])


def test_ar1_scan_matches_loop_with_per_env_reset(getkey):
    layer = AR1VariationalBottleneck(2, 3, kl_weight=0.1, ar1_weight=0.5, key=getkey())
    n_steps, n_envs = 4, 2
    xs = jax.random.normal(getkey(), (n_steps, n_envs, 2))
    keys = jax.random.split(getkey(), (n_steps, n_envs))
    dones = jnp.zeros((n_steps, n_envs), bool).at[1, 0].set(True)

    @eqx.filter_jit
    @eqx.debug.assert_max_traces(max_traces=1)
    def unroll(model, xs, keys):
        def step(state, inputs):
            x, k, done = inputs
            out = jax.vmap(lambda s, x, k: model(s, x, key=k))(state, x, k)
            state = jax.vmap(lambda d, s: reset_where(model, d, s))(
                done, out.next_state
            )
            return state, (out.output, out.regularization_loss)

        return jax.lax.scan(step, model.initialize_state(n_envs), (xs, keys, dones))[1]

    outs, losses = unroll(layer, xs, keys)
    unroll(layer, xs, keys)
    for env in range(n_envs):
        state = layer.initial_state()
        for t in range(n_steps):
            out = layer(state, xs[t, env], key=keys[t, env])
            assert_ulp_close(outs[t, env], out.output)
            np.testing.assert_allclose(
                losses[t, env], out.regularization_loss, rtol=1e-5
            )
            state = reset_where(layer, dones[t, env], out.next_state)
    # Env 0 reset after step 1, so step 2 has no AR1 term: only the KL.
    kl_only = _plain(layer)((), xs[2, 0], key=keys[2, 0]).regularization_loss
    np.testing.assert_allclose(losses[2, 0], kl_only, rtol=1e-6)


def test_gradients_reach_the_projection(getkey):
    layer = VariationalBottleneck(2, 2, key=getkey())
    key = getkey()
    grads = eqx.filter_grad(
        lambda m: (
            jnp.sum(m((), jnp.array([1.0, -1.0]), key=key).output)
            + m((), jnp.ones(2), key=key).regularization_loss
        )
    )(layer)
    assert np.all(np.abs(np.asarray(grads.head.kernel)) > 0)


def test_bad_arguments_and_inputs(getkey):
    with pytest.raises(ValueError, match=r"min_std=0\.0 must be > 0"):
        VariationalBottleneck(2, 2, min_std=0.0, key=getkey())
    with pytest.raises(ValueError, match=r"min_std=-1\.0 must be > 0"):
        AR1VariationalBottleneck(2, 2, min_std=-1.0, key=getkey())
    with pytest.raises(ValueError, match=r"kl_weight=-1\.0\)`: kl_weight must be"):
        VariationalBottleneck(2, 2, kl_weight=-1.0, key=getkey())
    with pytest.raises(ValueError, match=r"ar1_weight=-0\.1\)`: ar1_weight must be"):
        AR1VariationalBottleneck(2, 2, ar1_weight=-0.1, key=getkey())
    for layer in (
        VariationalBottleneck(2, 2, key=getkey()),
        AR1VariationalBottleneck(2, 2, key=getkey()),
    ):
        name = type(layer).__name__
        with pytest.raises(ValueError, match=rf"`{name}` draws noise and needs `key=`"):
            layer(layer.initial_state(), jnp.ones(2))
        with pytest.raises(ValueError, match=r"shape \(2,\), got shape \(3,\)"):
            layer(layer.initial_state(), jnp.ones(3), key=getkey())


def test_bottlenecks_are_leaf_layers_for_recording(getkey):
    # No stateful module nested inside, so `with_recording` wraps each whole.
    from eqx_ppo.recording import is_leaf_layer, with_recording

    for layer in (
        VariationalBottleneck(2, 2, key=getkey()),
        AR1VariationalBottleneck(2, 2, key=getkey()),
    ):
        assert is_leaf_layer(layer)
        key = getkey()
        state = layer.initial_state()
        out = layer(state, jnp.ones(2), key=key)
        recorded = with_recording(layer)(state, jnp.ones(2), key=key)
        np.testing.assert_array_equal(recorded.output, out.output)
