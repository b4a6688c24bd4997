import math

import equinox as eqx
import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

import eqx_ppo
from eqx_ppo.nn import (
    AbstractStatefulModule,
    Dense,
    SequenceOutput,
    Sequential,
    trainable,
)
from eqx_ppo.nn._linear_recurrent import LRU, MinGRU, _log_of_draw
from eqx_ppo.nn._recurrence import linear_recurrence, replay_method
from tests._helpers import rtol

T = 64
# float32: the associative scan sums the same terms as the step loop in
# another order; over 64 steps outputs and carries of size ~4 differ by at most
# 7e-7 (measured), so 1e-5 leaves a wide margin and still catches a missed or
# shifted reset, which moves values by O(1).
TOL = dict(rtol=1e-5, atol=1e-5)
# Gradients (of size up to ~35) differ by at most 8e-6 (measured).
GRAD_TOL = dict(rtol=1e-4, atol=5e-5)


@eqx.filter_jit
def _step(layer, state, x):
    return layer(state, x)


def replay_one(layer, state0, xs, done, replay=None):
    """`layer.replay` (or `replay(layer, ...)`) of one env's `[T]` sequence,
    as a batch of one env."""
    replay = type(layer).replay if replay is None else replay
    out = replay(
        layer,
        jax.tree.map(lambda s: s[None], state0),
        xs[:, None],
        None,
        None,
        done[:, None],
    )
    return SequenceOutput(
        jax.tree.map(lambda s: s[0], out.last_state),
        *jax.tree.map(lambda a: a[:, 0], (out.output, out.regularization_loss)),
    )


def scan_one(layer, state0, xs, done):
    """The reference: the default replay of a module with a carry, its
    `__call__` scanned step by step."""
    return replay_one(layer, state0, xs, done, AbstractStatefulModule.replay)


_replay = eqx.filter_jit(replay_one)
_reference = eqx.filter_jit(scan_one)


def _done_patterns():
    t = jnp.arange(T)
    return {
        "first": t == 0,
        "two_in_a_row": (t == 10) | (t == 11),
        "last": t == T - 1,
        "random": jax.random.bernoulli(jax.random.key(3), 0.2, (T,)),
        "none": jnp.zeros(T, bool),
        "every": jnp.ones(T, bool),
    }


LAYERS = {
    # parallel_replay=True: the associative scan, whatever the backend.
    "mingru": lambda key: MinGRU(3, 5, parallel_replay=True, key=key),
    "mingru_h0": lambda key: MinGRU(
        3, 5, trainable_initial_state=True, parallel_replay=True, key=key
    ),
    "lru": lambda key: LRU(3, 5, parallel_replay=True, key=key),
    "lru_h0": lambda key: LRU(
        3, 5, trainable_initial_state=True, parallel_replay=True, key=key
    ),
    "lru_out": lambda key: LRU(
        3, 5, out_size=2, r_min=0.5, parallel_replay=True, key=key
    ),
    # parallel_replay=False: the sequential composition of the same coefficients.
    "mingru_h0_sequential": lambda key: MinGRU(
        3, 5, trainable_initial_state=True, parallel_replay=False, key=key
    ),
    "lru_h0_sequential": lambda key: LRU(
        3, 5, trainable_initial_state=True, parallel_replay=False, key=key
    ),
}


def _with_random_initial_state(layer, key):
    """Move a trainable initial state off zero, so a reset to zeros would show."""
    if isinstance(layer, MinGRU) and layer.initial_h is not None:
        h0 = jax.random.normal(key, (layer.hidden_size,))
        return eqx.tree_at(lambda m: m.initial_h, layer, h0)
    if isinstance(layer, LRU) and layer.initial_re is not None:
        re, im = jax.random.normal(key, (2, layer.hidden_size))
        return eqx.tree_at(lambda m: (m.initial_re, m.initial_im), layer, (re, im))
    return layer


