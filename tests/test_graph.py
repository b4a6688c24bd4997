import dataclasses
import zlib

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from eqx_ppo.graph import PopulationGraph, PopulationGraphBuilder
from eqx_ppo.nn import AbstractStatistics, Dense, apply_batched
from eqx_ppo.nn._module import (
    AbstractStatefulModule,
    StatefulModuleOutput,
    reset_where,
    zero_loss,
)
from eqx_ppo.recording import ACTIVATION_KEY


class _Scale(AbstractStatefulModule):
    """Multiplies by a fixed factor: a transform whose effect is hand-computable."""

    factor: float = eqx.field(static=True, default=1.0)

    def __call__(self, state, x, extras=None, *, key=None):
        return StatefulModuleOutput((), self.factor * x, zero_loss(), {}, None)


class _Total(AbstractStatistics):
    value: jax.Array


class _Noisy(AbstractStatefulModule):
    """Adds replayable noise; carry counts calls; penalises sum(x**2).

    Exercises every channel a transform can use: carry, extras, regularisation,
    metrics and statistics (the sum of all noise it was given back).
    """

    total: _Total

    def __init__(self):
        self.total = _Total(jnp.zeros((), jnp.float32))

    def initial_state(self):
        return jnp.zeros((), jnp.float32)

    def __call__(self, state, x, extras=None, *, key=None):
        noise = jax.random.normal(key, x.shape) if extras is None else extras
        count = state + 1.0
        return StatefulModuleOutput(
            count, x + noise, jnp.sum(x**2), {"count": count}, noise
        )

    def update_statistics(self, extras):
        return eqx.tree_at(
            lambda m: m.total.value, self, self.total.value + jnp.sum(extras)
        )


def _delay_graph() -> PopulationGraph:
    """A chain x -(0)-> a -(1)-> b -(3)-> c, a -(3)-> d, and s = a + s(t-1).

    Every population has one unit and every transform is the identity, so with
    x_t = t + 1 (t = 0, 1, ...):
      a_t = x_t,  b_t = a_{t-1},  c_t = b_{t-3} = x_{t-4},  d_t = x_{t-3},
      s_t = a_t + s_{t-1} (running sum); zeros before a buffer fills.
    """
    b = PopulationGraphBuilder()
    b.add_input("x", 1, input_from="x")
    b.add_population("a", 1)
    b.add_population("b", 1)
    b.add_output("c", 1)
    b.add_output("d", 1)
    b.add_output("s", 1)
    b.connect("x", "a", transform=_Scale())
    b.connect("a", "b", transform=_Scale(), delay=1)
    b.connect("b", "c", transform=_Scale(), delay=3)
    b.connect("a", "d", transform=_Scale(), delay=3)
    b.connect("a", "s", transform=_Scale())
    b.connect("s", "s", transform=_Scale(), delay=1)
    graph = b.finalize(key=jax.random.key(0))
    return dataclasses.replace(graph, record=True)


_DELAY_EXPECTED = {
    # t:        0  1  2   3   4   5   6
    "x": [1, 2, 3, 4, 5, 6, 7],
    "a": [1, 2, 3, 4, 5, 6, 7],
    "b": [0, 1, 2, 3, 4, 5, 6],  # a one step ago
    "c": [0, 0, 0, 0, 1, 2, 3],  # b three steps ago = x four steps ago
    "d": [0, 0, 0, 1, 2, 3, 4],  # a three steps ago
    "s": [1, 3, 6, 10, 15, 21, 28],  # running sum of a
}


def _run(graph, state, xs):
    """Step `graph` over `xs` (one env); returns recorded activities per step."""
    trace = []
    for x in xs:
        out = graph(state, {"x": jnp.array([x], jnp.float32)})
        trace.append({k: float(v[0]) for k, v in out.metrics[ACTIVATION_KEY].items()})
        state = out.next_state
    return trace, state


def test_delays_step_by_step():
    graph = _delay_graph()
    assert [p.buffer_length for p in graph.populations] == [0, 3, 3, 0, 0, 1]
    trace, _ = _run(graph, graph.initial_state(), range(1, 8))
    for name, expected in _DELAY_EXPECTED.items():
        assert [step[name] for step in trace] == expected, name


