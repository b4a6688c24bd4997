"""eqx_ppo.analysis.fixed_points against cells whose fixed points are known.

The states and eigenvalues are of order 1, so where a cell goes through
`tanh` or `exp` the absolute tolerance is the backend's relative one (`rtol`).
"""

import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree
from jaxtyping import Array, Float

from eqx_ppo import analysis, nn
from eqx_ppo.nn._module import zero_loss
from tests._helpers import rtol


class Linear(nn.AbstractStatefulModule):
    """h' = A h + B x: one fixed point, (I - A)^-1 B x, with A's eigenvalues."""

    a: Float[Array, "n n"]
    b: Float[Array, "n m"]

    def initial_state(self):
        return jnp.zeros(self.a.shape[0])

    def __call__(self, state, x, extras=None, *, key=None):
        h = self.a @ state + self.b @ x
        return nn.StatefulModuleOutput(h, h, zero_loss(), {}, None)


class Tanh(nn.AbstractStatefulModule):
    """h' = tanh(W h + x)."""

    w: Float[Array, "n n"]

    def initial_state(self):
        return jnp.zeros(self.w.shape[0])

    def __call__(self, state, x, extras=None, *, key=None):
        h = jnp.tanh(self.w @ state + x)
        return nn.StatefulModuleOutput(h, h, zero_loss(), {}, None)


def assert_same_spectrum(computed, expected, atol):
    """Every expected eigenvalue matched by its own computed one, within atol."""
    computed = list(np.asarray(computed, np.complex128))
    assert len(computed) == len(expected)
    for value in np.asarray(expected, np.complex128):
        distances = [abs(value - c) for c in computed]
        nearest = int(np.argmin(distances))
        assert distances[nearest] <= atol, (value, computed)
        computed.pop(nearest)


def take(tree, i):
    """Point `i` of stacked carries."""
    return jax.tree.map(lambda s: s[i], tree)


def nearest(points, target):
    """The index of the point closest to `target` (a flattened carry)."""
    flat = jax.vmap(lambda s: ravel_pytree(s)[0])(points.states)
    return int(np.argmin(np.max(np.abs(np.asarray(flat) - target), axis=1)))


@pytest.mark.parametrize("unstable", [False, True])
def test_a_linear_recurrence_has_its_one_known_fixed_point(unstable, getkey):
    a = jnp.array([[0.5, 0.2, 0.0], [-0.3, 0.4, 0.1], [0.0, 0.0, -0.6]])
    if unstable:
        a = a.at[2, 2].set(1.5)  # an eigenvalue 1.5: nearby states run away
    b = jnp.array([[1.0, 0.0], [0.5, -1.0], [0.0, 2.0]])
    x = jnp.array([0.3, -0.7])
    points = analysis.fixed_points(Linear(a, b), x, n_starts=16, key=getkey())
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    expected = np.linalg.solve(np.eye(3) - a64, b64 @ np.asarray(x, np.float64))
    assert points.states.shape == (1, 3)
    np.testing.assert_allclose(points.states[0], expected, rtol=0, atol=1e-6)
    assert points.counts[0] == 16
    assert points.residuals[0] <= 1e-5
    assert_same_spectrum(points.eigenvalues[0], np.linalg.eigvals(a64), 1e-5)
    assert bool(points.stable[0]) is not unstable


def test_a_bistable_tanh_pair_has_two_stable_points_and_a_saddle(getkey):
    # W's eigenvalues: 2 along (1, 1) and 0.5 along (1, -1). Along (1, 1),
    # h = (s, s) with s = tanh(2 s): s = 0 and s = +-s*; off that line the
    # contraction by 0.5 leaves no other solution.
    w = np.array([[1.25, 0.75], [0.75, 1.25]])
    s = 1.0
    for _ in range(100):  # Newton on s - tanh(2 s) = 0, in float64
        s -= (s - np.tanh(2 * s)) / (1 - 2 * (1 - np.tanh(2 * s) ** 2))
    points = analysis.fixed_points(
        Tanh(jnp.asarray(w, jnp.float32)), jnp.zeros(2), n_starts=64, key=getkey()
    )
    assert len(points.stable) == 3
    for target, stable in (([s, s], True), ([-s, -s], True), ([0.0, 0.0], False)):
        i = nearest(points, np.array(target))
        np.testing.assert_allclose(points.states[i], target, rtol=0, atol=rtol(1e-6))
        assert bool(points.stable[i]) is stable
        # The analytic Jacobian: diag(1 - tanh(W h)^2) W = diag(1 - h^2) W.
        jacobian = np.diag(1 - np.asarray(target) ** 2) @ w
        assert_same_spectrum(points.eigenvalues[i], np.linalg.eigvals(jacobian), 1e-5)
    saddle = nearest(points, np.zeros(2))
    np.testing.assert_allclose(
        np.abs(points.eigenvalues[saddle]), [2.0, 0.5], atol=rtol(1e-6)
    )
    assert int(np.sum(points.counts)) <= 64