def _random_state(layer, key):
    leaves, treedef = jax.tree.flatten(layer.initial_state())
    keys = jax.random.split(key, len(leaves))
    return jax.tree.unflatten(
        treedef,
        [
            jax.random.normal(k, leaf.shape)
            for k, leaf in zip(keys, leaves, strict=True)
        ],
    )


def _assert_tree_close(actual, expected, **tol):
    leaves, structure = jax.tree.flatten(actual)
    expected_leaves, expected_structure = jax.tree.flatten(expected)
    assert structure == expected_structure
    for a, e in zip(leaves, expected_leaves, strict=True):
        assert a.dtype == e.dtype and a.shape == e.shape
        np.testing.assert_allclose(a, e, **tol)


def _set(module, **fields):
    names = list(fields)
    return eqx.tree_at(
        lambda m: [getattr(m, n) for n in names],
        module,
        [jnp.asarray(fields[n], jnp.float32) for n in names],
    )


def test_mingru_hand_worked():
    gru = MinGRU(1, 1, key=jax.random.key(0))
    # Blocks [z, h]: z = sigmoid(0 x + ln 3) = 3/4, h~ = 2 x + 1.
    gru = _set(gru, kernel=[[0.0, 2.0]], bias=[math.log(3.0), 1.0])
    xs = jnp.array([[1.0], [0.0], [-1.0]])
    h0 = jnp.array([0.4])
    # h1 = 0.25 * 0.4 + 0.75 * 3 = 2.35
    # h2 = 0.25 * 2.35 + 0.75 * 1 = 1.3375
    # h3 = 0.25 * 1.3375 + 0.75 * (-1) = -0.415625
    expected = [[2.35], [1.3375], [-0.415625]]
    h, outs = h0, []
    for x in xs:
        out = _step(gru, h, x)
        np.testing.assert_array_equal(out.output, out.next_state)
        h = out.next_state
        outs.append(h)
    np.testing.assert_allclose(jnp.stack(outs), expected, rtol=rtol(1e-6))
    replay = _replay(gru, h0, xs, jnp.zeros(3, bool))
    np.testing.assert_allclose(replay.output, expected, rtol=rtol(1e-6))
    np.testing.assert_allclose(replay.last_state, [-0.415625], rtol=rtol(1e-6))
    # Done after step 2: step 3 starts from zeros, h3 = 0.75 * (-1) = -0.75.
    replay = _replay(gru, h0, xs, jnp.array([False, True, False]))
    np.testing.assert_allclose(
        replay.output, [[2.35], [1.3375], [-0.75]], rtol=rtol(1e-6)
    )
    # Done after the last step: the outputs stand, the carry is reset.
    replay = _replay(gru, h0, xs, jnp.array([False, False, True]))
    np.testing.assert_allclose(replay.output, expected, rtol=rtol(1e-6))
    np.testing.assert_array_equal(replay.last_state, [0.0])


def test_lru_hand_worked():
    lru = LRU(1, 1, key=jax.random.key(0))
    # lambda = exp(-ln 2 + i pi/2) = 0.5i, gamma = 0.5, B = 1 + i, C = 2 - i, D = 0.5.
    lru = _set(
        lru,
        nu_log=[math.log(math.log(2.0))],
        theta_log=[math.log(math.pi / 2)],
        gamma_log=[math.log(0.5)],
        B_re=[[1.0]],
        B_im=[[1.0]],
        C_re=[[2.0]],
        C_im=[[-1.0]],
        D=[0.5],
    )
    xs = jnp.array([[1.0], [2.0]])
    # h1 = 0.5i * 0 + 0.5 (1 + i) 1 = 0.5 + 0.5i
    # y1 = Re((2 - i)(0.5 + 0.5i)) + 0.5 * 1 = 1.5 + 0.5 = 2
    # h2 = 0.5i (0.5 + 0.5i) + 0.5 (1 + i) 2 = 0.75 + 1.25i
    # y2 = Re((2 - i)(0.75 + 1.25i)) + 0.5 * 2 = 2.75 + 1 = 3.75
    state, ys = lru.initial_state(), []
    for x in xs:
        out = _step(lru, state, x)
        state = out.next_state
        ys.append(out.output)
    np.testing.assert_allclose(jnp.stack(ys), [[2.0], [3.75]], rtol=rtol(1e-6))
    np.testing.assert_allclose(state[0], [0.75], rtol=rtol(1e-6))
    np.testing.assert_allclose(state[1], [1.25], rtol=rtol(1e-6))
    replay = _replay(lru, lru.initial_state(), xs, jnp.zeros(2, bool))
    np.testing.assert_allclose(replay.output, [[2.0], [3.75]], rtol=rtol(1e-6))
    _assert_tree_close(replay.last_state, state, rtol=rtol(1e-6))


