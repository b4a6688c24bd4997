"""Network factories: exact structure, inference mode, recurrence and errors."""

import zlib

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from eqx_ppo.nn import (
    LSTM,
    CategoricalSampler,
    Dense,
    Flattener,
    Map,
    Normalizer,
    NormalTanhSampler,
    PPOAdapter,
    Sequential,
    Splitter,
    apply_batched,
    make_lstm_actor_critic,
    make_mlp,
    make_mlp_actor_critic,
)
from eqx_ppo.nn._dense import identity
from eqx_ppo.nn._module import reset_where
from tests._helpers import assert_ulp_close


def types(seq: Sequential) -> list[type]:
    return [type(layer) for layer in seq.layers]


def test_make_mlp_structure_and_activations(getkey):
    mlp = make_mlp(3, [5, 4], 2, key=getkey(), activation="tanh")
    assert types(mlp) == [Dense, Dense, Dense]
    assert [(d.in_size, d.out_size) for d in mlp.layers] == [(3, 5), (5, 4), (4, 2)]
    assert [d.activation for d in mlp.layers] == [jnp.tanh, jnp.tanh, identity]
    final = make_mlp(3, [], 2, key=getkey(), activation="relu", activate_final=True)
    assert len(final) == 1 and final[0].activation is jax.nn.relu
    out = final(final.initial_state(), -jnp.ones(3) * 100.0)
    assert jnp.all(out.output >= 0.0)


def test_make_mlp_initializer_scale_scales_the_kernel_std():
    key = jax.random.key(0)
    base = make_mlp(8, [16], 4, key=key)
    scaled = make_mlp(8, [16], 4, key=key, initializer_scale=4.0)
    # Uniform variance scaling: limit = sqrt(3 * scale / fan_in), so with the same
    # key, scale 4 gives exactly twice the kernel. Biases stay zero.
    np.testing.assert_allclose(scaled[0].kernel, 2.0 * base[0].kernel, rtol=1e-6)
    assert np.all(np.abs(base[0].kernel) <= np.sqrt(3.0 / 8.0))
    np.testing.assert_array_equal(base[1].bias, 0.0)


def test_mlp_actor_critic_structure_is_exact(getkey):
    net = make_mlp_actor_critic(
        6,
        3,
        [17, 9],
        [11, 7],
        key=getkey(),
        entropy_weight=0.02,
        min_std=0.2,
        std_scale=0.5,
    )
    assert types(net) == [Normalizer, PPOAdapter]
    adapter = net[1]
    assert types(adapter.action) == [Dense, Dense, Dense, NormalTanhSampler]
    assert types(adapter.value) == [Dense, Dense, Dense]
    assert [(d.in_size, d.out_size) for d in adapter.action.layers[:3]] == [
        (6, 17),
        (17, 9),
        (9, 6),
    ]
    assert [(d.in_size, d.out_size) for d in adapter.value.layers] == [
        (6, 11),
        (11, 7),
        (7, 1),
    ]
    assert [d.activation for d in adapter.action.layers[:3]] == [
        jax.nn.swish,
        jax.nn.swish,
        identity,
    ]
    assert adapter.action[3] == NormalTanhSampler(0.02, min_std=0.2, std_scale=0.5)
    assert net.initial_state() == {
        0: (),
        1: {"action": {0: (), 1: (), 2: (), 3: ()}, "value": {0: (), 1: (), 2: ()}},
    }
    # Actor and critic are initialised from different keys.
    assert not np.allclose(adapter.action[0].kernel[:, :11], adapter.value[0].kernel)


def test_mlp_actor_critic_forward_shapes_and_metric_paths(getkey):
    net = make_mlp_actor_critic(4, 2, [8], [8], key=getkey())
    out = net(net.initial_state(), jnp.ones(4), key=getkey())
    assert out.output.actions.shape == (2,)
    assert out.output.loglikelihoods.shape == ()
    assert out.output.value_estimates.shape == ()
    assert set(out.metrics[1]["action"][2]) == {"mu", "sigma"}
    assert out.extras[1]["action"][2].shape == (2,)  # the pre-tanh action
    assert out.extras[0].shape == (4,)  # the normaliser's raw input


def test_without_normalisation_the_adapter_is_the_only_layer(getkey):
    net = make_mlp_actor_critic(4, 2, [8], [8], key=getkey(), normalize_obs=False)
    assert types(net) == [PPOAdapter]
    assert net[-1] is net[0]


def test_dict_observations_are_normalised_then_flattened(getkey):
    obs_size = {"vel": 2, "pos": (2, 3)}
    net = make_mlp_actor_critic(obs_size, 2, [8], [8], key=getkey())
    assert types(net) == [Normalizer, Flattener, PPOAdapter]
    assert net[2].action[0].in_size == 8  # 2 + 2 * 3
    obs = {"vel": jnp.ones(2), "pos": jnp.ones((2, 3))}
    out = net(net.initial_state(), obs, key=getkey())
    assert out.output.actions.shape == (2,)
    bare = make_mlp_actor_critic(
        obs_size, 2, [8], [8], key=getkey(), normalize_obs=False
    )
    assert types(bare) == [Flattener, PPOAdapter]


