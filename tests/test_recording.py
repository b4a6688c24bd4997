import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqx_ppo
from eqx_ppo.graph import PopulationGraph, PopulationGraphBuilder
from eqx_ppo.nn import (
    LSTM,
    Dense,
    Normalizer,
    NormalTanhSampler,
    Parallel,
    PPOAdapter,
    Sequential,
    apply_batched,
)
from eqx_ppo.nn._module import AbstractStatefulModule, StatefulModuleOutput, zero_loss
from eqx_ppo.recording import (
    ACTIVATION_KEY,
    Recorder,
    extract_activations,
    is_leaf_layer,
    is_recording,
    with_recording,
)
from tests._helpers import assert_ulp_close

OBS, ACT, B, T = 3, 2, 4, 3


def _graph(key) -> PopulationGraph:
    b = PopulationGraphBuilder()
    b.add_input("obs", OBS)
    b.add_population("hidden", 5, activation="tanh")
    b.add_output("v", 1)
    b.connect("obs", "hidden")
    b.connect("hidden", "hidden", delay=2)
    b.connect("hidden", "v")
    return b.finalize(key=key)


def _network(key) -> PPOAdapter:
    """A normaliser, an LSTM, a sampler and a recurrent graph as the critic."""
    k1, k2, k3, k4 = jax.random.split(key, 4)
    actor = Sequential(
        [
            Normalizer(OBS),
            Parallel(lstm=LSTM(OBS, 6, key=k1), ff=Dense(OBS, 2, key=k2)),
            _Pick("lstm"),
            Dense(6, 2 * ACT, key=k3),
            NormalTanhSampler(entropy_weight=0.01),
        ]
    )
    return PPOAdapter(action=actor, value=_graph(k4))


class _Pick(AbstractStatefulModule):
    """Selects one entry of a dict input (a tiny stateless leaf layer)."""

    name: str = eqx.field(static=True)

    def __call__(self, state, x, extras=None, *, key=None):
        return StatefulModuleOutput((), x[self.name], zero_loss(), {}, None)


class _Pair(AbstractStatefulModule):
    """A user-defined container: applies `layers[0]` then `layers[1]`."""

    layers: list

    def initial_state(self):
        return [layer.initial_state() for layer in self.layers]

    def __call__(self, state, x, extras=None, *, key=None):
        first = self.layers[0](state[0], x)
        second = self.layers[1](state[1], first.output)
        return StatefulModuleOutput(
            [first.next_state, second.next_state],
            second.output,
            zero_loss(),
            {"first": first.metrics, "second": second.metrics},
            None,
        )


def _strip_activations(metrics):
    if not isinstance(metrics, dict):
        return metrics
    return {k: _strip_activations(v) for k, v in metrics.items() if k != ACTIVATION_KEY}


@eqx.filter_jit
def _rollout(net, obs, key):
    """T steps for B envs: everything the network returns, stacked over time."""

    def step(state, inputs):
        x, step_key = inputs
        out = apply_batched(net, state, x, key=step_key)
        return out.next_state, out

    keys = jax.random.split(key, T)
    return jax.lax.scan(step, net.initialize_state(B), (obs, keys))[1]


def test_outputs_match_under_jit(getkey):
    net = _network(getkey())
    rec = with_recording(net)
    obs = jax.random.normal(getkey(), (T, B, OBS))
    key = getkey()
    ref = _rollout(net, obs, key)
    out = _rollout(rec, obs, key)
    # Same values; but the recorded activations are extra outputs of the
    # compiled program, which may then fuse (and round) differently. The
    # ordinary metrics are untouched; recording only adds activations.
    assert_ulp_close(out._replace(metrics=_strip_activations(out.metrics)), ref)