def test_lru_matches_numpy_complex_reference(getkey):
    lru = LRU(3, 5, out_size=2, key=getkey())
    xs = np.asarray(jax.random.normal(getkey(), (T, 3)), np.float64)
    re0, im0 = np.asarray(jax.random.normal(getkey(), (2, 5)), np.float64)
    nu_log, theta_log, gamma_log, b_re, b_im, c_re, c_im, d = (
        np.asarray(a, np.float64)
        for a in (
            lru.nu_log,
            lru.theta_log,
            lru.gamma_log,
            lru.B_re,
            lru.B_im,
            lru.C_re,
            lru.C_im,
            lru.D,
        )
    )
    lam = np.exp(-np.exp(nu_log) + 1j * np.exp(theta_log))
    gamma, b, c = np.exp(gamma_log), b_re + 1j * b_im, c_re + 1j * c_im
    h, ys = re0 + 1j * im0, []
    for x in xs:
        h = lam * h + gamma * (x @ b)
        ys.append((h @ c).real + x @ d)
    state = (jnp.asarray(re0, jnp.float32), jnp.asarray(im0, jnp.float32))
    replay = _replay(lru, state, jnp.asarray(xs, jnp.float32), jnp.zeros(T, bool))
    np.testing.assert_allclose(replay.output, np.stack(ys), **TOL)
    np.testing.assert_allclose(replay.last_state[0], h.real, **TOL)
    np.testing.assert_allclose(replay.last_state[1], h.imag, **TOL)


def test_lru_init_and_real_parameters(getkey):
    # Built under jit: one compilation instead of one per eager op.
    lru = eqx.filter_jit(
        lambda key: LRU(3, 256, r_min=0.4, r_max=0.9, max_phase=1.0, key=key)
    )(getkey())
    modulus = np.exp(-np.exp(np.asarray(lru.nu_log)))
    phase = np.exp(np.asarray(lru.theta_log))
    assert modulus.min() >= 0.4 - 1e-6 and modulus.max() <= 0.9 + 1e-6
    assert phase.min() >= 0.0 and phase.max() <= 1.0 + 1e-6
    np.testing.assert_allclose(
        np.exp(lru.gamma_log), np.sqrt(1 - modulus**2), rtol=rtol(1e-5)
    )
    assert lru.out_size == 3 and lru.D.shape == (3,)
    assert LAYERS["lru_out"](getkey()).D.shape == (3, 2)
    with_h0 = LAYERS["lru_h0"](getkey())
    assert all(jax.tree.leaves(trainable(with_h0)))
    for leaf in jax.tree.leaves((with_h0, with_h0.initial_state())):
        assert leaf.dtype == jnp.float32
    # r_min = 0: a modulus draw of exactly 0 would make nu_log infinite.
    zero = jnp.zeros(2)
    assert np.isfinite(np.asarray(jnp.log(-0.5 * _log_of_draw(zero)))).all()