def test_outputs_are_keyed_by_output_to():
    graph = _delay_graph()
    out = graph(graph.initial_state(), {"x": jnp.array([5.0])})
    assert set(out.output) == {"c", "d", "s"}
    assert out.output["s"].shape == (1,)

    b = PopulationGraphBuilder()
    b.add_input("in", 2)
    b.add_output("motor", 2, output_to="action")
    b.connect("in", "motor", transform=_Scale(2.0))
    graph = b.finalize(key=jax.random.key(0))
    out = graph(graph.initial_state(), jnp.array([1.0, -1.0]))
    # input_from=None reads the whole (array) observation; 2 * [1, -1].
    np.testing.assert_array_equal(out.output["action"], [2.0, -2.0])
    assert out.metrics == {}  # record is off by default


def test_reset_state_empties_buffers_and_restarts():
    graph = _delay_graph()
    _, state = _run(graph, graph.initial_state(), range(1, 6))
    assert float(jnp.abs(state["buffers"]["a"][0]).sum()) > 0
    fresh = graph.reset_state(state)
    assert jax.tree.all(
        jax.tree.map(
            lambda f, i: bool(jnp.array_equal(f, i)), fresh, graph.initial_state()
        )
    )
    trace, _ = _run(graph, fresh, range(1, 8))
    assert [step["c"] for step in trace] == _DELAY_EXPECTED["c"]


def test_activation_applied_once_to_the_sum():
    b = PopulationGraphBuilder()
    b.add_input("u", 2, input_from="u")
    b.add_input("v", 2, input_from="v")
    b.add_output("h", 2, activation="tanh")
    b.connect("u", "h", transform=_Scale())
    b.connect("v", "h", transform=_Scale(3.0))
    graph = b.finalize(key=jax.random.key(0))
    u = jnp.array([0.5, -1.0])
    v = jnp.array([0.25, 0.5])
    out = graph(graph.initial_state(), {"u": u, "v": v})
    # tanh(u + 3 v) = tanh([1.25, 0.5]), not tanh(u) + tanh(3 v).
    np.testing.assert_allclose(out.output["h"], jnp.tanh(jnp.array([1.25, 0.5])))


def test_input_population_sums_observation_and_connections():
    b = PopulationGraphBuilder()
    b.add_input("x", 1, input_from="x")
    b.connect("x", "x", transform=_Scale(0.5), delay=1)
    b.add_output("o", 1)
    b.connect("x", "o", transform=_Scale())
    graph = b.finalize(key=jax.random.key(0))
    state = graph.initial_state()
    outs = []
    for x in (2.0, 2.0, 2.0):
        out = graph(state, {"x": jnp.array([x])})
        outs.append(float(out.output["o"][0]))
        state = out.next_state
    # x_t = obs + 0.5 x_{t-1}: 2, 2 + 1 = 3, 2 + 1.5 = 3.5.
    assert outs == [2.0, 3.0, 3.5]


def test_default_transform_is_linear_dense():
    b = PopulationGraphBuilder()
    b.add_input("x", 4, input_from="x")
    b.add_output("y", 3)
    b.connect("x", "y")
    graph = b.finalize(key=jax.random.key(1))
    dense = graph.transforms["x->y"]
    assert isinstance(dense, Dense)
    assert (dense.in_size, dense.out_size) == (4, 3)
    x = jnp.arange(4.0)
    out = graph(graph.initial_state(), {"x": x})
    np.testing.assert_allclose(out.output["y"], x @ dense.kernel + dense.bias)


def test_reciprocal_adds_both_directions_with_own_dense():
    b = PopulationGraphBuilder()
    b.add_input("a", 2, input_from="a")
    b.add_output("b", 3)
    b.connect("a", "b", delay=1, reciprocal=True)
    graph = b.finalize(key=jax.random.key(0))
    assert [(c.name, c.src, c.dst, c.delay) for c in graph.connections] == [
        ("a->b@1", "a", "b", 1),
        ("b->a@1", "b", "a", 1),
    ]
    assert graph.transforms["a->b@1"].kernel.shape == (2, 3)
    assert graph.transforms["b->a@1"].kernel.shape == (3, 2)


