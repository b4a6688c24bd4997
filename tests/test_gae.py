import jax.numpy as jnp
import numpy as np
import pytest

from eqx_ppo.ppo import gae


def slow_gae(rewards, values, next_values, done, truncated, gamma, lam, bootstrap):
    """Python-loop GAE, written from the textbook recursion."""
    T, B = rewards.shape
    adv = np.zeros((T, B))
    for b in range(B):
        running = 0.0
        for t in reversed(range(T)):
            if done[t, b] and not truncated[t, b]:
                target = rewards[t, b]
            else:
                target = rewards[t, b] + gamma * next_values[t, b]
            delta = target - values[t, b]
            if truncated[t, b] and not bootstrap:
                delta = 0.0
            if done[t, b]:
                running = delta
            else:
                running = delta + gamma * lam * running
            adv[t, b] = running
    return adv


def test_hand_worked():
    # One env, three steps, gamma = 0.5, lambda = 1, no episode end.
    # deltas: 1 + .5*2 - 1 = 1;  0 + .5*3 - 2 = -0.5;  2 + .5*4 - 3 = 1
    # A_2 = 1; A_1 = -0.5 + .5*1 = 0; A_0 = 1 + .5*0 = 1
    r = jnp.array([[1.0], [0.0], [2.0]])
    v = jnp.array([[1.0], [2.0], [3.0]])
    nv = jnp.array([[2.0], [3.0], [4.0]])
    no = jnp.zeros((3, 1), bool)
    adv = gae(r, v, nv, no, no, gamma=0.5, lambda_=1.0)
    np.testing.assert_allclose(adv[:, 0], [1.0, 0.0, 1.0])


def test_termination_cuts_trace_and_value():
    # Terminal step 1: its delta ignores next value, and A_0 does not see A_2.
    r = jnp.array([[1.0], [1.0], [1.0]])
    v = jnp.zeros((3, 1))
    nv = jnp.full((3, 1), 10.0)
    done = jnp.array([[False], [True], [False]])
    adv = gae(r, v, nv, done, jnp.zeros((3, 1), bool), gamma=0.5, lambda_=1.0)
    # A_2 = 1 + 5 = 6; A_1 = 1 (terminal); A_0 = (1 + 5) + 0.5 * 1 = 6.5
    np.testing.assert_allclose(adv[:, 0], [6.5, 1.0, 6.0])


@pytest.mark.parametrize("bootstrap", [False, True])
def test_truncation_modes(bootstrap):
    r = jnp.array([[1.0], [1.0]])
    v = jnp.array([[0.0], [2.0]])
    nv = jnp.array([[2.0], [4.0]])
    done = jnp.array([[False], [True]])
    trunc = jnp.array([[False], [True]])
    adv = gae(
        r, v, nv, done, trunc, gamma=0.5, lambda_=1.0, bootstrap_truncation=bootstrap
    )
    # bootstrap: A_1 = 1 + .5*4 - 2 = 1; drop: A_1 = 0.
    # A_0 = (1 + .5*2 - 0) + .5*1*A_1: step 0 is not done, so the trace continues.
    expected_a1 = 1.0 if bootstrap else 0.0
    np.testing.assert_allclose(adv[:, 0], [2.0 + 0.5 * expected_a1, expected_a1])


def test_truncated_counts_only_where_done():
    # Step 1 flagged truncated but not done: an ordinary step (the hand-worked
    # case above), not a zeroed advantage.
    r = jnp.array([[1.0], [0.0], [2.0]])
    v = jnp.array([[1.0], [2.0], [3.0]])
    nv = jnp.array([[2.0], [3.0], [4.0]])
    no = jnp.zeros((3, 1), bool)
    flagged = jnp.array([[False], [True], [False]])
    adv = gae(r, v, nv, no, flagged, gamma=0.5, lambda_=1.0)
    np.testing.assert_allclose(adv[:, 0], [1.0, 0.0, 1.0])


@pytest.mark.parametrize("bootstrap", [False, True])
def test_matches_slow_reference(bootstrap):
    rng = np.random.default_rng(0)
    T, B = 17, 5
    r = rng.normal(size=(T, B)).astype(np.float32)
    v = rng.normal(size=(T, B)).astype(np.float32)
    nv = rng.normal(size=(T, B)).astype(np.float32)
    done = rng.random((T, B)) < 0.2
    trunc = done & (rng.random((T, B)) < 0.5)
    adv = gae(
        jnp.asarray(r),
        jnp.asarray(v),
        jnp.asarray(nv),
        jnp.asarray(done),
        jnp.asarray(trunc),
        gamma=0.9,
        lambda_=0.8,
        bootstrap_truncation=bootstrap,
    )
    expected = slow_gae(r, v, nv, done, trunc, 0.9, 0.8, bootstrap)
    np.testing.assert_allclose(np.asarray(adv), expected, rtol=1e-5, atol=1e-5)


_R = jnp.ones((5, 3))
_V = jnp.zeros((5, 3))
_D = jnp.zeros((5, 3), bool)


@pytest.mark.parametrize(
    "args, match",
    [
        ((_R, _V[:, :1], _V[:, :1], _D, _D), r"values=float32\[5, 1\]"),
        ((_R, _V[..., None], _V, _D, _D), r"values=float32\[5, 3, 1\]"),
        ((_R, _V, _V[:-1], _D, _D), r"next_values=float32\[4, 3\]"),
        ((_R, _V.T, _V, _D, _D), r"values=float32\[3, 5\]"),
        ((_R, _V, _V, _D, _D[:, :1]), r"truncated=bool\[5, 1\]"),
    ],
    ids=["broadcast", "unsqueezed", "short", "swapped", "truncated"],
)
def test_mismatched_shapes_are_rejected(unchecked, args, match):
    with pytest.raises(ValueError, match=rf"gae\({match}\): expected the shape of "):
        gae(*args, gamma=0.9, lambda_=0.9)


@pytest.mark.parametrize("name", ["done", "truncated"])
def test_non_bool_flags_are_rejected(name):
    flags = {"done": _D, "truncated": _D, name: _D.astype(jnp.float32)}
    with pytest.raises(TypeError, match=rf"parameter '?{name}"):
        gae(_R, _V, _V, flags["done"], flags["truncated"], gamma=0.9, lambda_=0.9)
