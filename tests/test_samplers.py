"""Action samplers: the maths, the replay contract, gradients and inference mode."""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxtyping import Array, Float

import eqx_ppo
from eqx_ppo.envs._parrot import Parrot
from eqx_ppo.nn import (
    CategoricalSampler,
    NormalSampler,
    NormalTanhSampler,
    VariationalBottleneck,
    apply_batched,
)
from tests._helpers import assert_ulp_close, rtol

HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)  # 0.9189385
# softplus(PRE_STD_ONE) = log(1 + (e - 1)) = 1: with min_std=0 the std is exactly 1.
PRE_STD_ONE = math.log(math.e - 1.0)


def np_softplus(x):
    return np.logaddexp(0.0, x)


def np_tanh_log_det(z):
    return np.log1p(-(np.tanh(z) ** 2))


def np_normal_tanh(x, eps, eps2, extras, entropy_weight, min_std, std_scale):
    """A float64 numpy transcription of the reference sampler, one env."""
    mean, pre = np.split(np.asarray(x, np.float64), 2)
    std = (np_softplus(pre) + min_std) * std_scale
    raw = mean + std * eps if extras is None else np.asarray(extras, np.float64)
    log_pdf = -0.5 * ((raw - mean) / std) ** 2 - HALF_LOG_2PI - np.log(std)
    log_likelihood = np.sum(log_pdf - np_tanh_log_det(raw))
    z = mean + std * eps2
    entropy = np.sum(0.5 + HALF_LOG_2PI + np.log(std) + np_tanh_log_det(z))
    return np.tanh(raw), log_likelihood, -entropy_weight * entropy, raw, std


def test_normal_tanh_hand_worked_log_likelihood():
    sampler = NormalTanhSampler(entropy_weight=0.1, min_std=0.0)
    x = jnp.array([0.0, 0.0, PRE_STD_ONE, PRE_STD_ONE], jnp.float32)  # mean 0, std 1
    out = sampler((), x, jnp.array([0.0, 1.0]), key=jax.random.key(0))
    # raw = 0: log N(0; 0, 1) = -0.9189385, log|tanh'(0)| = 0 -> -0.9189385.
    # raw = 1: log N(1; 0, 1) = -1.4189385, log|tanh'(1)| = -2 log cosh 1 = -0.8675616
    #          -> -1.4189385 + 0.8675616 = -0.5513769.
    np.testing.assert_allclose(
        out.output["log_likelihood"], -0.9189385 - 0.5513769, rtol=rtol(1e-6)
    )
    np.testing.assert_allclose(
        out.output["action"], [0.0, math.tanh(1.0)], rtol=rtol(1e-6)
    )
    np.testing.assert_allclose(out.metrics["sigma"], [1.0, 1.0], rtol=rtol(1e-6))
    np.testing.assert_array_equal(out.metrics["mu"], [0.0, 0.0])


def test_normal_tanh_entropy_at_the_mean_in_inference_mode():
    sampler = eqx.nn.inference_mode(NormalTanhSampler(entropy_weight=0.1, min_std=0.0))
    x = jnp.array([0.0, PRE_STD_ONE], jnp.float32)
    out = sampler((), x)  # no key needed in inference mode
    # Without a key the estimate uses z = mean = 0, where log|tanh'| = 0:
    # entropy = 0.5 + 0.9189385 + log 1 = 1.4189385; loss = -0.1 * entropy.
    np.testing.assert_allclose(out.regularization_loss, -0.14189385, rtol=rtol(1e-6))
    np.testing.assert_array_equal(out.output["action"], [0.0])


@pytest.mark.parametrize("replay", [False, True])
def test_normal_tanh_matches_a_numpy_reference(getkey, replay):
    key = getkey()
    weight, min_std, scale = 0.05, 0.1, 0.7
    sampler = NormalTanhSampler(weight, min_std=min_std, std_scale=scale)
    x = jax.random.normal(getkey(), (6,)) * 2.0
    extras = jax.random.normal(getkey(), (3,)) * 3.0 if replay else None
    out = sampler((), x, extras, key=key)
    # One draw per call: row 0 is the action noise, row 1 the entropy noise.
    eps, eps2 = np.asarray(jax.random.normal(key, (2, 3)), np.float64)
    action, log_likelihood, reg, raw, std = np_normal_tanh(
        x, eps, eps2, extras, weight, min_std, scale
    )
    np.testing.assert_allclose(out.output["action"], action, rtol=rtol(1e-5), atol=1e-6)
    np.testing.assert_allclose(
        out.output["log_likelihood"], log_likelihood, rtol=rtol(1e-5)
    )
    np.testing.assert_allclose(out.regularization_loss, reg, rtol=rtol(1e-5))
    np.testing.assert_allclose(out.extras, raw, rtol=rtol(1e-5))
    np.testing.assert_allclose(out.metrics["sigma"], std, rtol=rtol(1e-6))
    assert out.regularization_loss.dtype == jnp.float32