def test_topological_order_ignores_insertion_order_of_sources():
    b = PopulationGraphBuilder()
    b.add_output("out", 1)
    b.add_population("mid", 1)
    b.add_input("in", 1)
    b.connect("mid", "out")
    b.connect("in", "mid")
    b.connect("out", "mid", delay=2)
    graph = b.finalize(key=jax.random.key(0))
    assert graph.order == ("in", "mid", "out")


def test_delay_zero_cycle_names_the_cycle():
    b = PopulationGraphBuilder()
    for name in ("in", "a", "b", "c", "after"):
        b.add_population(name, 1)
    b.add_output("o", 1)
    b.connect("in", "a")
    b.connect("a", "b")
    b.connect("b", "c")
    b.connect("c", "a")
    b.connect("c", "after")
    with pytest.raises(ValueError, match="delay-0 cycle a -> b -> c -> a"):
        b.finalize(key=jax.random.key(0))

    b = PopulationGraphBuilder()
    b.add_output("o", 1)
    b.connect("o", "o")
    with pytest.raises(ValueError, match="delay-0 cycle o -> o"):
        b.finalize(key=jax.random.key(0))


def test_builder_errors():
    b = PopulationGraphBuilder()
    b.add_input("a", 2, input_from="a")
    b.add_output("o", 2)
    with pytest.raises(ValueError, match="already exists"):
        b.add_population("a", 2)
    with pytest.raises(ValueError, match="already writes that output key"):
        b.add_output("o2", 2, output_to="o")
    with pytest.raises(ValueError, match="unknown destination population 'nope'"):
        b.connect("a", "nope")
    with pytest.raises(ValueError, match="unknown source population 'nope'"):
        b.connect("nope", "a")
    with pytest.raises(ValueError, match="needs transform=None"):
        b.connect("a", "o", transform=_Scale(), reciprocal=True)
    with pytest.raises(ValueError, match="delay must be >= 0"):
        b.connect("a", "o", delay=-1)
    # Wrong types: our TypeError, or the runtime type checker's when it runs.
    with pytest.raises(TypeError):
        b.connect("a", "o", delay=1.0)
    with pytest.raises(TypeError):
        b.connect("a", "o", transform=jnp.tanh)
    b.connect("a", "o")
    with pytest.raises(ValueError, match="connection named 'a->o' already exists"):
        b.connect("a", "o")
    b.connect("a", "o", name="a->o again")
    b.finalize(key=jax.random.key(0))
    with pytest.raises(RuntimeError, match="already finalized"):
        b.add_population("p", 2)
    with pytest.raises(RuntimeError, match="already finalized"):
        b.add_input("i", 2)
    with pytest.raises(RuntimeError, match="already finalized"):
        b.add_output("q", 2)
    with pytest.raises(RuntimeError, match="already finalized"):
        b.connect("a", "o", delay=1)
    with pytest.raises(RuntimeError, match="already finalized"):
        b.finalize(key=jax.random.key(0))


def test_a_failed_reciprocal_connect_adds_neither_direction():
    b = PopulationGraphBuilder()
    b.add_input("a", 2, input_from="a")
    b.add_population("h", 3)
    b.add_output("m", 2)
    b.connect("a", "h").connect("h", "m").connect("m", "h", delay=1)
    taken = r"a connection named '{}' already exists; .* connect each direction"
    with pytest.raises(
        ValueError, match=r"connect\('m', 'h'\): " + taken.format("m->h@1")
    ):
        b.connect("h", "m", delay=1, reciprocal=True)
    b.connect("h", "m", delay=1)  # the forward half was not left behind
    # A self-connection is its own reverse.
    with pytest.raises(
        ValueError, match=r"connect\('m', 'm'\): " + taken.format("m->m@1")
    ):
        b.connect("m", "m", delay=1, reciprocal=True)
    graph = b.finalize(key=jax.random.key(0))
    assert sorted(graph.transforms) == ["a->h", "h->m", "h->m@1", "m->h@1"]