@pytest.mark.parametrize("name", list(LAYERS))
def test_replay_equals_the_scan_of_calls(getkey, name):
    layer = _with_random_initial_state(LAYERS[name](getkey()), getkey())
    xs = jax.random.normal(getkey(), (T, 3))
    state0 = _random_state(layer, getkey())
    patterns = _done_patterns()
    done = jnp.stack(list(patterns.values()))

    def both(layer, state0, xs, done):
        return replay_one(layer, state0, xs, done), scan_one(layer, state0, xs, done)

    parallel, reference = eqx.filter_jit(jax.vmap(both, in_axes=(None, None, None, 0)))(
        layer, state0, xs, done
    )
    for i, pattern in enumerate(patterns):
        at = jax.tree.map(lambda leaf, i=i: leaf[i], (parallel, reference))
        try:
            _assert_tree_close(*at, **TOL)
        except AssertionError as error:
            raise AssertionError(f"done pattern {pattern!r}") from error
    # A reset after the last step leaves the (learned or zero) initial state.
    last = jax.tree.map(lambda leaf: leaf[list(patterns).index("last")], parallel)
    _assert_tree_close(last.last_state, layer.initial_state(), rtol=0, atol=0)


@pytest.mark.parametrize("name", list(LAYERS))
def test_replay_of_envs_equals_each_envs_scan(getkey, name):
    # The loss's path: the coefficients of all T x M steps in one batch, the
    # recurrence env by env. Each env has its own carry and done pattern, so
    # a mixed-up env axis shows; the gradients go through the same path.
    layer = _with_random_initial_state(LAYERS[name](getkey()), getkey())
    done = jnp.stack(list(_done_patterns().values()), axis=1)
    n_envs = done.shape[1]
    xs = jax.random.normal(getkey(), (T, n_envs, 3))
    state0 = jax.vmap(_random_state, (None, 0))(
        layer, jax.random.split(getkey(), n_envs)
    )
    out_size = getattr(layer, "out_size", layer.hidden_size)
    weights = jnp.cos(jnp.arange(T * n_envs * out_size))

    def loss(layer, replay):
        out = replay(layer)
        return jnp.sum(weights * out.output.ravel()) + sum(
            jnp.sum(leaf) for leaf in jax.tree.leaves(out.last_state)
        )

    def batch(layer):
        return layer.replay(state0, xs, None, None, done)

    def each_env(layer):
        return jax.vmap(
            lambda s, x, d: scan_one(layer, s, x, d),
            in_axes=(0, 1, 1),
            out_axes=SequenceOutput(0, 1, 1),
        )(state0, xs, done)

    _assert_tree_close(
        eqx.filter_jit(batch)(layer), eqx.filter_jit(each_env)(layer), **TOL
    )
    grad = eqx.filter_jit(eqx.filter_grad(loss))
    _assert_tree_close(grad(layer, batch), grad(layer, each_env), **GRAD_TOL)


@pytest.mark.parametrize(
    "name", ["mingru_h0", "lru_h0", "mingru_h0_sequential", "lru_h0_sequential"]
)
def test_gradient_equals_the_scan_of_calls(getkey, name):
    layer = _with_random_initial_state(LAYERS[name](getkey()), getkey())
    xs = jax.random.normal(getkey(), (16, 3))
    state0 = _random_state(layer, getkey())
    # Resets at the first step, two in a row, and one at the last step.
    done = jnp.zeros(16, bool).at[jnp.array([0, 6, 7, 15])].set(True)

    def loss(model_and_state, replay):
        model, state = model_and_state
        out = replay(model, state, xs, done)
        # Uneven weights, so every output's gradient path counts separately.
        weights = jnp.cos(jnp.arange(out.output.size)).reshape(out.output.shape)
        return jnp.sum(weights * out.output) + sum(
            jnp.sum(leaf) for leaf in jax.tree.leaves(out.last_state)
        )

    grad = eqx.filter_jit(eqx.filter_grad(loss))
    parallel = grad((layer, state0), replay_one)
    reference = grad((layer, state0), scan_one)
    _assert_tree_close(parallel, reference, **GRAD_TOL)
    # The resets inside the sequence pass gradient to the learned initial state.
    initial = (
        parallel[0].initial_h if name.startswith("mingru") else parallel[0].initial_re
    )
    assert np.any(np.asarray(initial) != 0)


