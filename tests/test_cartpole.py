"""The built-in continuous CartPole: gym's CartPole-v1 physics, a continuous force."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from eqx_ppo import envs
from eqx_ppo.envs._cartpole import CartPole


@pytest.mark.filterwarnings("ignore:JAXopt is no longer maintained:DeprecationWarning")
def test_full_force_matches_gymnax_discrete_cartpole(getkey):
    """Actions of ±1 push with ±10 N, exactly gym's two discrete actions."""
    gymnax = pytest.importorskip("gymnax")
    ours = CartPole()
    theirs, params = gymnax.make("CartPole-v1")
    start = ours.reset(getkey())
    x, x_dot, theta, theta_dot = start.pipeline_state
    their_state = theirs.reset_env(getkey(), params)[1].replace(
        x=x, x_dot=x_dot, theta=theta, theta_dot=theta_dot
    )
    pushes = jax.random.bernoulli(getkey(), 0.5, (60,)).astype(jnp.int32)

    def body(carry, push):
        a, b = carry
        a = ours.step(a, jnp.where(push == 1, 1.0, -1.0)[None])
        with jax.numpy_dtype_promotion("standard"):
            obs, b, reward, done, _ = theirs.step_env(
                jax.random.key(0), b, push, params
            )
        return (a, b), (a.obs, obs, a.reward, reward, a.done, done)

    _, (obs_a, obs_b, r_a, r_b, d_a, d_b) = jax.lax.scan(
        body, (start, their_state), pushes
    )
    first_done = int(np.argmax(np.asarray(d_b)))
    assert 5 < first_done < 60  # random pushes topple it
    steps = slice(0, first_done + 1)
    np.testing.assert_allclose(obs_a[steps], obs_b[steps], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(r_a[steps], 1.0)
    np.testing.assert_array_equal(d_a[steps], np.asarray(d_b[steps], np.float32))


def test_make_limits_episodes_to_500_steps_and_falls_terminate(getkey):
    env = envs.make("cartpole")
    assert (env.observation_size, env.action_size, env.n_actions) == (4, 1, None)

    def run(policy, key):
        def body(state, _):
            state = env.step(state, policy(state.obs))
            return state, (state.done, state.info["truncation"])

        return jax.lax.scan(body, env.reset(key), length=500)[1]

    # Zero force falls within 500 steps: a termination, not a truncation.
    done, truncation = run(lambda obs: jnp.zeros(1), getkey())
    assert 10 < int(np.argmax(done)) < 200
    assert float(truncation.sum()) == 0.0
    # A PD controller on the pole angle balances the whole episode: truncation.
    done, truncation = run(
        lambda obs: jnp.clip(jnp.array([10.0 * obs[2] + 2.0 * obs[3]]), -1, 1),
        getkey(),
    )
    assert float(done[:-1].sum()) == 0.0 and float(done[-1]) == 1.0
    assert float(truncation[-1]) == 1.0


def test_no_velocity_variant_hides_x_dot_and_theta_dot(getkey):
    full, hidden = envs.make("cartpole"), envs.make("cartpole_no_velocity")
    key = getkey()
    a, b = full.reset(key), hidden.reset(key)
    assert hidden.observation_size == 2
    np.testing.assert_array_equal(b.obs, a.obs[jnp.array([0, 2])])
    action = jnp.array([0.3])
    np.testing.assert_array_equal(
        hidden.step(b, action).obs, full.step(a, action).obs[jnp.array([0, 2])]
    )


def test_cartpole_rejects_a_wrong_action_shape(getkey):
    env = CartPole()
    with pytest.raises(ValueError, match="CartPole.step"):
        env.step(env.reset(getkey()), jnp.zeros(2))