def test_activation_structure_and_values(getkey):
    net = _network(getkey())
    rec = with_recording(net)
    out = _rollout(rec, jax.random.normal(getkey(), (T, B, OBS)), getkey())
    acts = extract_activations(out.metrics)
    shapes = jax.tree.map(jnp.shape, acts)
    assert shapes == {
        "action": {
            0: (T, B, OBS),
            1: {"ff": (T, B, 2), "lstm": (T, B, 6)},
            2: (T, B, 6),
            3: (T, B, 2 * ACT),
            4: {"action": (T, B, ACT), "log_likelihood": (T, B)},
        },
        # The graph records every population, not only its output.
        "value": {"hidden": (T, B, 5), "obs": (T, B, OBS), "v": (T, B, 1)},
    }
    np.testing.assert_array_equal(acts["action"][4]["action"], out.output.actions)
    np.testing.assert_array_equal(
        acts["action"][4]["log_likelihood"], out.output.loglikelihoods
    )
    np.testing.assert_array_equal(
        acts["value"]["v"][..., 0], out.output.value_estimates["v"]
    )
    np.testing.assert_array_equal(acts["action"][1]["lstm"], acts["action"][2])
    # The LSTM's carry h is its output.
    np.testing.assert_array_equal(
        acts["action"][1]["lstm"], out.next_state["action"][1]["lstm"][0]
    )


def test_wraps_leaves_and_shares_parameters(getkey):
    net = _network(getkey())
    rec = with_recording(net)
    actor = rec.action.layers
    assert [type(layer) for layer in actor] == [
        Recorder,
        Parallel,
        Recorder,
        Recorder,
        Recorder,
    ]
    assert isinstance(actor[1].modules["lstm"], Recorder)
    assert isinstance(actor[1].modules["lstm"].layer, LSTM)
    assert actor[3].layer.kernel is net.action.layers[3].kernel
    # Graphs are flagged, not wrapped; their transforms stay as they are.
    assert isinstance(rec.value, PopulationGraph) and rec.value.record
    assert isinstance(rec.value.transforms["obs->hidden"], Dense)
    assert rec.value.transforms["obs->hidden"].kernel is (
        net.value.transforms["obs->hidden"].kernel
    )
    # The original is untouched.
    assert not is_recording(net)
    assert not net.value.record
    assert isinstance(net.action.layers[0], Normalizer)


def test_is_leaf_layer(getkey):
    net = _network(getkey())
    assert is_leaf_layer(net.action.layers[0])  # Normalizer (statistics inside)
    assert is_leaf_layer(net.action.layers[1].modules["lstm"])
    assert is_leaf_layer(net.action.layers[4])  # sampler
    assert not is_leaf_layer(net)
    assert not is_leaf_layer(net.action.layers[1])  # Parallel
    assert not is_leaf_layer(jnp.ones(3))


def test_user_defined_container_is_seen_through(getkey):
    pair = _Pair([Dense(2, 3, key=getkey()), Dense(3, 1, key=getkey())])
    assert not is_leaf_layer(pair)
    rec = with_recording(pair)
    assert isinstance(rec, _Pair)
    assert all(isinstance(layer, Recorder) for layer in rec.layers)
    out = rec(rec.initial_state(), jnp.ones(2))
    acts = extract_activations(out.metrics)
    assert jax.tree.map(jnp.shape, acts) == {"first": (3,), "second": (1,)}
    np.testing.assert_array_equal(acts["second"], out.output)


def test_recording_a_leaf_or_a_graph_directly(getkey):
    dense = Dense(2, 3, key=getkey())
    rec = with_recording(dense)
    assert isinstance(rec, Recorder) and rec.layer is dense
    graph = with_recording(_graph(getkey()))
    out = graph(graph.initial_state(), jnp.ones(OBS))
    assert set(extract_activations(out.metrics)) == {"obs", "hidden", "v"}


def test_double_recording_warns_and_returns_unchanged(getkey):
    rec = with_recording(_network(getkey()))
    with pytest.warns(UserWarning, match="already records"):
        again = with_recording(rec)
    assert again is rec
    assert isinstance(again.action.layers[0].layer, Normalizer)
    graph = with_recording(_graph(getkey()))
    with pytest.warns(UserWarning, match="already records"):
        assert with_recording(graph) is graph


