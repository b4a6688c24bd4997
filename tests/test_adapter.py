"""PPOAdapter: two ports, sampler dicts lifted into PPONetworkOutput."""

import zlib

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from eqx_ppo.nn import (
    AbstractStatefulModule,
    CategoricalSampler,
    Dense,
    Filter,
    Map,
    NormalTanhSampler,
    Parallel,
    PPOAdapter,
    PPONetworkOutput,
    Sequential,
    StatefulModuleOutput,
    apply_batched,
)
from eqx_ppo.nn._module import zero_loss


def single_head(key, obs_size=5, action_size=3):
    k1, k2, k3 = jax.random.split(key, 3)
    return PPOAdapter(
        action=Sequential(
            [Dense(obs_size, 2 * action_size, key=k1), NormalTanhSampler(0.1)]
        ),
        value=Sequential(
            [Dense(obs_size, 4, key=k2, activation="tanh"), Dense(4, 1, key=k3)]
        ),
    )


def test_single_head_output_shapes_and_lifting(getkey):
    net = single_head(getkey())
    key, x = getkey(), jax.random.normal(getkey(), (5,))
    out = net(net.initial_state(), x, key=key)
    assert isinstance(out.output, PPONetworkOutput)
    assert out.output.actions.shape == (3,)
    assert out.output.loglikelihoods.shape == ()
    assert out.output.value_estimates.shape == ()  # (1,) squeezed
    # The action port's sampler (its layer 1) draws from one fold of the key
    # by its path; the adapter lifts its fields.
    sampler_key = jax.random.fold_in(key, zlib.crc32(b"'action'/1"))
    params = net.action[0](net.action[0].initial_state(), x).output
    port = net.action[1]((), params, key=sampler_key)
    assert jnp.array_equal(out.output.actions, port.output["action"])
    assert jnp.array_equal(out.output.loglikelihoods, port.output["log_likelihood"])
    value = net.value(net.value.initial_state(), x).output
    assert jnp.array_equal(out.output.value_estimates, value[0])
    assert out.regularization_loss == port.regularization_loss
    assert (
        set(out.next_state)
        == set(out.metrics)
        == set(out.extras)
        == {
            "action",
            "value",
        }
    )
    assert set(out.metrics["action"][1]) == {"mu", "sigma"}
    assert out.extras["value"] == {0: None, 1: None}


def test_replay_reproduces_the_rollout_exactly(getkey):
    net = single_head(getkey())
    key, x = getkey(), jax.random.normal(getkey(), (5,))
    rollout = net(net.initial_state(), x, key=key)
    replay = net(net.initial_state(), x, rollout.extras, key=key)
    for a, b in zip(
        jax.tree.leaves(rollout.output), jax.tree.leaves(replay.output), strict=True
    ):
        assert jnp.array_equal(a, b)
    assert jnp.array_equal(rollout.regularization_loss, replay.regularization_loss)


def test_dict_actions_and_dict_values(getkey):
    k = jax.random.split(getkey(), 4)
    trunk = Parallel(
        arm=Dense(4, 4, key=k[0]),
        grip=Dense(4, 3, key=k[1]),
        value_a=Dense(4, 1, key=k[2]),
        value_b=Dense(4, 1, key=k[3]),
    )
    adapter = PPOAdapter(
        action=Sequential(
            [
                Filter({"arm": "arm", "grip": "grip"}),
                Map(arm=NormalTanhSampler(0.0), grip=CategoricalSampler(0.0, 3)),
            ]
        ),
        value=Filter({"a": "value_a", "b": "value_b"}),
    )
    net = Sequential([trunk, adapter])
    out = net(net.initial_state(), jnp.ones(4), key=getkey())
    actions, lls, values = out.output
    assert set(actions) == set(lls) == {"arm", "grip"}
    assert actions["arm"].shape == (2,) and actions["grip"].dtype == jnp.int32
    assert lls["arm"].shape == lls["grip"].shape == ()
    assert set(values) == {"a", "b"} and values["a"].shape == ()
    trunk_out = trunk(trunk.initial_state(), jnp.ones(4)).output
    assert jnp.array_equal(values["b"], trunk_out["value_b"][0])


