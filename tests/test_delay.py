import collections

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from eqx_ppo.nn import Delay
from eqx_ppo.nn._module import reset_where


def _run(delay, xs, state=None):
    state = delay.initial_state() if state is None else state
    outs = []
    for x in xs:
        out = delay(state, x)
        state = out.next_state
        outs.append(out.output)
    return outs, state


def test_delays_by_k_steps():
    delay = Delay(jnp.zeros(1), k_steps=2)
    xs = jnp.arange(1.0, 6.0)[:, None]  # inputs 1, 2, 3, 4, 5
    outs, _ = _run(delay, xs)
    # Two steps of the initial value, then the input of two steps before.
    np.testing.assert_array_equal(jnp.stack(outs)[:, 0], [0.0, 0.0, 1.0, 2.0, 3.0])


@pytest.mark.parametrize("k", [1, 3])
def test_matches_shifted_sequence(getkey, k):
    delay = Delay(jnp.zeros((2, 2)), k_steps=k, initial_value=-1.0)
    xs = jax.random.normal(getkey(), (7, 2, 2))
    outs, _ = _run(delay, xs)
    expected = jnp.concatenate([jnp.full((k, 2, 2), -1.0), xs[:-k]])
    np.testing.assert_array_equal(jnp.stack(outs), expected)
    out = delay(delay.initial_state(), xs[0])
    assert out.metrics == {} and out.extras is None
    assert out.regularization_loss.shape == ()


def test_pytree_input_keeps_dtypes():
    sample = {"pos": jnp.zeros(2), "count": jnp.zeros((), jnp.int32)}
    delay = Delay(sample, k_steps=1, initial_value=5.0)
    state = delay.initial_state()
    assert state["buffer"]["pos"].shape == (1, 2)
    assert state["buffer"]["count"].dtype == jnp.int32
    out = delay(state, {"pos": jnp.array([1.0, 2.0]), "count": jnp.array(7, jnp.int32)})
    np.testing.assert_array_equal(out.output["pos"], [5.0, 5.0])
    assert out.output["count"] == 5 and out.output["count"].dtype == jnp.int32
    out = delay(out.next_state, {"pos": jnp.zeros(2), "count": jnp.array(0, jnp.int32)})
    np.testing.assert_array_equal(out.output["pos"], [1.0, 2.0])
    assert out.output["count"] == 7


def test_mapping_types_and_shape_dtype_structs():
    sample = collections.OrderedDict(a=jax.ShapeDtypeStruct((2,), jnp.float32))
    delay = Delay(sample, k_steps=1)
    out = delay(delay.initial_state(), {"a": jnp.ones(2)})
    out = delay(out.next_state, collections.OrderedDict(a=jnp.zeros(2)))
    assert type(out.output) is dict
    np.testing.assert_array_equal(out.output["a"], [1.0, 1.0])


def test_reset_mid_sequence_refills_with_initial_value():
    delay = Delay(jnp.zeros(()), k_steps=2, initial_value=-1.0)
    state = delay.initial_state()
    outputs = []
    for t, x in enumerate(jnp.arange(1.0, 7.0)):  # inputs 1..6
        out = delay(state, x)
        outputs.append(float(out.output))
        # The episode ends after the step that took input 3 (t == 2).
        state = reset_where(delay, jnp.array(t == 2), out.next_state)
    # Steps t=3, 4 start a new episode: initial value, then inputs 4, 5 delayed.
    assert outputs == [-1.0, -1.0, 1.0, -1.0, -1.0, 4.0]


def test_reset_per_env_under_vmap(getkey):
    delay = Delay(jnp.zeros(2), k_steps=2)
    n_steps, n_envs = 5, 3
    xs = jax.random.normal(getkey(), (n_steps, n_envs, 2))
    dones = jnp.zeros((n_steps, n_envs), bool).at[1, 2].set(True)

    def step(state, inputs):
        x, done = inputs
        out = jax.vmap(delay)(state, x)
        state = jax.vmap(lambda d, s: reset_where(delay, d, s))(done, out.next_state)
        return state, out.output

    _, outs = jax.lax.scan(step, delay.initialize_state(n_envs), (xs, dones))
    for env in range(n_envs):
        if env == 2:
            first, _ = _run(delay, xs[:2, env])
            second, _ = _run(delay, xs[2:, env])
            expected = jnp.stack(first + second)
        else:
            expected = jnp.stack(_run(delay, xs[:, env])[0])
        np.testing.assert_array_equal(outs[:, env], expected)


def test_scan_grad_and_compiles_once(getkey):
    delay = Delay({"a": jnp.zeros(2)}, k_steps=2)
    xs = {"a": jax.random.normal(getkey(), (6, 2))}

    @eqx.filter_jit
    @eqx.debug.assert_max_traces(max_traces=1)
    def unroll(model, xs):
        def step(state, x):
            out = model(state, x)
            return out.next_state, out.output

        return jax.lax.scan(step, model.initial_state(), xs)[1]

    scanned = unroll(delay, xs)
    loop, _ = _run(delay, [{"a": a} for a in xs["a"]])
    np.testing.assert_array_equal(scanned["a"], jnp.stack([o["a"] for o in loop]))
    for _ in range(2):
        unroll(delay, {"a": jax.random.normal(getkey(), (6, 2))})

    # Output t depends on input t - 2 only: d(sum of outputs)/dx_t = 1 for t < 4.
    grads = jax.grad(lambda xs: jnp.sum(unroll(delay, xs)["a"]))(xs)
    np.testing.assert_array_equal(grads["a"][:, 0], [1, 1, 1, 1, 0, 0])


def test_bad_arguments_and_inputs():
    with pytest.raises(
        ValueError, match=r"k_steps=0\): must be >= 1\. Fix: for no delay"
    ):
        Delay(jnp.zeros(2), k_steps=0)
    with pytest.raises(TypeError, match="k_steps"):
        Delay(jnp.zeros(2), k_steps=1.5)
    with pytest.raises(TypeError, match="sample_input"):
        Delay({"a": 3}, k_steps=1)
    delay = Delay({"a": jnp.zeros(2)}, k_steps=1)
    like = r"Delay expects one env's input "
    with pytest.raises(
        ValueError, match=like + r"\{'a': 'float32\[2\]'\}, got \{'b'.*built"
    ):
        delay(delay.initial_state(), {"b": jnp.zeros(2)})
    with pytest.raises(ValueError, match=r"got \{'a': 'float32\[4, 2\]'\}.*vmap"):
        delay(delay.initial_state(), {"a": jnp.zeros((4, 2))})