@pytest.mark.parametrize(
    "name", ["mingru", "lru", "mingru_h0_sequential", "lru_h0_sequential"]
)
def test_vmap_over_envs_equals_a_loop(getkey, name):
    layer = LAYERS[name](getkey())
    n_envs, n_steps = 3, 16
    xs = jax.random.normal(getkey(), (n_envs, n_steps, 3))
    done = jax.random.bernoulli(getkey(), 0.3, (n_envs, n_steps))
    state0 = jax.vmap(_random_state, (None, 0))(layer, jax.random.split(getkey(), 3))
    batched = eqx.filter_jit(jax.vmap(_replay, in_axes=(None, 0, 0, 0)))(
        layer, state0, xs, done
    )
    for env in range(n_envs):
        at = jax.tree.map(lambda leaf, e=env: leaf[e], (state0, xs, done, batched))
        _assert_tree_close(at[3], _replay(layer, *at[:3]), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["mingru_h0_sequential", "lru_h0_sequential"])
def test_gradient_over_seeds_and_envs_equals_a_loop(getkey, name):
    """The sequential replay's own vmap rule and VJP under two vmaps, seeds of
    layers (each its own `lambda` or gates) over envs, equal one seed at a time."""
    seeds = eqx.filter_vmap(
        lambda key: _with_random_initial_state(LAYERS[name](key), key)
    )(jax.random.split(getkey(), 3))
    n_envs, n_steps = 4, 12
    xs = jax.random.normal(getkey(), (3, n_envs, n_steps, 3))
    done = jax.random.bernoulli(getkey(), 0.3, (3, n_envs, n_steps))

    def loss(layer, xs, done):
        def one_env(x, d):
            out = replay_one(layer, layer.initial_state(), x, d)
            return jnp.sum(jnp.sin(out.output)) + sum(
                jnp.sum(leaf) for leaf in jax.tree.leaves(out.last_state)
            )

        return jnp.sum(jax.vmap(one_env)(xs, done))

    grad = eqx.filter_jit(eqx.filter_grad(loss))
    batched = eqx.filter_jit(eqx.filter_vmap(eqx.filter_grad(loss)))(seeds, xs, done)
    for seed in range(3):
        layer, x, d = jax.tree.map(lambda leaf, i=seed: leaf[i], (seeds, xs, done))
        at = jax.tree.map(lambda leaf, i=seed: leaf[i], batched)
        _assert_tree_close(at, grad(layer, x, d), rtol=1e-5, atol=1e-5)


def _as_pairs(x, n_lead):
    """A complex array as float32 `[*lead, 2, size]`: its parts, flattened."""
    x = x.reshape(*x.shape[:n_lead], 1, -1)
    return jnp.concatenate([jnp.real(x), jnp.imag(x)], -2).astype(jnp.float32)