def test_finalize_errors():
    with pytest.raises(ValueError, match="no output population"):
        PopulationGraphBuilder().finalize(key=jax.random.key(0))
    with pytest.raises(ValueError, match="no output population"):
        PopulationGraphBuilder().add_input("a", 1).finalize(key=jax.random.key(0))

    b = PopulationGraphBuilder().add_input("a", 1).add_input("b", 1, input_from="b")
    with pytest.raises(ValueError, match="cannot be both"):
        b.add_output("o", 1).finalize(key=jax.random.key(0))

    b = PopulationGraphBuilder().add_input("a", 2).add_output("o", 3)
    b.connect("a", "o", transform=_Scale())
    with pytest.raises(ValueError, match=r"'a->o'.*must output shape \(3,\)"):
        b.finalize(key=jax.random.key(0))

    b = PopulationGraphBuilder().add_input("a", 2).add_output("o", 3)
    b.connect("a", "o", transform=Dense(5, 3, key=jax.random.key(0)))
    with pytest.raises(ValueError, match=r"Dense expects one env's input of shape"):
        b.finalize(key=jax.random.key(0))
    b = PopulationGraphBuilder().add_input("a", 1).add_output(ACTIVATION_KEY, 1)
    with pytest.raises(ValueError, match="reserved for recorded activations"):
        b.connect("a", ACTIVATION_KEY).finalize(key=jax.random.key(0))
    # A failed finalize leaves the builder open for a fix.
    b = PopulationGraphBuilder().add_input("a", 1)
    with pytest.raises(ValueError):
        b.finalize(key=jax.random.key(0))
    b.add_output("o", 1).connect("a", "o").finalize(key=jax.random.key(0))


def test_bad_observation_errors():
    graph = _delay_graph()
    with pytest.raises(ValueError, match=r"reads obs\['x'\]"):
        graph(graph.initial_state(), {"y": jnp.zeros(1)})
    with pytest.raises(
        ValueError, match=r"shape \(1,\) for one env; got shape \(4, 1\)"
    ):
        graph(graph.initial_state(), {"x": jnp.zeros((4, 1))})
    b = PopulationGraphBuilder().add_input("a", 1).add_output("o", 1)
    whole = b.connect("a", "o").finalize(key=jax.random.key(0))
    with pytest.raises(ValueError, match="reads the whole observation"):
        whole(whole.initial_state(), {"a": jnp.zeros(1)})


def _noisy_graph() -> PopulationGraph:
    b = PopulationGraphBuilder()
    b.add_input("in", 2)
    b.add_population("h", 2, activation="tanh")
    b.add_output("o", 2)
    b.connect("in", "h", transform=_Noisy(), name="noisy")
    b.connect("h", "h", delay=1)
    b.connect("h", "o")
    return b.finalize(key=jax.random.key(3))


def test_transform_channels_are_routed():
    graph = _noisy_graph()
    x = jnp.array([1.0, -2.0])
    out = graph(graph.initial_state(), x, key=jax.random.key(5))
    # Regularisation: the noisy transform's sum(x**2) = 1 + 4 (Dense adds 0).
    assert out.regularization_loss.shape == ()
    assert float(out.regularization_loss) == 5.0
    assert out.metrics == {"noisy": {"count": 1.0}}
    assert float(out.next_state["transforms"]["noisy"]) == 1.0
    assert set(out.extras) == {"noisy", "h->h@1", "h->o"}
    assert out.extras["h->o"] is None

    again = graph(graph.initial_state(), x, key=jax.random.key(5))
    np.testing.assert_array_equal(again.output["o"], out.output["o"])
    replay = graph(graph.initial_state(), x, out.extras, key=jax.random.key(9))
    np.testing.assert_array_equal(replay.output["o"], out.output["o"])
    fresh = graph(graph.initial_state(), x, key=jax.random.key(9))
    assert not np.array_equal(fresh.output["o"], out.output["o"])

    reset = graph.reset_state(out.next_state)
    assert float(reset["transforms"]["noisy"]) == 0.0