def test_recorder_keeps_layer_metrics(getkey):
    sampler = Recorder(NormalTanhSampler(entropy_weight=0.01))
    out = sampler((), jnp.array([0.5, -0.5, 0.0, 1.0]), key=getkey())
    assert set(out.metrics) == {"mu", "sigma", ACTIVATION_KEY}
    assert out.metrics[ACTIVATION_KEY] is out.output


def test_update_statistics_through_recorder(getkey):
    net = _network(getkey())
    rec = with_recording(net)
    obs = jax.random.normal(getkey(), (T, B, OBS)) * 3.0 + 1.0
    extras = _rollout(rec, obs, getkey()).extras
    updated = rec.update_statistics(extras)
    expected = net.update_statistics(extras)
    normalizer = updated.action.layers[0]
    assert isinstance(normalizer, Recorder)
    assert is_recording(updated)
    for a, b in zip(
        jax.tree.leaves(normalizer.layer.statistics),
        jax.tree.leaves(expected.action.layers[0].statistics),
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)
    # The statistics did change, and the recording copy's source did not.
    assert not np.array_equal(
        normalizer.layer.statistics.mean, net.action.layers[0].statistics.mean
    )


def test_inference_mode_reaches_inside_recorders(getkey):
    rec = eqx.nn.inference_mode(with_recording(_network(getkey())))
    assert rec.action.layers[4].layer.inference
    obs = jax.random.normal(getkey(), (B, OBS))
    state = rec.initialize_state(B)
    call = eqx.filter_jit(apply_batched)
    a = call(rec, state, obs, key=getkey())
    b = call(rec, state, obs, key=getkey())
    np.testing.assert_array_equal(a.output.actions, b.output.actions)


def test_extract_activations_drops_plain_metrics():
    a0, a1 = jnp.ones((2, 3)), jnp.zeros((2, 4))
    metrics = {
        0: {ACTIVATION_KEY: a0, "entropy": jnp.array(1.0)},
        1: {"inner": {ACTIVATION_KEY: a1}, "loss": jnp.array(0.5)},
        2: {"only_scalar": jnp.array(0.5)},
    }
    acts = extract_activations(metrics)
    assert set(acts) == {0, 1} and set(acts[1]) == {"inner"}
    assert acts[0] is a0 and acts[1]["inner"] is a1
    assert extract_activations({"a": jnp.array(1.0)}) is None
    assert extract_activations({}) is None and extract_activations(None) is None


def test_extract_activations_declares_the_metrics_it_needs(getkey):
    rec = with_recording(
        eqx_ppo.nn.make_mlp_actor_critic(OBS, ACT, [4], [4], key=getkey())
    )
    out = eqx_ppo.nn.apply_batched(
        rec, rec.initialize_state(B), jnp.zeros((B, OBS)), key=getkey()
    )
    # The declared `Mapping | None`, checked at run time in the suite.
    for bad in (out, jnp.array(1.0)):
        with pytest.raises(TypeError, match="metrics"):
            extract_activations(bad)
    assert extract_activations(out.metrics) is not None


def test_seed_workflow(getkey):
    hidden = 5
    net = eqx_ppo.nn.make_mlp_actor_critic(
        OBS, ACT, [hidden, hidden], [hidden, hidden], key=getkey()
    )
    obs = jax.random.normal(getkey(), (B, OBS))

    rec = eqx.nn.inference_mode(with_recording(net))
    state = rec.initialize_state(B)
    out = eqx_ppo.nn.apply_batched(rec, state, obs, key=getkey())
    acts = extract_activations(out.metrics)

    assert jax.tree.map(jnp.shape, acts) == {
        0: (B, OBS),
        1: {
            "action": {
                0: (B, hidden),
                1: (B, hidden),
                2: (B, 2 * ACT),
                3: {"action": (B, ACT), "log_likelihood": (B,)},
            },
            "value": {0: (B, hidden), 1: (B, hidden), 2: (B, 1)},
        },
    }


@pytest.mark.parametrize("layer", [3, jnp.tanh], ids=["int", "function"])
def test_a_recorder_wraps_a_layer(layer):
    # The declared field type refuses anything else (checked at run time here).
    with pytest.raises(TypeError, match="layer"):
        eqx_ppo.Recorder(layer)