def _reference_recurrence(a, b, h0, done, h_reset):
    """`linear_recurrence` as the plain step loop it stands for."""
    a = jnp.broadcast_to(a, b.shape)

    def step(h, inputs):
        a_t, b_t, d_t = inputs
        h = a_t * h + b_t
        return jnp.where(d_t[:, None], h_reset, h), h

    last, states = jax.lax.scan(step, h0, (a, b, done))
    return states, last


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.complex64])
@pytest.mark.parametrize("method", ["sequential", "associative", "blocked"])
@pytest.mark.parametrize("shared_a", [False, True])
def test_linear_recurrence_equals_the_step_loop(getkey, dtype, method, shared_a):
    def draw(shape, scale=1.0):
        x = scale * jax.random.normal(getkey(), shape)
        if dtype == jnp.complex64:
            x = jax.lax.complex(x, scale * jax.random.normal(getkey(), shape))
        return x

    n_steps, n_envs = 20, 2
    # A shared `a` (the LRU's) has a time axis of length 1.
    a = draw((1 if shared_a else n_steps, n_envs, 3), 0.6)
    inputs = (a, draw((n_steps, n_envs, 3)), draw((n_envs, 3)))
    h_reset = draw((3,))
    # Env 0: a reset after the first step, two in a row, and one after the
    # last; env 1: others.
    done = jnp.zeros((n_steps, n_envs), bool)
    done = done.at[jnp.array([0, 7, 8, n_steps - 1]), 0].set(True)
    done = done.at[jnp.array([3, 12]), 1].set(True)

    def loss(recurrence, a, b, h0, h_reset):
        states, last = recurrence(a, b, h0, done, h_reset)
        weights = jnp.cos(jnp.arange(states.size)).reshape(states.shape)
        return jnp.sum(weights * jnp.abs(states) ** 2) + jnp.sum(jnp.abs(last) ** 2)

    def fast(a, b, h0, done, h_reset):
        if dtype == jnp.float32:
            return linear_recurrence(a, b, h0, done, h_reset, method=method)
        # A complex recurrence as the LRU runs it: real and imaginary parts
        # on a second-last axis of size 2.
        states, last = linear_recurrence(
            _as_pairs(a, 2),
            _as_pairs(b, 2),
            _as_pairs(h0, 1),
            done,
            _as_pairs(h_reset, 0),
            method=method,
            pairs=True,
        )
        return (
            jax.lax.complex(states[..., 0, :], states[..., 1, :]).reshape(b.shape),
            jax.lax.complex(last[..., 0, :], last[..., 1, :]).reshape(h0.shape),
        )

    args = (*inputs, h_reset)
    _assert_tree_close(
        jax.jit(fast)(*args[:3], done, h_reset),
        _reference_recurrence(*args[:3], done, h_reset),
        **TOL,
    )
    # Gradients with respect to everything, complex ones included.
    grad = jax.jit(jax.grad(loss, argnums=(1, 2, 3, 4)), static_argnums=0)
    _assert_tree_close(
        grad(fast, *args), grad(_reference_recurrence, *args), **GRAD_TOL
    )


def test_the_tpus_flat_complex_scan_is_the_same_arithmetic(getkey, monkeypatch):
    """On a TPU a complex associative scan runs on `[time, env * n]`; the
    same elementwise program as the `[time, env, n]` one, so bit-equal,
    values and gradients."""
    n_steps, n_envs = 12, 3
    a = 0.6 * jax.random.normal(getkey(), (1, n_envs, 2, 4))
    b = jax.random.normal(getkey(), (n_steps, n_envs, 2, 4))
    h0 = jax.random.normal(getkey(), (n_envs, 2, 4))
    h_reset = jax.random.normal(getkey(), (2, 4))
    done = jax.random.bernoulli(getkey(), 0.2, (n_steps, n_envs))

    def loss(a, b, h0, h_reset):
        states, last = linear_recurrence(
            a, b, h0, done, h_reset, method="associative", pairs=True
        )
        return jnp.sum(jnp.sin(states)) + jnp.sum(last**2), (states, last)

    def run():
        # A new function each time, so that `jit` traces it anew.
        grad = jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True)
        return jax.jit(lambda *args: grad(*args))(a, b, h0, h_reset)

    three_d = run()
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    flat = run()
    assert all(
        np.array_equal(x, y)
        for x, y in zip(jax.tree.leaves(flat), jax.tree.leaves(three_d), strict=True)
    )


