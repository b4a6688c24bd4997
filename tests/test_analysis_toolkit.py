"""eqx_ppo.analysis: lesions as tree transforms, unit importance, PCA, probes."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqx_ppo
from eqx_ppo import analysis, nn
from eqx_ppo.analysis import _importance
from eqx_ppo.envs._recall import Recall
from eqx_ppo.graph import PopulationGraphBuilder
from tests._helpers import assert_ulp_close

X = jnp.array([1.0, -1.0])
# The hidden layer below maps X to X @ K + b:
#   [1 - 4 + 0.5, 2 - 5 + 0.25, 3 - 6 - 1] = [-2.5, -2.75, -4].
HIDDEN = np.array([-2.5, -2.75, -4.0], np.float32)


def known_dense() -> nn.Dense:
    dense = nn.Dense(2, 3, key=jax.random.key(0))
    return eqx.tree_at(
        lambda d: (d.kernel, d.bias),
        dense,
        (
            jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]),
            jnp.array([0.5, 0.25, -1.0]),
        ),
    )


def readout() -> nn.Dense:
    """out = h0 + 10 h1 + 100 h2."""
    dense = nn.Dense(3, 1, key=jax.random.key(1))
    return eqx.tree_at(
        lambda d: (d.kernel, d.bias),
        dense,
        (jnp.array([[1.0], [10.0], [100.0]]), jnp.zeros(1)),
    )


def call(net, x=X):
    return net(net.initial_state(), x).output


def leaves_equal(a, b) -> bool:
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(
        np.array_equal(x, y) for x, y in zip(la, lb, strict=True)
    )


def test_ablate_clamp_and_perturb_give_hand_computed_values():
    net = nn.Sequential([known_dense(), readout()])
    hidden = lambda n: n.layers[0]  # noqa: E731
    assert call(net) == -430.0  # -2.5 - 27.5 - 400
    # Units 0 and 2 held at 0: only 10 * -2.75 is left.
    assert call(analysis.ablate(net, hidden, [0, 2])) == -27.5
    mask = jnp.array([True, False, True])
    assert call(analysis.ablate(net, hidden, mask)) == -27.5
    # Held at 1 and 2: 1 - 27.5 + 200.
    assert call(analysis.clamp(net, hidden, [0, 2], [1.0, 2.0])) == 173.5
    assert call(analysis.clamp(net, hidden, mask, jnp.array([1.0, 9.0, 2.0]))) == 173.5
    # Unit 1 pushed by +0.5: -2.5 + 10 * -2.25 - 400.
    assert call(analysis.perturb(net, hidden, [1], 0.5)) == -425.0
    np.testing.assert_array_equal(
        call(analysis.ablate(nn.Sequential([known_dense()]), hidden, [1])),
        [-2.5, 0.0, -4.0],
    )


def test_every_unit_and_value_of_a_list_is_checked():
    # beartype checks one random item of a list per call; the lists are
    # checked whole, so the bad item is refused wherever it sits.
    net = nn.Sequential([known_dense(), readout()])
    hidden = lambda n: n.layers[0]  # noqa: E731
    for i in range(3):
        units, values = [0, 1, 2], [1.0, 2, 3.0]
        units[i], values[i] = "1", "2.0"
        with pytest.raises(TypeError, match="units"):
            analysis.ablate(net, hidden, units)
        with pytest.raises(TypeError, match="values"):
            analysis.clamp(net, hidden, [0, 1, 2], values)


def test_ablating_nothing_is_bit_identical_and_the_original_is_untouched(getkey):
    env = Recall()
    net = eqx_ppo.make_lstm_actor_critic(2, 1, 6, key=getkey())
    lstm = lambda n: n.layers[1].action.layers[0]  # noqa: E731
    before = jax.tree.map(jnp.copy, eqx.filter(net, eqx.is_array))
    key = getkey()
    reference, _ = eqx_ppo.record_activations_rollout(
        env, net, n_envs=4, max_episode_length=6, key=key
    )
    for units, site in (([], "output"), (jnp.zeros(6, bool), "carry")):
        lesioned = analysis.ablate(net, lstm, units, site=site)
        assert isinstance(lstm(lesioned), analysis.Intervention)
        acts, _ = eqx_ppo.record_activations_rollout(
            env, lesioned, n_envs=4, max_episode_length=6, key=key
        )
        assert leaves_equal(acts, reference)
    lesioned = analysis.ablate(net, lstm, [0, 1])
    assert isinstance(lstm(net), nn.LSTM)
    assert leaves_equal(before, eqx.filter(net, eqx.is_array))
    # The arrays are shared, not copied.
    assert lstm(lesioned).layer.kernel is lstm(net).kernel


CONTAINERS = {
    # name: (network, where, input, output with units 0 and 2 of `known_dense`
    # held at 0, given the other child's output `other`)
    "Sequential": (
        lambda other: nn.Sequential([known_dense(), nn.Scale(2.0)]),
        lambda n: n.layers[0],
        lambda x: x,
        lambda h, other: 2.0 * h,
    ),
    "Parallel": (
        lambda other: nn.Parallel(a=known_dense(), b=other),
        lambda n: n.modules["a"],
        lambda x: x,
        lambda h, other: {"a": h, "b": other},
    ),
    "Concat": (
        lambda other: nn.Concat(a=known_dense(), b=other),
        lambda n: n.modules["a"],
        lambda x: {"a": x, "b": x},
        lambda h, other: jnp.concatenate([h, other], axis=-1),
    ),
    "Map": (
        lambda other: nn.Map(a=known_dense(), b=other),
        lambda n: n.modules["a"],
        lambda x: {"a": x, "b": x},
        lambda h, other: {"a": h, "b": other},
    ),
    "Merge": (
        lambda other: nn.Merge(
            a=nn.Sequential([known_dense(), nn.Splitter(u=3)]),
            b=nn.Sequential([other, nn.Splitter(v=2)]),
        ),
        lambda n: n.modules["a"].layers[0],
        lambda x: x,
        lambda h, other: {"u": h, "v": other},
    ),
}


@pytest.mark.parametrize("kind", sorted(CONTAINERS))
def test_ablate_inside_every_container_eagerly_under_jit_and_vmap(kind, getkey):
    build, where, inputs, expected = CONTAINERS[kind]
    other = nn.Dense(2, 2, key=getkey())
    net = build(other)
    lesioned = analysis.ablate(net, where, [0, 2])
    held = HIDDEN * np.array([0.0, 1.0, 0.0], np.float32)
    want = expected(held, call(other))
    assert_ulp_close(call(lesioned, inputs(X)), want, n_ulp=0)
    jitted = eqx.filter_jit(lambda n, x: n(n.initial_state(), x).output)
    assert_ulp_close(jitted(lesioned, inputs(X)), want)
    # A batch of two envs, the second with twice the input: X @ K doubles.
    batch = jnp.stack([X, 2.0 * X])
    out = nn.apply_batched(lesioned, lesioned.initialize_state(2), inputs(batch))
    doubled = (2 * (HIDDEN - np.array([0.5, 0.25, -1.0])) + [0.5, 0.25, -1.0]) * [
        0,
        1,
        0,
    ]
    want = expected(
        np.stack([held, doubled.astype(np.float32)]),
        jax.vmap(lambda x: call(other, x))(batch),
    )
    assert_ulp_close(out.output, want)


def _graph(key):
    builder = PopulationGraphBuilder()
    builder.add_input("in", 2)
    builder.add_population("hidden", 3, activation="tanh")
    builder.add_output("out", 2)
    builder.connect("in", "hidden")
    builder.connect("hidden", "hidden", delay=1)
    builder.connect("hidden", "out")
    return builder.finalize(key=key)


def test_ablate_a_graph_population_holds_what_every_reader_sees(getkey):
    graph = _graph(getkey())
    net = nn.Sequential([graph])
    lesioned = analysis.ablate(net, lambda n: n.layers[0], [1], population="hidden")
    xs = jax.random.normal(getkey(), (3, 2))

    def linear(name, v):
        return graph.transforms[name]((), v).output

    # By hand: the hidden activity, unit 1 held at 0, is what the output and
    # the delayed self-connection read, one step later.
    held, expected = jnp.zeros(3), []
    for x in xs:
        hidden = jnp.tanh(linear("in->hidden", x) + linear("hidden->hidden@1", held))
        held = hidden.at[1].set(0.0)
        expected.append(linear("hidden->out", held))

    def run(network, xs):
        def step(state, x):
            out = network(state, x)
            return out.next_state, out.output["out"]

        return jax.lax.scan(step, network.initial_state(), xs)[1]

    assert_ulp_close(run(lesioned, xs), jnp.stack(expected))
    assert_ulp_close(eqx.filter_jit(run)(lesioned, xs), jnp.stack(expected))
    # Two envs at once: the second sees the inputs in reverse order.
    both = eqx.filter_vmap(run, in_axes=(None, 1), out_axes=1)(
        lesioned, jnp.stack([xs, xs[::-1]], axis=1)
    )
    assert_ulp_close(both[:, 0], jnp.stack(expected))
    assert not np.allclose(run(net, xs), jnp.stack(expected))
    # An output population is held in the graph's output itself.
    silent = analysis.ablate(net, lambda n: n.layers[0], [0, 1], population="out")
    np.testing.assert_array_equal(run(silent, xs), 0.0)
    with pytest.raises(ValueError, match="'hidden', 'in', 'out'"):
        analysis.ablate(net, lambda n: n.layers[0], [0], population="nope")


def test_carry_lesions_remove_the_memory_of_the_held_units(getkey):
    lstm = nn.LSTM(2, 4, key=getkey())
    net = nn.Sequential([lstm])
    xs = jax.random.normal(getkey(), (4, 2))

    def outputs(network):
        state, outs = network.initial_state(), []
        for x in xs:
            out = network(state, x)
            state, outs = out.next_state, [*outs, out.output]
        return jnp.stack(outs)

    # Every unit held: each step starts from zeros, as the first one does.
    amnesic = analysis.ablate(
        net, lambda n: n.layers[0], jnp.ones(4, bool), site="carry"
    )
    memoryless = jnp.stack([lstm(lstm.initial_state(), x).output for x in xs])
    assert_ulp_close(outputs(amnesic), memoryless, n_ulp=0)
    # Unit 2 held at 0.5 in both h and c before every step.
    held = analysis.clamp(net, lambda n: n.layers[0], [2], 0.5, site="carry")
    state, expected = lstm.initial_state(), []
    for x in xs:
        state = tuple(s.at[2].set(0.5) for s in state)
        out = lstm(state, x)
        state = out.next_state
        expected.append(out.output)
    assert_ulp_close(outputs(held), jnp.stack(expected), n_ulp=0)
    dense = nn.Sequential([known_dense()])
    with pytest.raises(ValueError, match="has no carry"):
        analysis.ablate(dense, lambda n: n.layers[0], [0], site="carry")


@pytest.mark.parametrize("site", ["output", "carry"])
def test_a_lesioned_network_replays_as_it_steps(site, getkey):
    net = nn.Sequential([nn.LSTM(2, 4, key=getkey()), nn.Dense(4, 3, key=getkey())])
    lesioned = analysis.ablate(net, lambda n: n.layers[0], [1, 3], site=site)
    n_steps, n_envs = 6, 3
    xs = jax.random.normal(getkey(), (n_steps, n_envs, 2))
    done = jnp.zeros((n_steps, n_envs), bool).at[2, 0].set(True).at[4, 2].set(True)
    state0 = lesioned.initialize_state(n_envs)
    replay = lesioned.replay(state0, xs, None, None, done)
    # The default replay scans the lesioned network's own __call__.
    stepped = nn.AbstractStatefulModule.replay(lesioned, state0, xs, None, None, done)
    assert_ulp_close(replay.output, stepped.output)
    plain = net.replay(state0, xs, None, None, done)
    assert not np.allclose(replay.output, plain.output)


def test_lesions_compose_with_recording_and_inference_mode(getkey):
    net = eqx_ppo.make_mlp_actor_critic(3, 2, [4], [4], key=getkey())
    hidden = lambda n: n.layers[1].action.layers[0]  # noqa: E731
    obs = jax.random.normal(getkey(), (5, 3))

    def run(network):
        network = eqx.nn.inference_mode(network)
        return nn.apply_batched(network, network.initialize_state(5), obs)

    lesioned = run(analysis.ablate(net, hidden, [1, 2]))
    recorded_after = run(eqx_ppo.with_recording(analysis.ablate(net, hidden, [1, 2])))
    recorded_before = run(analysis.ablate(eqx_ppo.with_recording(net), hidden, [1, 2]))
    plain = run(eqx_ppo.with_recording(net))
    for out in (recorded_after, recorded_before):
        assert leaves_equal(out.output, lesioned.output)
        acts = eqx_ppo.extract_activations(out.metrics)
        original = eqx_ppo.extract_activations(plain.metrics)
        # The lesioned layer records its own output; the next one reads the
        # held units as 0.
        assert leaves_equal(acts[1]["action"][0], original[1]["action"][0])
        assert not np.allclose(acts[1]["action"][1], original[1]["action"][1])
    sampler = lambda n: n.layers[1].action.layers[-1]  # noqa: E731
    inference = eqx.nn.inference_mode(analysis.ablate(net, hidden, [0]))
    assert sampler(inference).inference
    assert not sampler(net).inference


def test_intervention_values_are_never_trained_and_bad_units_are_named(getkey):
    net = nn.Sequential([known_dense(), readout()])
    clamped = analysis.clamp(net, lambda n: n.layers[0], [1], 2.0)
    spec = nn.trainable(clamped)
    assert spec.layers[0].values is False and spec.layers[0].units is False
    assert spec.layers[0].layer.kernel is True
    with pytest.raises(ValueError, match="mask of 4 units for a output of 3"):
        call(analysis.ablate(net, lambda n: n.layers[0], jnp.ones(4, bool)))
    with pytest.raises(eqx.EquinoxRuntimeError, match="outside the layer's 3 units"):
        call(analysis.ablate(net, lambda n: n.layers[0], [3]))
    with pytest.raises(ValueError, match="one per entry of `units`"):
        analysis.clamp(net, lambda n: n.layers[0], [0, 1], [1.0, 2.0, 3.0])


class CountedRecall(Recall):
    """Recall that counts how often its `step` is traced."""

    def step(self, state, action):
        TRACES.append(None)
        return super().step(state, action)


TRACES: list = []


@pytest.mark.parametrize("site", ["output", "carry"])
def test_unit_importance_equals_a_loop_of_ablate_and_eval_rollout(site, getkey):
    env = Recall()
    net = eqx_ppo.make_lstm_actor_critic(2, 1, 6, key=getkey())
    lstm = lambda n: n.layers[1].action.layers[0]  # noqa: E731
    key = getkey()
    importance = analysis.unit_importance(
        env, net, lstm, n_envs=16, max_episode_length=5, key=key, site=site
    )

    @eqx.filter_jit
    def mean_return(network):
        metrics = eqx_ppo.eval_rollout(
            env, eqx.nn.inference_mode(network), key, n_envs=16, max_episode_length=5
        )
        return metrics["eval/episode_reward/mean"]

    base = mean_return(net)
    loop = [
        base - mean_return(analysis.ablate(net, lstm, [i], site=site)) for i in range(6)
    ]
    assert importance.shape == (6,)
    # vmapped against one program per lesion: float rounding of returns ~5.
    np.testing.assert_allclose(importance, loop, rtol=0, atol=1e-5)
    assert np.max(np.abs(loop)) > 1e-3  # the lesions do change the return


def test_unit_importance_traces_the_evaluation_once_whatever_the_unit_count(
    getkey, monkeypatch
):
    """One traced evaluation for all lesions (a vmap), not one per unit."""
    traces = []

    def counted(*args, **kwargs):
        traces.append(None)
        return eqx_ppo.eval_rollout(*args, **kwargs)

    monkeypatch.setattr(_importance, "eval_rollout", counted)
    for units in (3, 9):
        traces.clear()
        net = eqx_ppo.make_lstm_actor_critic(2, 1, units, key=getkey())
        analysis.unit_importance(
            Recall(),
            net,
            lambda n: n.layers[1].action.layers[0],
            n_envs=4,
            max_episode_length=5,
            key=getkey(),
        )
        assert len(traces) == 1


def test_unit_importance_needs_one_number_of_units(getkey):
    env = Recall()
    two_sizes = nn.Sequential(
        [nn.LSTM(2, 4, key=getkey()), nn.LSTM(4, 3, key=getkey())]
    )
    net = eqx_ppo.make_lstm_actor_critic(2, 1, 4, key=getkey())
    kwargs = dict(n_envs=2, max_episode_length=5, key=getkey())
    with pytest.raises(TypeError, match=r"carry is .* not arrays of one number"):
        analysis.unit_importance(env, two_sizes, lambda n: n, site="carry", **kwargs)
    with pytest.raises(TypeError, match=r"output is .* not arrays of one number"):
        # The actor ends in a sampler, whose output is a dict.
        analysis.unit_importance(env, net, lambda n: n.layers[1].action, **kwargs)


def test_unit_importance_counts_the_units_of_a_containers_output(getkey):
    net = eqx_ppo.make_lstm_actor_critic(2, 1, 4, key=getkey())
    critic = lambda n: n.layers[1].value  # noqa: E731  (a Sequential, output [1])
    importance = analysis.unit_importance(
        Recall(), net, critic, n_envs=2, max_episode_length=5, key=getkey()
    )
    # Deterministic evaluation never reads the critic.
    np.testing.assert_array_equal(importance, np.zeros(1))


def _masked_reference(acts, dones, k):
    rows = np.asarray(acts, np.float64)[~np.asarray(dones)]
    mean = rows.mean(axis=0)
    _, s, vt = np.linalg.svd(rows - mean, full_matrices=False)
    return mean, s**2 / np.sum(s**2), vt[:k]


def test_pca_matches_numpy_svd_on_the_live_steps(getkey):
    n_steps, n_envs, units = 7, 5, 6
    # Correlated activity: 6 units driven by 3 latent signals plus noise.
    latent = jax.random.normal(getkey(), (n_steps, n_envs, 3))
    acts = latent @ jax.random.normal(getkey(), (3, units)) + 0.1 * jax.random.normal(
        getkey(), (n_steps, n_envs, units)
    )
    dones = jnp.arange(n_steps)[:, None] >= jnp.array([7, 3, 5, 6, 2])[None]
    result = analysis.pca(acts, dones, 3)
    mean, ratio, components = _masked_reference(acts, dones, 3)
    np.testing.assert_allclose(result.mean, mean, atol=1e-5)
    np.testing.assert_allclose(result.explained_variance_ratio, ratio[:3], rtol=1e-4)
    signs = np.sign(np.sum(np.asarray(result.components) * components, axis=1))
    np.testing.assert_allclose(
        result.components, signs[:, None] * components, atol=1e-4
    )
    np.testing.assert_allclose(
        result.projections,
        (np.asarray(acts) - mean) @ np.asarray(result.components).T,
        atol=1e-4,
    )
    # Each component's largest entry is positive: a deterministic sign.
    top = np.take_along_axis(
        np.asarray(result.components),
        np.argmax(np.abs(result.components), axis=1)[:, None],
        axis=1,
    )
    assert np.all(top > 0)
    with pytest.raises(ValueError, match="1 to 6 components"):
        analysis.pca(acts, dones, 7)


def test_pca_masked_steps_never_contribute(getkey):
    acts = jax.random.normal(getkey(), (6, 4, 5))
    dones = jax.random.bernoulli(getkey(), 0.3, (6, 4)).at[0].set(False)
    garbage = jnp.where(dones[..., None], jnp.nan, acts)
    huge = jnp.where(dones[..., None], 1e6, acts)
    clean = analysis.pca(acts, dones, 2)
    for other in (garbage, huge):
        result = analysis.pca(other, dones, 2)
        for field in ("components", "explained_variance_ratio", "mean"):
            np.testing.assert_array_equal(getattr(result, field), getattr(clean, field))
        live = ~np.asarray(dones)
        np.testing.assert_array_equal(
            np.asarray(result.projections)[live], np.asarray(clean.projections)[live]
        )


def _ridge_reference(features, labels, key, test_fraction, ridge):
    """The probe in float64 NumPy, on the same split."""
    n = features.shape[0]
    n_test = round(n * test_fraction)
    order = np.asarray(jax.random.permutation(key, n))
    test, train = order[:n_test], order[n_test:]
    x = np.asarray(features, np.float64)
    mean, std = x[train].mean(0), x[train].std(0)
    x = np.concatenate([(x - mean) / std, np.ones((n, 1))], axis=1)
    penalty = ridge * np.diag([1.0] * (x.shape[1] - 1) + [0.0])
    y = np.asarray(labels, np.float64).reshape(n, -1)
    w = np.linalg.solve(
        x[train].T @ x[train] / len(train) + penalty, x[train].T @ y[train] / len(train)
    )
    residual = np.sum((y[test] - x[test] @ w) ** 2, 0)
    spread = np.sum((y[test] - y[test].mean(0)) ** 2, 0)
    return np.mean(1 - residual / spread)


def test_linear_probe_scores_real_targets_by_held_out_r2(getkey):
    features = jax.random.normal(getkey(), (200, 4))
    signal = features @ jnp.array([1.0, -2.0, 0.0, 0.5]) + 3.0
    noisy = signal + 0.5 * jax.random.normal(getkey(), (200,))
    key = getkey()
    score = analysis.linear_probe(features, noisy, key=key)
    np.testing.assert_allclose(
        score, _ridge_reference(features, noisy, key, 0.25, 1e-3), atol=1e-5
    )
    assert 0.9 < score < 0.99  # variance 5.25 against noise 0.25
    assert analysis.linear_probe(features, signal, key=key) > 0.9999
    unrelated = jax.random.normal(getkey(), (200, 2))
    assert analysis.linear_probe(features, unrelated, key=key) < 0.1


def test_linear_probe_scores_classes_by_held_out_accuracy(getkey):
    n = 400
    labels = jax.random.bernoulli(getkey(), 0.5, (n,))
    signed = jnp.where(labels, 1, -1)  # any integer labels, here -1 and 1
    features = jnp.concatenate(
        [
            signed[:, None] + 0.3 * jax.random.normal(getkey(), (n, 1)),
            jax.random.normal(getkey(), (n, 5)),
        ],
        axis=1,
    )
    key = getkey()
    accuracy = analysis.linear_probe(features, signed, key=key, test_fraction=0.2)
    assert accuracy == 1.0  # separated by 1 / 0.3 standard deviations
    assert analysis.linear_probe(features, labels, key=key) == 1.0
    # Three classes along one axis, read out one-vs-rest.
    three = jax.random.randint(getkey(), (n,), 0, 3)
    along = jax.nn.one_hot(three, 3) * 4.0 + 0.3 * jax.random.normal(getkey(), (n, 3))
    assert analysis.linear_probe(along, three, key=key) == 1.0
    # Features that say nothing about the labels: chance, on 100 held-out
    # samples (accuracy is a multiple of 1/100).
    noise = jax.random.normal(getkey(), (n, 6))
    chance = analysis.linear_probe(noise, signed, key=key)
    assert 0.35 <= chance <= 0.65
    assert float(chance * 100) == round(float(chance * 100))
    constant = jnp.ones((n, 2))
    assert 0.35 <= analysis.linear_probe(constant, signed, key=key) <= 0.65
