import collections

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from eqx_ppo.nn import Normalizer, trainable
from eqx_ppo.nn._normalizer import NormalizerStatistics
from tests._helpers import assert_ulp_close


def test_identity_before_data():
    norm = Normalizer(3)
    x = jnp.array([5.0, -2.0, 0.25])
    out = norm((), x)
    np.testing.assert_array_equal(out.output, x)
    np.testing.assert_array_equal(out.extras, x)
    assert out.next_state == ()
    assert out.metrics == {}
    assert out.regularization_loss.shape == ()


def test_exact_values_after_one_update():
    norm = Normalizer(2)
    # T=2, B=2 samples: feature 0 = [1, 3, 5, 7], feature 1 = [2, 2, 2, 2].
    data = jnp.array([[[1.0, 2.0], [3.0, 2.0]], [[5.0, 2.0], [7.0, 2.0]]])
    norm = norm.update_statistics(data)
    # mean = [4, 2]; M2 = [9 + 1 + 1 + 9, 0] = [20, 0]; count = 4.
    np.testing.assert_allclose(norm.statistics.mean, [4.0, 2.0])
    np.testing.assert_allclose(norm.statistics.m2, [20.0, 0.0])
    assert norm.statistics.count == 4.0
    out = norm((), jnp.array([6.0, 2.5]))
    # std = [sqrt(20/4), max(0, 1e-3)] = [sqrt(5), 1e-3].
    np.testing.assert_allclose(out.output, [2.0 / np.sqrt(5.0), 0.5 / 1e-3], rtol=1e-5)


def test_statistics_match_numpy_over_several_updates(getkey):
    norm = Normalizer((2, 3))
    batches = [3.0 + 2.0 * jax.random.normal(getkey(), (t, 4, 2, 3)) for t in (5, 1, 7)]
    update = eqx.filter_jit(lambda n, e: n.update_statistics(e))
    for batch in batches:
        norm = update(norm, batch)
    allx = np.concatenate([np.asarray(b).reshape(-1, 2, 3) for b in batches])
    np.testing.assert_allclose(norm.statistics.mean, allx.mean(0), rtol=1e-5)
    np.testing.assert_allclose(
        norm.statistics.m2 / norm.statistics.count, allx.var(0), rtol=1e-4
    )
    assert norm.statistics.count == allx.shape[0]
    x = jax.random.normal(getkey(), (2, 3))
    np.testing.assert_allclose(
        norm((), x).output, (x - allx.mean(0)) / allx.std(0), rtol=1e-4, atol=1e-5
    )


def test_update_accepts_any_leading_axes():
    data = jnp.arange(24.0).reshape(2, 3, 4)
    a = Normalizer(4).update_statistics(data)
    b = Normalizer(4).update_statistics(data.reshape(6, 4))
    c = Normalizer(4).update_statistics(data.reshape(1, 2, 3, 4))
    for other in (b, c):
        np.testing.assert_allclose(a.statistics.mean, other.statistics.mean)
        np.testing.assert_allclose(a.statistics.m2, other.statistics.m2)


def test_update_is_pure():
    norm = Normalizer(2)
    new = norm.update_statistics(jnp.ones((2, 2, 2)))
    assert norm.statistics.count == 0.0
    np.testing.assert_array_equal(norm.statistics.mean, np.zeros(2))
    assert new.statistics.count == 4.0


def test_statistics_are_not_trainable_and_get_no_gradient():
    norm = Normalizer(2).update_statistics(
        jnp.array([[[1.0, 0.0], [3.0, 4.0]]])  # mean [2, 2], M2 [2, 8], n=2
    )
    spec = trainable(norm)
    assert not any(jax.tree.leaves(spec))
    assert isinstance(norm.statistics, NormalizerStatistics)

    def loss(model_and_x):
        model, x = model_and_x
        return jnp.sum(model((), x).output)

    grads, x_grad = eqx.filter_grad(loss)((norm, jnp.array([0.0, 1.0])))
    for leaf in jax.tree.leaves(grads):
        np.testing.assert_array_equal(leaf, np.zeros_like(leaf))
    # d/dx (x - mean)/std = 1/std = [1/sqrt(2/2), 1/sqrt(8/2)] = [1, 0.5].
    np.testing.assert_allclose(x_grad, [1.0, 0.5])