@pytest.mark.parametrize("n_steps", [1, 15, 16, 17, 64, 65, 97])
@pytest.mark.parametrize("pairs", [False, True])
def test_the_blocked_scan_at_every_block_edge(getkey, n_steps, pairs):
    """Blocks of 16 up to 64 steps and of 32 beyond, the last one padded:
    every edge (one block, a full one, one step over, a padded last block)
    gives the step loop's states and gradients."""
    n_envs = 3
    state = (n_envs, 2, 4) if pairs else (n_envs, 4)
    # |a| < 1 (a complex one too): a stable recurrence, as the layers keep it.
    a = 0.6 * jax.random.uniform(getkey(), (1, *state), minval=-1.0)
    b = jax.random.normal(getkey(), (n_steps, *state))
    h0 = jax.random.normal(getkey(), state)
    h_reset = jax.random.normal(getkey(), state[1:])
    done = jax.random.bernoulli(getkey(), 0.1, (n_steps, n_envs))

    def loss(method, a, b, h0, h_reset):
        states, last = linear_recurrence(
            a, b, h0, done, h_reset, method=method, pairs=pairs
        )
        weights = jnp.cos(jnp.arange(states.size)).reshape(states.shape)
        return jnp.sum(weights * states) + jnp.sum(last**2), (states, last)

    run = jax.jit(
        jax.value_and_grad(loss, argnums=(1, 2, 3, 4), has_aux=True),
        static_argnums=0,
    )
    blocked = run("blocked", a, b, h0, h_reset)
    loop = run("sequential", a, b, h0, h_reset)
    _assert_tree_close(blocked[0], loop[0], **TOL)
    _assert_tree_close(blocked[1], loop[1], **GRAD_TOL)


def test_replay_compiles_once(getkey):
    traces = []

    @eqx.filter_jit
    def replay(layer, state0, xs, done):
        traces.append(type(layer).__name__)
        return replay_one(layer, state0, xs, done)

    for cls in (MinGRU, LRU):
        for _ in range(2):
            layer = cls(3, 5, key=getkey())
            done = jax.random.bernoulli(getkey(), 0.3, (8,))
            xs = jax.random.normal(getkey(), (8, 3))
            replay(layer, _random_state(layer, getkey()), xs, done)
    assert traces == ["MinGRU", "LRU"]


def test_bad_arguments_and_inputs(getkey):
    with pytest.raises(ValueError, match=r"r_min=-0\.1.*0 <= r_min <= r_max < 1"):
        LRU(2, 3, r_min=-0.1, key=getkey())
    with pytest.raises(ValueError, match=r"r_max=1\.0\).*0 <= r_min <= r_max < 1"):
        LRU(2, 3, r_max=1.0, key=getkey())
    with pytest.raises(ValueError, match=r"r_min=0\.9, r_max=0\.5"):
        LRU(2, 3, r_min=0.9, r_max=0.5, key=getkey())
    with pytest.raises(
        ValueError, match=r"max_phase=0\.0\): must be .*> 0\. Fix: a positive"
    ):
        LRU(2, 3, max_phase=0.0, key=getkey())
    lru = LAYERS["lru"](getkey())  # in 3, hidden 5
    with pytest.raises(ValueError, match=r"LRU expects one env's input of shape \(3,"):
        lru(lru.initial_state(), jnp.ones(4))
    gru = LAYERS["mingru"](getkey())  # in 3, hidden 5
    with pytest.raises(ValueError, match=r"MinGRU expects one env's input"):
        gru(gru.initial_state(), jnp.ones(2))


def _has_scan(jaxpr) -> bool:
    return any(
        eqn.primitive.name == "scan"
        or any(_has_scan(sub) for sub in jax.extend.core.jaxprs_in_params(eqn.params))
        for eqn in jaxpr.eqns
    )


def test_inside_sequential_equals_the_scan_of_calls(getkey):
    net = Sequential(
        [
            Dense(3, 3, activation="tanh", key=getkey()),
            eqx_ppo.Recorder(
                LRU(
                    3,
                    5,
                    trainable_initial_state=True,
                    parallel_replay=True,
                    key=getkey(),
                )
            ),
            MinGRU(
                3, 5, trainable_initial_state=True, parallel_replay=True, key=getkey()
            ),
            Dense(5, 2, key=getkey()),
        ]
    )
    xs = jax.random.normal(getkey(), (T, 3))
    done = _done_patterns()["random"]
    state0 = jax.tree.map(lambda s: s + 0.3, net.initial_state())
    args = (state0, xs, done)
    _assert_tree_close(_replay(net, *args), _reference(net, *args), **TOL)
    # Dense layers run batched and the recurrences as associative scans: the
    # replay holds no sequential scan at all.
    jaxpr = jax.make_jaxpr(replay_one)(net, state0, xs, done)
    assert not _has_scan(jaxpr.jaxpr)