def test_mingru_rests_at_its_candidate_and_lru_at_its_input_drive(getkey):
    x = jax.random.normal(getkey(), (3,))
    mingru = nn.MinGRU(3, 4, key=getkey())
    points = analysis.fixed_points(mingru, x, n_starts=8, key=getkey())
    # h' = (1 - z) h + z h~ rests at h = h~ = x W_h + b_h; dh'/dh = diag(1 - z).
    candidate = x @ mingru.kernel[:, 4:] + mingru.bias[4:]
    z = jax.nn.sigmoid(x @ mingru.kernel[:, :4] + mingru.bias[:4])
    assert points.states.shape == (1, 4)
    np.testing.assert_allclose(points.states[0], candidate, rtol=0, atol=rtol(1e-6))
    assert_same_spectrum(points.eigenvalues[0], 1 - z, 1e-6)
    assert bool(points.stable[0])

    lru = nn.LRU(3, 2, key=getkey(), r_max=0.9)
    points = analysis.fixed_points(lru, x, n_starts=8, key=getkey())
    # h' = lambda h + gamma (x B) rests at gamma (x B) / (1 - lambda); the
    # carry (re, im) turns each complex state into a pair with the
    # eigenvalues lambda and its conjugate.
    nu, theta, gamma, b_re, b_im = (
        np.asarray(p, np.float64)
        for p in (lru.nu_log, lru.theta_log, lru.gamma_log, lru.B_re, lru.B_im)
    )
    lam = np.exp(-np.exp(nu) + 1j * np.exp(theta))
    drive = np.exp(gamma) * (np.asarray(x, np.float64) @ (b_re + 1j * b_im))
    rest = drive / (1 - lam)
    re, im = points.states
    assert re.shape == im.shape == (1, 2)
    np.testing.assert_allclose(re[0], rest.real, rtol=0, atol=rtol(1e-6))
    np.testing.assert_allclose(im[0], rest.imag, rtol=0, atol=rtol(1e-6))
    assert_same_spectrum(
        points.eigenvalues[0], np.concatenate([lam, np.conj(lam)]), 1e-6
    )
    assert bool(points.stable[0])


def test_lstm_and_gru_rest_at_zero_with_the_analytic_jacobian(getkey):
    # With zero biases and x = 0 every gate is sigmoid(0) = 1/2 at the origin
    # and every candidate tanh(0) = 0, so the origin is a fixed point.
    # LSTM (gates i, f, g, o): dc'/dc = f = 1/2, dc'/dh = i g'(0) U_g^T =
    # U_g^T / 2, and h' = o tanh(c') gives dh'/dh = U_g^T / 4, dh'/dc = 1/4.
    lstm = nn.LSTM(2, 3, key=getkey())
    u_g = np.asarray(lstm.recurrent_kernel[:, 6:9], np.float64).T
    eye = np.eye(3)
    lstm_jacobian = np.block([[u_g / 4, eye / 4], [u_g / 2, eye / 2]])
    # GRU (gates r, z, n): h' = (1 - z) n + z h with n = tanh(r (h U_n)):
    # dh'/dh = U_n^T / 4 + I / 2 (z's own derivative meets h - n = 0).
    gru = nn.GRU(2, 3, key=getkey())
    u_n = np.asarray(gru.recurrent_kernel[:, 6:9], np.float64).T
    gru_jacobian = u_n / 4 + eye / 2
    for cell, jacobian in ((lstm, lstm_jacobian), (gru, gru_jacobian)):
        points = analysis.fixed_points(cell, jnp.zeros(2), n_starts=32, key=getkey())
        origin = nearest(points, np.zeros(jacobian.shape[0]))
        flat = ravel_pytree(take(points.states, origin))[0]
        np.testing.assert_allclose(flat, 0.0, rtol=0, atol=1e-6)
        expected = np.linalg.eigvals(jacobian)
        assert_same_spectrum(points.eigenvalues[origin], expected, 1e-5)
        assert bool(points.stable[origin]) == bool(np.all(np.abs(expected) < 1))
        # Every point returned is a fixed point of the cell's own step.
        for i in range(len(points.counts)):
            state = take(points.states, i)
            moved = jax.tree.map(
                jnp.subtract, cell(state, jnp.zeros(2)).next_state, state
            )
            assert (
                max(float(jnp.max(jnp.abs(m))) for m in jax.tree.leaves(moved)) < 1e-4
            )
    assert isinstance(points.states, jax.Array)  # the GRU's carry: h
    assert isinstance(
        analysis.fixed_points(lstm, jnp.zeros(2), n_starts=2, key=getkey()).states,
        tuple,
    )


def test_fixed_points_without_optimistix_says_which_extra(monkeypatch, getkey):
    monkeypatch.setitem(sys.modules, "optimistix", None)
    cell = Tanh(jnp.eye(2, dtype=jnp.float32))
    with pytest.raises(ImportError, match=r"eqx_ppo\[analysis\]"):
        analysis.fixed_points(cell, jnp.zeros(2), n_starts=2, key=getkey())


def test_a_carry_that_is_not_all_floats_is_refused(getkey):
    delay = nn.Delay(jnp.zeros(2), 2, 0.0)
    with pytest.raises(ValueError, match="not all float arrays"):
        analysis.fixed_points(delay, jnp.zeros(2), n_starts=2, key=getkey())


def test_a_map_without_fixed_points_gives_none(getkey):
    shift = Linear(jnp.eye(2), jnp.eye(2))  # h' = h + x: never at rest for x != 0
    points = analysis.fixed_points(shift, jnp.ones(2), n_starts=4, key=getkey())
    assert points.counts.shape == points.residuals.shape == (0,)
    assert points.states.shape == (0, 2)
    assert points.eigenvalues.shape == (0, 2)
    assert points.eigenvalues.dtype == jnp.complex64