def test_gradient_before_data_is_finite():
    grads = eqx.filter_grad(lambda m: jnp.sum(m((), jnp.ones(2)).output))(Normalizer(2))
    for leaf in jax.tree.leaves(grads):
        assert np.all(np.isfinite(leaf))


def test_clip():
    norm = Normalizer(3, clip=2.0)
    out = norm((), jnp.array([-5.0, 1.5, 3.0]))
    np.testing.assert_array_equal(out.output, [-2.0, 1.5, 2.0])
    # extras stay raw, so statistics see the unclipped input.
    np.testing.assert_array_equal(out.extras, [-5.0, 1.5, 3.0])


def test_dict_observations_and_mapping_canonicalisation():
    shape = collections.OrderedDict([("vel", (2,)), ("pos", 1)])
    norm = Normalizer(shape)
    assert type(norm.statistics.mean) is dict
    assert norm.statistics.mean["pos"].shape == (1,)
    data = {
        "pos": jnp.array([[[1.0], [3.0]]]),  # mean 2, var 1
        "vel": jnp.array([[[0.0, 10.0], [4.0, 10.0]]]),  # mean [2, 10], var [4, 0]
    }
    norm = norm.update_statistics(collections.OrderedDict(data))
    obs = collections.OrderedDict(
        [("pos", jnp.array([4.0])), ("vel", jnp.array([6.0, 10.0]))]
    )
    out = norm((), obs)
    assert type(out.output) is dict and type(out.extras) is dict
    np.testing.assert_allclose(out.output["pos"], [2.0])  # (4 - 2) / 1
    np.testing.assert_allclose(out.output["vel"], [2.0, 0.0])  # (6-2)/2, 0/1e-3


def test_shape_from_sample_arrays():
    sample = {"a": jnp.zeros((2, 2)), "b": jax.ShapeDtypeStruct((3,), jnp.float32)}
    norm = Normalizer(sample)
    assert norm.statistics.mean["a"].shape == (2, 2)
    assert norm.statistics.mean["b"].shape == (3,)


def test_scalar_feature_shape():
    norm = Normalizer(()).update_statistics(jnp.array([[1.0, 3.0]]))
    np.testing.assert_allclose(norm((), jnp.array(4.0)).output, 2.0)  # (4-2)/1


def test_transforms_and_compiles_once(getkey):
    norm = Normalizer(2, clip=3.0).update_statistics(
        jax.random.normal(getkey(), (3, 4, 2))
    )
    xs = jax.random.normal(getkey(), (5, 2))
    loop = jnp.stack([norm((), x).output for x in xs])

    @eqx.filter_jit
    @eqx.debug.assert_max_traces(max_traces=1)
    def batched(model, xs):
        return jax.vmap(lambda x: model((), x).output)(xs)

    assert_ulp_close(batched(norm, xs), loop)
    updated = norm.update_statistics(jax.random.normal(getkey(), (3, 4, 2)))
    batched(updated, xs)  # new statistics, same compilation

    def step(carry, x):
        out = norm(carry, x)
        return out.next_state, out.output

    _, scanned = jax.lax.scan(step, (), xs)
    assert_ulp_close(scanned, loop)

    @eqx.filter_jit
    @eqx.debug.assert_max_traces(max_traces=1)
    def update(model, extras):
        return model.update_statistics(extras)

    model = norm
    for _ in range(3):
        model = update(model, jax.random.normal(getkey(), (3, 4, 2)))


def test_bad_arguments():
    with pytest.raises(ValueError, match="std_min"):
        Normalizer(2, std_min=0.0)
    with pytest.raises(
        ValueError, match=r"clip=-1\.0\): must be .*> 0\. Fix:.*or None"
    ):
        Normalizer(2, clip=-1.0)
    with pytest.raises(TypeError, match="shape"):
        Normalizer("obs")


def test_bad_inputs():
    norm = Normalizer({"a": 2})
    expects = r"Normalizer expects one env's input \{'a': 'float32\[2\]'\}, got "
    with pytest.raises(ValueError, match=expects + r"\{'b'.*structure it was built"):
        norm((), {"b": jnp.ones(2)})
    with pytest.raises(ValueError, match=expects + r"\{'a': 'float32\[3\]'\}"):
        norm((), {"a": jnp.ones(3)})
    with pytest.raises(ValueError, match=r"float32\[4, 2\].*vmap over the env axis"):
        norm((), {"a": jnp.ones((4, 2))})