def test_scalar_values_pass_through(getkey):
    class Zero(AbstractStatefulModule):
        def __call__(self, state, x, extras=None, *, key=None):
            return StatefulModuleOutput(state, jnp.zeros(()), zero_loss(), {}, None)

    net = PPOAdapter(
        action=Sequential([Dense(2, 2, key=getkey()), NormalTanhSampler(0.0)]),
        value=Zero(),
    )
    out = net(net.initial_state(), jnp.ones(2), key=getkey())
    assert out.output.value_estimates.shape == ()


def test_bad_ports_raise_clear_errors(getkey):
    net = PPOAdapter(
        action=Sequential([Dense(2, 2, key=getkey()), NormalTanhSampler(0.0)]),
        value=Dense(2, 3, key=getkey()),
    )
    with pytest.raises(
        ValueError, match=r"shaped `\(1,\)` or `\(\)`, got shape \(3,\)"
    ):
        net(net.initial_state(), jnp.ones(2), key=getkey())
    net = PPOAdapter(action=Dense(2, 2, key=getkey()), value=Dense(2, 1, key=getkey()))
    with pytest.raises(TypeError, match="end the action port with a sampler"):
        net(net.initial_state(), jnp.ones(2), key=getkey())
    with pytest.raises(TypeError, match="AbstractStatefulModule"):
        PPOAdapter(action=jnp.tanh, value=Dense(2, 1, key=getkey()))


def test_batched_jit_compiles_once_and_inference_is_deterministic(getkey):
    net = single_head(getkey())

    @eqx.filter_jit
    @eqx.debug.assert_max_traces(max_traces=1)
    def act(net, state, obs, key):
        return apply_batched(net, state, obs, key=key)

    obs = jax.random.normal(getkey(), (4, 5))
    state = net.initialize_state(4)
    first = act(net, state, obs, getkey())
    second = act(net, state, obs, getkey())
    assert first.output.actions.shape == (4, 3)
    assert first.output.value_estimates.shape == (4,)
    assert not jnp.array_equal(first.output.actions, second.output.actions)

    deterministic = eqx.nn.inference_mode(net)
    a = apply_batched(deterministic, state, obs, key=getkey()).output.actions
    b = apply_batched(deterministic, state, obs).output.actions
    assert jnp.array_equal(a, b)
    assert not net.action[1].inference  # the original is untouched


def test_filter_grad_reaches_both_ports(getkey):
    net = single_head(getkey())
    key, x = getkey(), jax.random.normal(getkey(), (5,))
    extras = net(net.initial_state(), x, key=key).extras

    @eqx.filter_grad
    def loss(net):
        out = net(net.initial_state(), x, extras, key=key)
        return out.output.loglikelihoods + out.output.value_estimates

    grads = loss(net)
    assert np.any(grads.action[0].kernel != 0.0)
    assert np.any(grads.value[1].kernel != 0.0)


def test_reset_and_update_statistics_recurse(getkey):
    class Count(AbstractStatefulModule):
        seen: jax.Array

        def initial_state(self):
            return jnp.zeros((), jnp.int32)

        def __call__(self, state, x, extras=None, *, key=None):
            return StatefulModuleOutput(state + 1, x, zero_loss(), {}, x)

        def update_statistics(self, extras):
            return Count(self.seen + extras.shape[0])

    count = Count(jnp.zeros((), jnp.int32))
    net = PPOAdapter(
        action=Sequential([count, Dense(2, 2, key=getkey()), NormalTanhSampler(0.0)]),
        value=Sequential([count, Dense(2, 1, key=getkey())]),
    )
    out = net(net.initial_state(), jnp.ones(2), key=getkey())
    assert out.next_state["action"][0] == 1 and out.next_state["value"][0] == 1
    assert net.reset_state(out.next_state) == net.initial_state()
    stacked = jax.tree.map(lambda e: jnp.stack([e] * 7), out.extras)
    updated = net.update_statistics(stacked)
    assert isinstance(updated, PPOAdapter)
    assert updated.action[0].seen == 7 and updated.value[0].seen == 7
    assert net.action[0].seen == 0