def test_normal_tanh_log_det_is_stable_for_large_actions():
    sampler = NormalTanhSampler(entropy_weight=0.1)
    x = jnp.array([0.0, 0.0, 0.0, 0.0])
    raw = jnp.array([30.0, -30.0])
    out = sampler((), x, raw, key=jax.random.key(0))
    grads = jax.grad(
        lambda x: sampler((), x, raw, key=jax.random.key(0)).output["log_likelihood"]
    )(x)
    # log|tanh'(30)| = 2 (log 2 - 30 - softplus(-60)) = -58.6137, finite where
    # log(1 - tanh(30)^2) = log(0) = -inf.
    assert np.isfinite(out.output["log_likelihood"])
    assert np.all(np.isfinite(grads))


def test_normal_tanh_replay_is_exact_and_scores_the_stored_action(getkey):
    sampler = NormalTanhSampler(entropy_weight=0.01)
    x = jax.random.normal(getkey(), (4,))
    key = getkey()
    rollout = sampler((), x, key=key)
    replay = sampler((), x, rollout.extras, key=key)
    assert jnp.array_equal(
        replay.output["log_likelihood"], rollout.output["log_likelihood"]
    )
    assert jnp.array_equal(replay.output["action"], rollout.output["action"])
    assert jnp.array_equal(replay.regularization_loss, rollout.regularization_loss)
    # Under another key the stored action, not fresh noise, is scored.
    other_key = sampler((), x, rollout.extras, key=getkey())
    assert jnp.array_equal(
        other_key.output["log_likelihood"], rollout.output["log_likelihood"]
    )
    moved = sampler((), x, rollout.extras + 0.5, key=key)
    assert moved.output["log_likelihood"] != rollout.output["log_likelihood"]


def test_normal_tanh_gradients_reach_mean_and_std_but_not_the_stored_action(getkey):
    sampler = NormalTanhSampler(entropy_weight=0.3, min_std=0.0)
    key = getkey()
    x = jnp.array([0.2, -0.4, 0.1, 0.3])
    raw = sampler((), x, key=key).extras

    def log_likelihood(x, raw):
        return sampler((), x, raw, key=key).output["log_likelihood"]

    dx, draw = jax.grad(log_likelihood, argnums=(0, 1))(x, raw)
    np.testing.assert_array_equal(draw, 0.0)
    # The score of a Gaussian: d log N(raw; mean, std) / d mean = (raw - mean) / std^2.
    std = np_softplus(np.asarray(x[2:]))
    np.testing.assert_allclose(dx[:2], (raw - x[:2]) / std**2, rtol=1e-5)
    assert np.all(dx[2:] != 0.0)
    # The rollout path samples with stop_gradient, so it gives the same score.
    dx_rollout = jax.grad(lambda x: sampler((), x, key=key).output["log_likelihood"])(x)
    np.testing.assert_allclose(dx_rollout, dx, rtol=1e-6)
    # The entropy bonus is reparameterised: its gradient reaches mean and std.
    dreg = jax.grad(lambda x: sampler((), x, key=key).regularization_loss)(x)
    assert np.all(dreg != 0.0)


def test_normal_tanh_inference_mode_returns_the_squashed_mean(getkey):
    sampler = eqx.nn.inference_mode(NormalTanhSampler(entropy_weight=0.01))
    assert sampler.inference
    x = jnp.array([0.3, -2.0, 0.0, 1.0])
    first = sampler((), x, key=getkey())
    second = sampler((), x, key=getkey())
    np.testing.assert_allclose(
        first.output["action"], np.tanh([0.3, -2.0]), rtol=rtol(1e-6)
    )
    assert jnp.array_equal(first.output["action"], second.output["action"])
    np.testing.assert_array_equal(first.extras, x[:2])
    back = eqx.nn.inference_mode(sampler, value=False)
    sampled = back((), x, key=getkey())
    assert not jnp.array_equal(sampled.output["action"], first.output["action"])


