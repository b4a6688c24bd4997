"""Splitter, Flattener, Filter and Scale: stateless reshaping layers."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from eqx_ppo.nn import Filter, Flattener, Scale, Sequential, Splitter


def call(layer, x):
    out = layer(layer.initial_state(), x)
    assert out.next_state == ()
    assert out.regularization_loss == 0.0
    assert out.metrics == {} and out.extras is None
    return out.output


def test_splitter_takes_slices_in_argument_order():
    x = jnp.arange(6.0)
    out = call(Splitter(c=1, a=2, b=3), x)
    assert list(out) == ["c", "a", "b"]
    np.testing.assert_array_equal(out["c"], [0.0])
    np.testing.assert_array_equal(out["a"], [1.0, 2.0])
    np.testing.assert_array_equal(out["b"], [3.0, 4.0, 5.0])


def test_splitter_works_under_jit_and_vmap():
    splitter = Splitter(mean=2, value=1)
    x = jnp.arange(6.0).reshape(2, 3)
    out = eqx.filter_jit(jax.vmap(lambda xi: splitter((), xi).output))(x)
    np.testing.assert_array_equal(out["mean"], [[0.0, 1.0], [3.0, 4.0]])
    np.testing.assert_array_equal(out["value"], [[2.0], [5.0]])


@pytest.mark.parametrize("size", [0, -2])
def test_splitter_rejects_non_positive_sizes(size):
    with pytest.raises(
        ValueError, match=r"Splitter\(b=-?\d+\): must be >= 1\. Fix: give every slice"
    ):
        Splitter(a=1, b=size)


def test_splitter_checks_the_sizes_add_up_at_trace_time():
    splitter = Splitter(mean=3, value=1)
    with pytest.raises(ValueError, match=r"mean=3, value=1.*add up to 4.*has 5"):
        splitter((), jnp.zeros(5))
    with pytest.raises(ValueError, match="add up to 4"):
        jax.jit(lambda x: splitter((), x).output)(jnp.zeros(3))


def test_flattener_ravels_leaves_in_pytree_order():
    # Sorted keys: "a" (2 x 2) then "b" (3,) then "c" (scalar).
    x = {
        "c": jnp.array(9.0),
        "b": jnp.array([5.0, 6.0, 7.0]),
        "a": jnp.array([[1.0, 2.0], [3.0, 4.0]]),
    }
    np.testing.assert_array_equal(call(Flattener(), x), [1, 2, 3, 4, 5, 6, 7, 9])
    jitted = eqx.filter_jit(lambda x: Flattener()((), x).output)(x)
    np.testing.assert_array_equal(jitted, [1, 2, 3, 4, 5, 6, 7, 9])


def test_flattener_preserves_top_levels():
    x = {
        "a": {"p": jnp.ones((2, 2)), "t": jnp.zeros(8)},
        "b": jnp.ones(6),
        "c": [jnp.ones(1), {"u": jnp.zeros((1, 2)), "v": jnp.ones(3)}],
    }
    out = call(Flattener(preserve_levels=1), x)
    assert {k: v.shape for k, v in out.items()} == {"a": (12,), "b": (6,), "c": (6,)}
    out = call(Flattener(preserve_levels=2), x)
    assert out["a"]["p"].shape == (4,)
    assert out["b"].shape == (6,)  # an array above the kept depth is raveled
    assert isinstance(out["c"], list) and out["c"][1].shape == (5,)
    np.testing.assert_array_equal(out["c"][1], [0.0, 0.0, 1.0, 1.0, 1.0])


def test_flattener_errors():
    with pytest.raises(
        ValueError, match=r"Flattener\(preserve_levels=-1\): must be >= 0\. Fix:"
    ):
        Flattener(preserve_levels=-1)


def test_filter_selects_by_key_path_and_callable():
    obs = {
        "arm": {"proprio": jnp.ones(3), "target": jnp.zeros(2)},
        "head": jnp.full(2, 5.0),
        "pair": (jnp.zeros(1), jnp.full(1, 7.0)),
    }
    layer = Filter(
        {
            "p": ("arm", "proprio"),
            "h": "head",
            "second": ("pair", 1),
            "double": lambda o: 2.0 * o["head"],
        }
    )
    out = call(layer, obs)
    assert set(out) == {"p", "h", "second", "double"}
    np.testing.assert_array_equal(out["p"], jnp.ones(3))
    np.testing.assert_array_equal(out["h"], [5.0, 5.0])
    np.testing.assert_array_equal(out["second"], [7.0])
    np.testing.assert_array_equal(out["double"], [10.0, 10.0])


def test_filter_errors():
    with pytest.raises(TypeError):
        Filter([("a", "b")])
    with pytest.raises(TypeError):
        Filter({"x": 1.5})
    with pytest.raises(ValueError, match=r"no entry 'q' at \('arm',\)"):
        call(Filter({"x": ("arm", "q")}), {"arm": {"p": jnp.ones(1)}})


def test_filter_indexes_arrays_in_range_only():
    # JAX would clamp x[5] of a length-2 array to x[1].
    obs = {"v": jnp.array([3.0, 4.0])}
    assert call(Filter({"last": ("v", -1)}), obs)["last"] == 4.0
    for index in (2, 5, -3):
        with pytest.raises(ValueError, match=rf"no entry {index} at \('v',\)"):
            call(Filter({"x": ("v", index)}), obs)
    with pytest.raises(ValueError, match=r"no entry 0 at \('v', 0\)"):
        call(Filter({"x": ("v", 0, 0)}), obs)
    with pytest.raises(ValueError, match=r"no entry 'a' at \('v',\)"):
        call(Filter({"x": ("v", "a")}), obs)


def test_scale_multiplies_every_leaf_and_is_not_trainable():
    layer = Scale(2.5)
    out = call(layer, {"a": jnp.ones(2), "b": jnp.array([4.0])})
    np.testing.assert_array_equal(out["a"], [2.5, 2.5])
    np.testing.assert_array_equal(out["b"], [10.0])
    assert jax.tree.leaves(layer) == []


@pytest.mark.parametrize("factor", [float("nan"), float("inf")])
def test_scale_refuses_a_non_finite_factor(factor):
    with pytest.raises(
        ValueError, match=rf"Scale\(factor={factor}\): must be finite\. Fix:"
    ):
        Scale(factor)


def test_utility_layers_compose_and_compile_once():
    net = Sequential([Flattener(), Splitter(a=2, b=3), Filter({"b": "b"}), Scale(-1.0)])

    @eqx.filter_jit
    @eqx.debug.assert_max_traces(max_traces=1)
    def run(x):
        return net(net.initial_state(), x).output

    for offset in (0.0, 1.0):
        x = {"u": jnp.arange(3.0) + offset, "v": jnp.arange(2.0)}
        # Flattened: u then v = [o, o+1, o+2, 0, 1]; b = the last three, negated.
        np.testing.assert_array_equal(run(x)["b"], [-(offset + 2.0), 0.0, -1.0])