def test_transforms_get_their_keys_by_name_whatever_the_build_order():
    """Two noisy connections added in reverse name order: each gets the same
    noise eagerly, under `jit` and after a pytree round trip (which sorts the
    transforms' dict), so the loss replays the rollout's noise."""
    b = PopulationGraphBuilder()
    b.add_input("s", 2)
    b.add_output("m", 2)
    b.add_output("n", 2)
    b.connect("s", "m", name="zz", transform=_Noisy())
    b.connect("s", "n", name="aa", transform=_Noisy())
    graph = b.finalize(key=jax.random.key(0))
    x, key = jnp.array([1.0, -2.0]), jax.random.key(7)
    eager = graph(graph.initial_state(), x, key=key)
    jitted = eqx.filter_jit(lambda g, s, x, k: g(s, x, key=k))(
        graph, graph.initial_state(), x, key
    )
    mapped = jax.tree.map(lambda leaf: leaf, graph)
    round_trip = mapped(mapped.initial_state(), x, key=key)
    for other in (jitted, round_trip):
        for name in ("aa", "zz"):
            np.testing.assert_allclose(other.extras[name], eager.extras[name], 1e-6)
    # As in the named containers: the connection's name folded into the key.
    for name in ("aa", "zz"):
        own = jax.random.fold_in(key, zlib.crc32(name.encode()))
        np.testing.assert_allclose(eager.extras[name], jax.random.normal(own, (2,)))


def test_update_statistics_reaches_transforms():
    graph = _noisy_graph()
    extras = {"noisy": jnp.ones((3, 4, 2)), "h->h@1": None, "h->o": None}
    updated = graph.update_statistics(extras)
    # 3 * 4 * 2 ones.
    assert float(updated.transforms["noisy"].total.value) == 24.0
    assert float(graph.transforms["noisy"].total.value) == 0.0
    assert updated.transforms["h->o"] is graph.transforms["h->o"]


def test_all_none_extras_collapse_to_none():
    graph = _delay_graph()
    assert graph(graph.initial_state(), {"x": jnp.ones(1)}).extras is None


def test_regularisation_is_per_env_under_vmap():
    graph = _noisy_graph()
    x = jnp.array([1.0, -2.0])
    single = graph(graph.initial_state(), x, key=jax.random.key(0))
    for batch in (1, 4):
        out = apply_batched(
            graph,
            graph.initialize_state(batch),
            jnp.broadcast_to(x, (batch, 2)),
            key=jax.random.key(0),
        )
        # One scalar per env, each the single-env value: not summed over envs.
        assert out.regularization_loss.shape == (batch,)
        np.testing.assert_array_equal(
            out.regularization_loss, jnp.full((batch,), single.regularization_loss)
        )


def test_vmap_equals_loop():
    graph = _noisy_graph()
    xs = jnp.arange(6.0).reshape(3, 2)
    key = jax.random.key(2)
    batched = apply_batched(graph, graph.initialize_state(3), xs, key=key)
    for i, k in enumerate(jax.random.split(key, 3)):
        single = graph(graph.initial_state(), xs[i], key=k)
        np.testing.assert_allclose(
            batched.output["o"][i], single.output["o"], atol=1e-6
        )


def test_scan_with_per_env_carry_reset():
    graph = _delay_graph()
    xs = jnp.broadcast_to(jnp.arange(1.0, 8.0)[:, None, None], (7, 2, 1))
    # Env 0's episode ends after step 2, so its carry resets before step 3.
    dones = jnp.zeros((7, 2), bool).at[3, 0].set(True)

    @eqx.filter_jit
    def rollout(graph, state, xs, dones):
        def step(state, inputs):
            x, done = inputs
            state = jax.vmap(lambda s, d: reset_where(graph, d, s))(state, done)
            out = jax.vmap(lambda s, xi: graph(s, {"x": xi}))(state, x)
            return out.next_state, out.metrics[ACTIVATION_KEY]

        return jax.lax.scan(step, state, (xs, dones))[1]

    acts = rollout(graph, graph.initialize_state(2), xs, dones)
    # Env 1 never resets; env 0 restarts at step 3, seeing x = 4, 5, 6, 7 as a
    # fresh episode: s = 4, 9, 15, 22; d = 0, 0, 0, 4; b = 0, 4, 5, 6.
    for name, expected in _DELAY_EXPECTED.items():
        assert acts[name][:, 1, 0].tolist() == expected, name
    assert acts["s"][:, 0, 0].tolist() == [1, 3, 6, 4, 9, 15, 22]
    assert acts["d"][:, 0, 0].tolist() == [0, 0, 0, 0, 0, 0, 4]
    assert acts["b"][:, 0, 0].tolist() == [0, 1, 2, 0, 4, 5, 6]