def test_normal_tanh_batched_jit_and_compiles_once(getkey):
    sampler = NormalTanhSampler(entropy_weight=0.01)

    @eqx.filter_jit
    @eqx.debug.assert_max_traces(max_traces=1)
    def act(sampler, x, key):
        return apply_batched(sampler, sampler.initialize_state(x.shape[0]), x, key=key)

    key = getkey()
    x = jax.random.normal(getkey(), (5, 4))
    out = act(sampler, x, key)
    act(sampler, x + 1.0, getkey())
    assert out.output["action"].shape == (5, 2)
    assert out.output["log_likelihood"].shape == (5,)
    # Env 3 alone, with its own key, gives env 3's values: vmap equals a loop.
    env_key = jax.random.split(key, 5)[3]
    single = sampler((), x[3], key=env_key)
    assert_ulp_close(out.output["action"][3], single.output["action"])


@pytest.mark.parametrize("cls", [NormalTanhSampler, NormalSampler])
def test_gaussian_samplers_validate(cls):
    sampler = cls(entropy_weight=0.0)
    with pytest.raises(ValueError, match="needs `key=`"):
        sampler((), jnp.zeros(4))
    with pytest.raises(ValueError, match=r"even size.*got shape \(3,\)"):
        sampler((), jnp.zeros(3), key=jax.random.key(0))


BAD_STD_SETTINGS = [("min_std", v, ">= 0") for v in (-1.0, math.nan, math.inf)] + [
    ("std_scale", v, "> 0") for v in (0.0, -1.0, math.nan, math.inf)
]


@pytest.mark.parametrize("cls", [NormalTanhSampler, NormalSampler])
@pytest.mark.parametrize("field, value, bound", BAD_STD_SETTINGS)
def test_gaussian_samplers_refuse_bad_std_settings(cls, field, value, bound):
    message = rf"{cls.__name__}\({field}={value}\): must be finite and {bound}"
    with pytest.raises(ValueError, match=message):
        cls(entropy_weight=0.0, **{field: value})


COEFFICIENT_LAYERS = [
    pytest.param(NormalTanhSampler, "entropy_weight", id="NormalTanhSampler"),
    pytest.param(NormalSampler, "entropy_weight", id="NormalSampler"),
    pytest.param(
        lambda w: CategoricalSampler(w, 3), "entropy_weight", id="CategoricalSampler"
    ),
    pytest.param(
        lambda w: VariationalBottleneck(2, 2, kl_weight=w, key=jax.random.key(0)),
        "kl_weight",
        id="VariationalBottleneck",
    ),
]


@pytest.mark.parametrize("make, field", COEFFICIENT_LAYERS)
@pytest.mark.parametrize("value", [-1.0, math.nan, math.inf, np.float64(-1.0)])
def test_concrete_coefficients_are_checked_inside_a_trace(make, field, value):
    """A factory run under `filter_jit` (as `train` runs it) still checks them."""
    name = type(make(0.0)).__name__
    message = rf"`{name}\({field}={value}\)`: {field} must be finite and >= 0"
    with pytest.raises(ValueError, match=message):
        make(value)
    with pytest.raises(ValueError, match=message):
        eqx.filter_jit(lambda: make(value))()


@pytest.mark.parametrize("make, field", COEFFICIENT_LAYERS)
def test_traced_coefficients_pass_unchecked(make, field):
    """A sweep may build one layer per coefficient under `vmap`."""
    weights = jnp.array([-1.0, 0.5])  # traced, so not even a negative one is seen
    layers = eqx.filter_vmap(make)(weights)
    np.testing.assert_array_equal(getattr(layers, field), weights)