def _scan_bodies(jaxpr) -> list:
    bodies = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "scan":
            bodies.append(eqn.params["jaxpr"].jaxpr)
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            bodies += _scan_bodies(sub)
    return bodies


@pytest.mark.parametrize("layer", [LRU, MinGRU])
def test_default_replay_is_the_one_measured_faster_on_the_backend(
    getkey, layer, monkeypatch
):
    """`parallel_replay=None`: the loop on a CPU; on a TPU the blocked scan,
    but the loop for the LRU's complex recurrence up to 64 steps; the
    associative scan elsewhere (`benchmarks.memory`). Every way, the
    projections run outside any loop."""
    pairs = layer is LRU
    expected = {
        ("cpu", 16): "sequential",
        ("cpu", 256): "sequential",
        ("tpu", 16): "sequential" if pairs else "blocked",
        ("tpu", 64): "sequential" if pairs else "blocked",
        ("tpu", 65): "blocked",
        ("gpu", 16): "associative",
    }
    for (backend, n_steps), method in expected.items():
        monkeypatch.setattr(jax, "default_backend", lambda backend=backend: backend)
        assert replay_method(None, pairs, n_steps) == method
        assert replay_method(True, pairs, n_steps) == "associative"
        assert replay_method(False, pairs, n_steps) == "sequential"
    monkeypatch.undo()

    xs = jax.random.normal(getkey(), (T, 3))
    done = jnp.zeros(T, bool)

    def replay(m):
        return replay_one(m, m.initial_state(), xs, done).output

    loop = layer(3, 5, parallel_replay=False, key=jax.random.key(0))
    parallel = layer(3, 5, parallel_replay=True, key=jax.random.key(0))
    (body,) = _scan_bodies(jax.make_jaxpr(replay)(loop).jaxpr)
    # The loop body is the elementwise update alone: no matmul inside it.
    assert "dot_general" not in {eqn.primitive.name for eqn in body.eqns}
    assert not _has_scan(jax.make_jaxpr(replay)(parallel).jaxpr)
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    blocked = layer(3, 5, key=jax.random.key(0))
    xs = jax.random.normal(getkey(), (97, 3))
    done = jnp.zeros(97, bool)
    bodies = _scan_bodies(jax.make_jaxpr(replay)(blocked).jaxpr)
    assert len(bodies) == 2
    assert all(
        "dot_general" not in {eqn.primitive.name for eqn in body.eqns}
        for body in bodies
    )


@pytest.mark.parametrize("layer", [LRU, MinGRU])
def test_the_tpus_blocked_replay_equals_the_scan_of_calls(getkey, layer, monkeypatch):
    """The default replay of 97 steps on a TPU is the blocked scan (run here on
    the CPU): outputs, carries and gradients are the scan of `__call__`'s."""
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    model = layer(3, 5, trainable_initial_state=True, key=getkey())
    model = _with_random_initial_state(model, getkey())
    xs = jax.random.normal(getkey(), (97, 3))
    state0 = _random_state(model, getkey())
    done = jax.random.bernoulli(getkey(), 0.1, (97,))
    assert replay_method(None, layer is LRU, 97) == "blocked"

    def loss(model_and_state, replay):
        model, state = model_and_state
        out = replay(model, state, xs, done)
        weights = jnp.cos(jnp.arange(out.output.size)).reshape(out.output.shape)
        total = jnp.sum(weights * out.output) + sum(
            jnp.sum(leaf) for leaf in jax.tree.leaves(out.last_state)
        )
        return total, out

    run = eqx.filter_jit(eqx.filter_value_and_grad(loss, has_aux=True))
    (_, blocked), blocked_grad = run((model, state0), replay_one)
    (_, reference), reference_grad = run((model, state0), scan_one)
    _assert_tree_close(blocked, reference, **TOL)
    _assert_tree_close(blocked_grad, reference_grad, **GRAD_TOL)