def _dense_recurrent_graph(key) -> PopulationGraph:
    b = PopulationGraphBuilder()
    b.add_input("x", 2)
    b.add_population("h", 3, activation="tanh")
    b.add_output("o", 1)
    b.connect("x", "h")
    b.connect("h", "h", delay=1)
    b.connect("h", "o")
    return b.finalize(key=key)


def test_grad_through_time_matches_reference(getkey):
    graph = _dense_recurrent_graph(getkey())
    xs = jax.random.normal(getkey(), (4, 2))

    def graph_loss(graph):
        def step(state, x):
            out = graph(state, x)
            return out.next_state, out.output["o"][0]

        return jnp.sum(jax.lax.scan(step, graph.initial_state(), xs)[1] ** 2)

    def reference_loss(graph):
        win, wrec, wout = (graph.transforms[n] for n in ("x->h", "h->h@1", "h->o"))
        h = jnp.zeros(3)
        total = jnp.zeros(())
        for x in xs:
            h = jnp.tanh(x @ win.kernel + win.bias + h @ wrec.kernel + wrec.bias)
            total = total + (h @ wout.kernel + wout.bias)[0] ** 2
        return total

    np.testing.assert_allclose(graph_loss(graph), reference_loss(graph), rtol=1e-5)
    grads = eqx.filter_grad(graph_loss)(graph)
    expected = eqx.filter_grad(reference_loss)(graph)
    for got, want in zip(
        jax.tree.leaves(grads), jax.tree.leaves(expected), strict=True
    ):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    assert float(jnp.abs(grads.transforms["h->h@1"].kernel).sum()) > 0


def test_compiles_once(getkey):
    @eqx.filter_jit
    @eqx.debug.assert_max_traces(max_traces=1)
    def step(graph, state, x):
        return graph(state, x)

    graph = _dense_recurrent_graph(getkey())
    state = graph.initial_state()
    for _ in range(3):
        state = step(graph, state, jax.random.normal(getkey(), (2,))).next_state
    # New parameter values, same structure: no retrace.
    step(_dense_recurrent_graph(getkey()), state, jnp.zeros(2))


def test_unreached_outputs_are_rejected():
    b = PopulationGraphBuilder().add_input("s", 2).add_population("h", 4)
    b.add_output("m", 3).connect("h", "m")
    with pytest.raises(ValueError, match="output population 'm' is not reached"):
        b.finalize(key=jax.random.key(0))
    b = PopulationGraphBuilder().add_output("m", 2)
    with pytest.raises(ValueError, match="'m' is not reached.*add_input"):
        b.finalize(key=jax.random.key(0))
    b = PopulationGraphBuilder().add_input("s", 1).add_output("m", 1)
    b.add_output("n", 1).add_output("o", 1).connect("s", "o")
    with pytest.raises(ValueError, match="populations 'm', 'n' are not reached"):
        b.finalize(key=jax.random.key(0))
    # Reached only through a delayed connection, and an output feeding an output.
    b = PopulationGraphBuilder().add_input("s", 1).add_population("h", 1)
    b.add_output("m", 1).add_output("n", 1)
    b.connect("s", "h", delay=2).connect("h", "m").connect("m", "n", delay=1)
    b.finalize(key=jax.random.key(0))


@pytest.mark.parametrize(
    "key", [0, jax.random.split(jax.random.key(0)), jax.random.PRNGKey(0)]
)
def test_finalize_declares_one_typed_key(key):
    # Checked at run time in the suite: an int, two keys or raw key data are
    # refused by the declared `Key[Array, ""]`.
    b = PopulationGraphBuilder().add_input("s", 1).add_output("m", 1)
    with pytest.raises(TypeError, match="key"):
        b.connect("s", "m").finalize(key=key)