def test_normal_sampler_hand_worked_values(getkey):
    sampler = NormalSampler(entropy_weight=0.5, min_std=0.0)
    x = jnp.array([2.0, PRE_STD_ONE], jnp.float32)  # mean 2, std 1
    key = getkey()
    out = sampler((), x, key=key)
    eps = jax.random.normal(key, (1,))
    np.testing.assert_allclose(out.output["action"], 2.0 + eps, rtol=rtol(1e-6))
    np.testing.assert_array_equal(out.extras, out.output["action"])
    # Exact entropy: 0.5 + 0.9189385 + log 1 = 1.4189385; loss = -0.5 * entropy.
    np.testing.assert_allclose(out.regularization_loss, -0.70946925, rtol=rtol(1e-6))
    # Replaying action 3: log N(3; 2, 1) = -0.5 - 0.9189385.
    replay = sampler((), x, jnp.array([3.0]), key=key)
    np.testing.assert_allclose(
        replay.output["log_likelihood"], -1.4189385, rtol=rtol(1e-6)
    )
    np.testing.assert_array_equal(replay.output["action"], [3.0])
    inference = eqx.nn.inference_mode(sampler)((), x)
    np.testing.assert_array_equal(inference.output["action"], [2.0])


def test_normal_sampler_replay_is_exact(getkey):
    sampler = NormalSampler(entropy_weight=0.01)
    x = jax.random.normal(getkey(), (6,))
    key = getkey()
    rollout = sampler((), x, key=key)
    replay = sampler((), x, rollout.extras, key=key)
    assert jnp.array_equal(
        replay.output["log_likelihood"], rollout.output["log_likelihood"]
    )
    draw = jax.grad(lambda a: sampler((), x, a, key=key).output["log_likelihood"])(
        rollout.extras
    )
    np.testing.assert_array_equal(draw, 0.0)


# Logits 0, log 2, log 5: probabilities 1/8, 2/8, 5/8.
LOGITS_125 = [0.0, math.log(2.0), math.log(5.0)]
# -(1/8 log 1/8 + 2/8 log 2/8 + 5/8 log 5/8) = 0.2599302 + 0.3465736 + 0.2937523
ENTROPY_125 = 0.9002561


def test_categorical_hand_worked_values():
    sampler = CategoricalSampler(entropy_weight=0.1, n_actions=3)
    x = jnp.array(LOGITS_125)
    out = sampler((), x, jnp.array(2, jnp.int32), key=jax.random.key(0))
    np.testing.assert_allclose(
        out.output["log_likelihood"], math.log(5 / 8), rtol=rtol(1e-6)
    )
    np.testing.assert_allclose(
        out.regularization_loss, -0.1 * ENTROPY_125, rtol=rtol(1e-6)
    )
    np.testing.assert_allclose(out.metrics["entropy"], ENTROPY_125, rtol=rtol(1e-6))
    assert out.output["action"].shape == () and out.extras == 2
    other = sampler((), x, jnp.array(0, jnp.int32), key=jax.random.key(0))
    np.testing.assert_allclose(
        other.output["log_likelihood"], math.log(1 / 8), rtol=rtol(1e-6)
    )


def test_categorical_entropy_of_a_masked_action_is_that_of_the_rest():
    # A -inf logit (a masked action) has probability 0 and adds nothing:
    # 0 log 0 = 0, in the value and in the gradient.
    sampler = CategoricalSampler(entropy_weight=0.1, n_actions=4)
    x = jnp.array([0.0, -jnp.inf, 0.0, 0.0])

    def entropy(x):
        out = sampler((), x, jnp.array(0, jnp.int32), key=jax.random.key(0))
        return out.metrics["entropy"]

    np.testing.assert_allclose(entropy(x), math.log(3), rtol=rtol(1e-6))
    grad = jax.grad(entropy)(x)
    np.testing.assert_allclose(grad[jnp.array([0, 2, 3])], 0.0, atol=1e-7)
    assert grad[1] == 0.0


def test_categorical_multi_discrete_sums_over_sub_actions():
    sampler = CategoricalSampler(entropy_weight=1.0, n_actions=(2, 3))
    x = jnp.array([0.0, 0.0, *LOGITS_125])
    out = sampler((), x, jnp.array([1, 2], jnp.int32), key=jax.random.key(0))
    # log(1/2) + log(5/8); entropy log 2 + 0.9002561.
    expected = math.log(0.5) + math.log(5 / 8)
    np.testing.assert_allclose(out.output["log_likelihood"], expected, rtol=rtol(1e-6))
    np.testing.assert_allclose(
        out.regularization_loss, -(math.log(2) + ENTROPY_125), rtol=rtol(1e-6)
    )
    sampled = sampler((), x, key=jax.random.key(1))
    assert sampled.output["action"].shape == (2,)
    assert sampled.output["action"].dtype == jnp.int32
    argmax = eqx.nn.inference_mode(sampler)((), x)
    # Ties go to the first index: argmax([0, 0]) = 0.
    np.testing.assert_array_equal(argmax.output["action"], [0, 2])