def test_dict_actions_use_a_splitter_and_a_map_of_samplers(getkey):
    net = make_mlp_actor_critic(3, {"wheel": 1, "arm": 2}, [8], [8], key=getkey())
    action = net[1].action
    assert types(action) == [Dense, Dense, Splitter, Map]
    assert action[1].out_size == 6
    assert action[2].sizes == (("arm", 4), ("wheel", 2))  # sorted keys
    out = net(net.initial_state(), jnp.ones(3), key=getkey())
    assert out.output.actions["arm"].shape == (2,)
    assert out.output.actions["wheel"].shape == (1,)
    assert set(out.output.loglikelihoods) == {"arm", "wheel"}


def test_discrete_actions_use_categorical_samplers(getkey):
    net = make_mlp_actor_critic(3, 4, [8], [8], key=getkey(), discrete=True)
    assert types(net[1].action) == [Dense, Dense, CategoricalSampler]
    assert net[1].action[1].out_size == 4
    out = net(net.initial_state(), jnp.ones(3), key=getkey())
    assert out.output.actions.shape == () and out.output.actions.dtype == jnp.int32
    multi = make_mlp_actor_critic(3, (2, 3), [8], [8], key=getkey(), discrete=True)
    assert multi[1].action[1].out_size == 5
    out = multi(multi.initial_state(), jnp.ones(3), key=getkey())
    assert out.output.actions.shape == (2,)


def test_inference_mode_makes_actions_deterministic(getkey):
    net = eqx.nn.inference_mode(make_mlp_actor_critic(4, 2, [8], [8], key=getkey()))
    obs = jax.random.normal(getkey(), (4,))
    first = net(net.initial_state(), obs, key=getkey())
    second = net(net.initial_state(), obs, key=getkey())
    no_key = net(net.initial_state(), obs)
    assert jnp.array_equal(first.output.actions, second.output.actions)
    assert jnp.array_equal(first.output.actions, no_key.output.actions)
    mean = first.metrics[1]["action"][2]["mu"]
    np.testing.assert_allclose(first.output.actions, jnp.tanh(mean), rtol=1e-6)


def test_lstm_actor_critic_structure(getkey):
    net = make_lstm_actor_critic(
        5, 2, 6, key=getkey(), actor_hidden_sizes=[7], trainable_initial_state=True
    )
    assert types(net) == [Normalizer, PPOAdapter]
    assert types(net[1].action) == [LSTM, Dense, Dense, NormalTanhSampler]
    assert types(net[1].value) == [LSTM, Dense]
    assert net[1].action[0].hidden_size == 6 and net[1].action[0].in_size == 5
    assert net[1].action[0] is not net[1].value[0]
    state = net.initial_state()
    h, c = state[1]["action"][0]
    assert h.shape == c.shape == (6,)
    assert net[1].action[0].initial_h is not None


def test_lstm_carries_reset_per_env_under_vmap_in_a_jitted_scan(getkey):
    net = make_lstm_actor_critic(3, 2, 4, key=getkey(), discrete=False)
    n_envs, n_steps = 3, 4
    obs = jax.random.normal(getkey(), (n_steps, n_envs, 3))
    keys = jax.random.split(getkey(), n_steps)

    @eqx.filter_jit
    @eqx.debug.assert_max_traces(max_traces=1)
    def rollout(net, obs, keys):
        def step(state, inputs):
            o, k = inputs
            out = apply_batched(net, state, o, key=k)
            return out.next_state, out.output

        return jax.lax.scan(step, net.initialize_state(n_envs), (obs, keys))

    state, outputs = rollout(net, obs, keys)
    rollout(net, obs + 1.0, keys)
    assert outputs.actions.shape == (n_steps, n_envs, 2)
    h = state[1]["action"][0][0]
    assert jnp.all(jnp.any(h != 0.0, axis=-1))
    done = jnp.array([True, False, True])
    reset = jax.vmap(lambda d, s: reset_where(net, d, s))(done, state)
    np.testing.assert_array_equal(reset[1]["action"][0][0][0], 0.0)
    np.testing.assert_array_equal(reset[1]["value"][0][1][2], 0.0)
    np.testing.assert_array_equal(reset[1]["action"][0][0][1], h[1])
    # A reset env behaves like a fresh one: the next step equals the first step
    # (up to rounding: eager here, compiled in a scan there).
    fresh = apply_batched(net, reset, obs[0], key=keys[0]).output
    first = jax.tree.map(lambda x: x[0], outputs)
    reset_envs = jnp.array([0, 2])
    assert_ulp_close(
        jax.tree.map(lambda x: x[reset_envs], fresh),
        jax.tree.map(lambda x: x[reset_envs], first),
    )
    with pytest.raises(AssertionError):
        assert_ulp_close(fresh.actions[1], first.actions[1])