def test_categorical_samples_with_the_right_frequencies(getkey):
    sampler = CategoricalSampler(entropy_weight=0.0, n_actions=3)
    keys = jax.random.split(getkey(), 4000)
    x = jnp.array(LOGITS_125)
    actions = jax.vmap(lambda k: sampler((), x, key=k).output["action"])(keys)
    frequencies = np.bincount(np.asarray(actions), minlength=3) / 4000
    np.testing.assert_allclose(frequencies, [1 / 8, 2 / 8, 5 / 8], atol=0.025)


def test_categorical_replay_and_gradient(getkey):
    sampler = CategoricalSampler(entropy_weight=0.0, n_actions=3)
    x = jnp.array(LOGITS_125)
    key = getkey()
    rollout = sampler((), x, key=key)
    replay = sampler((), x, rollout.extras, key=getkey())
    assert jnp.array_equal(
        replay.output["log_likelihood"], rollout.output["log_likelihood"]
    )
    assert jnp.array_equal(replay.output["action"], rollout.output["action"])
    grad = jax.grad(
        lambda x: sampler((), x, rollout.extras, key=key).output["log_likelihood"]
    )(x)
    # d log softmax(x)[a] / dx = onehot(a) - p.
    expected = np.eye(3)[int(rollout.extras)] - np.array([1 / 8, 2 / 8, 5 / 8])
    np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-7)


def test_categorical_validates():
    with pytest.raises(ValueError, match="positive int"):
        CategoricalSampler(entropy_weight=0.0, n_actions=0)
    with pytest.raises(ValueError, match="positive int"):
        CategoricalSampler(entropy_weight=0.0, n_actions=())
    with pytest.raises(TypeError, match="n_actions"):
        CategoricalSampler(entropy_weight=0.0, n_actions=(2, True))
    sampler = CategoricalSampler(entropy_weight=0.0, n_actions=(2, 3))
    with pytest.raises(ValueError, match=r"expects 5 logits, got shape \(4,\)"):
        sampler((), jnp.zeros(4), key=jax.random.key(0))
    with pytest.raises(ValueError, match="needs `key=`"):
        sampler((), jnp.zeros(5))


@pytest.mark.parametrize(
    "layer, field, size",
    [
        (lambda: NormalTanhSampler(0.01), "entropy_weight", 6),
        (lambda: CategoricalSampler(0.01, 3), "entropy_weight", 3),
        (
            lambda: VariationalBottleneck(4, 3, kl_weight=0.01, key=jax.random.key(1)),
            "kl_weight",
            4,
        ),
    ],
)
def test_coefficients_are_traced_leaves_that_are_never_trained(layer, field, size):
    """Changing a coefficient reuses the compiled program, and vmap sweeps it."""
    import eqx_ppo

    module = layer()
    assert not getattr(eqx_ppo.nn.trainable(module), field)
    traces = []

    @eqx.filter_jit
    def regularization(m):
        traces.append(1)
        x = jnp.linspace(-1.0, 1.0, size)
        return m((), x, key=jax.random.key(0)).regularization_loss

    def with_weight(w):
        return eqx.tree_at(lambda m: getattr(m, field), module, w)

    base = regularization(with_weight(jnp.float32(1.0)))
    doubled = regularization(with_weight(jnp.float32(2.0)))
    assert len(traces) == 1
    assert_ulp_close(doubled, 2 * base, 1)
    swept = jax.vmap(lambda w: regularization(with_weight(w)))(jnp.arange(3.0))
    assert_ulp_close(swept, jnp.arange(3.0) * base, 1)


def test_weight_decay_leaves_the_entropy_weight_alone():
    import eqx_ppo

    config = eqx_ppo.TrainConfig(
        learner=eqx_ppo.PPO(
            n_envs=4,
            rollout_length=4,
            total_steps=32,
            n_minibatches=2,
            n_epochs=1,
            weight_decay=0.5,
            learning_rate=1e-2,
        ),
        eval=eqx_ppo.EvalConfig(enabled=False),
        progress=False,
    )
    result = eqx_ppo.train(
        eqx_ppo.envs.make("move_to_center"),
        lambda key: eqx_ppo.make_mlp_actor_critic(2, 2, [4], [4], key=key),
        config,
    )
    sampler = result.training_state.network.layers[1].action.layers[-1]
    assert float(sampler.entropy_weight) == float(jnp.float32(1e-2))


class _Unsummed(NormalSampler):
    """A custom sampler that forgot to sum its log-likelihood over the action."""

    def __call__(self, state, x, extras=None, *, key=None):
        out = super().__call__(state, x, extras, key=key)
        action = out.output["action"]
        per_dim = jnp.broadcast_to(out.output["log_likelihood"], action.shape)
        return out._replace(output={**out.output, "log_likelihood": per_dim})


@pytest.mark.parametrize("action_size", [1, 2])
def test_a_log_likelihood_per_action_dimension_is_named(getkey, action_size):
    # With one action dimension and as many steps as envs in a minibatch, the
    # loss would broadcast it against the advantages without a word.
    import eqx_ppo
    from eqx_ppo.nn import Dense, PPOAdapter

    env = Parrot(obs_size=action_size)
    k1, k2 = jax.random.split(getkey())
    network = PPOAdapter(
        action=eqx_ppo.nn.Sequential(
            [Dense(action_size, 2 * action_size, key=k1), _Unsummed(0.0)]
        ),
        value=Dense(action_size, 1, key=k2),
    )
    config = eqx_ppo.PPO(n_envs=4, rollout_length=4, n_minibatches=1)
    state = eqx_ppo.init(env, network, config, key=getkey())
    with pytest.raises(ValueError, match=r"loglikelihoods has shape \(\d,\) per env"):
        eqx.filter_jit(eqx_ppo.step)(env, config, state)


def test_only_nonnegative_coefficients_are_range_checked():
    # A coefficient is any never-trained float32 leaf (a vector of shifts may
    # be negative); `nonnegative=True` marks a loss weight, checked entry by
    # entry when the layer is built.
    class Shift(eqx_ppo.nn.AbstractStatefulModule):
        values: Float[Array, " n"] = eqx_ppo.nn.coefficient()
        weights: Float[Array, " n"] = eqx_ppo.nn.coefficient(nonnegative=True)

        def __call__(self, state, x, extras=None, *, key=None):
            out = x + self.values
            return eqx_ppo.nn.StatefulModuleOutput(state, out, jnp.zeros(()), {}, None)

    layer = Shift(jnp.array([-1.0, 2.0]), jnp.array([0.0, 3.0]))
    assert not any(jax.tree.leaves(eqx_ppo.nn.trainable(layer)))
    with pytest.raises(ValueError, match=r"Shift\(weights=\[ 1\. -2\.\]\)`: weights"):
        Shift(jnp.zeros(2), jnp.array([1.0, -2.0]))


def test_every_item_of_a_size_list_is_checked():
    # beartype checks one random item of a container per call; `each` checks
    # them all, so the bool is refused on every call, wherever it sits.
    for i in range(8):
        sizes = [3] * 8
        sizes[i] = True
        with pytest.raises(TypeError, match="n_actions"):
            CategoricalSampler(entropy_weight=0.0, n_actions=tuple(sizes))
        with pytest.raises(TypeError, match="actor_hidden_sizes"):
            eqx_ppo.make_mlp_actor_critic(2, 2, sizes, [4], key=jax.random.key(0))
        with pytest.raises(TypeError, match="logging_percentiles"):
            eqx_ppo.PPO(logging_percentiles=tuple(sizes))
        named = {f"k{j}": size for j, size in enumerate(sizes)}
        with pytest.raises(TypeError, match="action_size"):
            eqx_ppo.make_mlp_actor_critic(2, named, [4], [4], key=jax.random.key(0))
        with pytest.raises(TypeError, match="obs_size"):
            eqx_ppo.make_mlp_actor_critic(named, 2, [4], [4], key=jax.random.key(0))