def test_filter_grad_through_a_factory_network(getkey):
    net = make_lstm_actor_critic(3, 2, 4, key=getkey())
    obs, key = jnp.ones(3), getkey()
    extras = net(net.initial_state(), obs, key=key).extras

    @eqx.filter_grad
    def loss(net):
        out = net(net.initial_state(), obs, extras, key=key)
        return out.output.loglikelihoods + out.output.value_estimates

    grads = loss(net)
    assert np.any(grads[1].action[0].kernel != 0.0)
    assert np.any(grads[1].value[1].kernel != 0.0)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"action_size": (2, 3)}, ValueError, "discrete=True"),
        ({"action_size": {}}, ValueError, "at least one child"),
        # Declared types, checked at run time in the suite.
        ({"critic_hidden_sizes": 8}, TypeError, "critic_hidden_sizes"),
        ({"activation": "nope"}, TypeError, "activation"),
        ({"initializer_scale": 0.0}, ValueError, "initializer_scale"),
        (
            {"pixel_scale": 1 / 255},
            ValueError,
            r"pixel_scale=0\.00392.* only applies with `encoder=`",
        ),
        *(
            (
                {"obs_size": (8, 8, 3), "encoder": ((4, 3, 2),), "pixel_scale": v},
                ValueError,
                rf"^PixelScale\(factor={v}\): must be finite and > 0",
            )
            for v in (0.0, -1.0, float("nan"))
        ),
        *(
            ({name: v}, ValueError, rf"NormalTanhSampler\({name}={v}\): must be finite")
            for name in ("min_std", "std_scale")
            for v in (float("nan"), float("inf"))
        ),
    ],
)
def test_mlp_actor_critic_errors(getkey, kwargs, error, match):
    arguments = {
        "obs_size": 3,
        "action_size": 2,
        "actor_hidden_sizes": [8],
        "critic_hidden_sizes": [8],
        **kwargs,
    }
    with pytest.raises(error, match=match):
        make_mlp_actor_critic(**arguments, key=getkey())


@pytest.mark.parametrize("discrete", [False, True])
@pytest.mark.parametrize("weight", [-1.0, float("nan")])
def test_entropy_weight_is_checked_when_built_under_jit(discrete, weight):
    """`train` runs the factory under `filter_jit`; the check still fires."""
    sampler = "CategoricalSampler" if discrete else "NormalTanhSampler"

    @eqx.filter_jit
    def build(key):
        return make_mlp_actor_critic(
            2, 2, [8], [8], entropy_weight=weight, discrete=discrete, key=key
        )

    with pytest.raises(
        ValueError,
        match=rf"`{sampler}\(entropy_weight={weight}\)`: entropy_weight must be "
        "finite and >= 0",
    ):
        build(jax.random.key(0))


def test_lstm_actor_critic_errors(getkey):
    with pytest.raises(ValueError, match=r"CategoricalSampler\(n_actions=0\)"):
        make_lstm_actor_critic(3, 0, 4, key=getkey(), discrete=True)


def test_deterministic_layers_ignore_the_key(getkey):
    from eqx_ppo.nn import GRU, Delay, Filter, Scale

    x = jnp.arange(3.0)
    deterministic = [
        (Dense(3, 2, key=getkey()), x),
        (LSTM(3, 4, key=getkey()), x),
        (GRU(3, 4, key=getkey()), x),
        (Normalizer(3), x),
        (Delay(jnp.zeros(3), 2), x),
        (Flattener(), {"a": x}),
        (Splitter(a=1, b=2), x),
        (Filter({"a": "a"}), {"a": x}),
        (Scale(2.0), x),
        (make_mlp(3, [4], 2, key=getkey()), x),
    ]
    for layer, inputs in deterministic:
        state = layer.initial_state()
        without = layer(state, inputs)
        with_key = layer(state, inputs, key=getkey())
        assert jax.tree.all(
            jax.tree.map(jnp.array_equal, without.output, with_key.output)
        ), type(layer).__name__


def test_actor_critic_sampler_gets_its_own_fold_of_the_call_key(getkey):
    # The sampler is child 2 of the actor, the adapter's "action" port, which
    # is child 1 of the network: it draws from the call's key with that path
    # folded in once.
    net = make_mlp_actor_critic(3, 2, [4], [4], key=getkey())
    x, key = jax.random.normal(getkey(), (3,)), getkey()
    out = net(net.initial_state(), x, key=key)
    normalized = net.layers[0](net.layers[0].initial_state(), x).output
    actor = net.layers[1].action
    trunk = Sequential(actor.layers[:-1])
    params = trunk(trunk.initial_state(), normalized).output
    sampler_key = jax.random.fold_in(key, zlib.crc32(b"1/'action'/2"))
    sampled = actor.layers[-1]((), params, key=sampler_key).output["action"]
    np.testing.assert_array_equal(out.output.actions, sampled)
