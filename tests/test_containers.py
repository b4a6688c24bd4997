"""Containers route state, extras, metrics, keys and losses to their children."""

import zlib
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jaxtyping import Array, Float

from eqx_ppo.nn import (
    AbstractStatefulModule,
    AbstractStatistics,
    Concat,
    Dense,
    Map,
    Merge,
    Parallel,
    Sequential,
    StatefulModuleOutput,
)
from eqx_ppo.nn._module import AbstractLayerWrapper, reset_where, zero_loss


class Affine(AbstractStatefulModule):
    """`x * scale + shift`, with a trainable scale; metrics report the input sum."""

    scale: Float[Array, ""]
    shift: float = eqx.field(static=True, default=0.0)

    def __call__(self, state, x, extras=None, *, key=None):
        del extras, key
        return StatefulModuleOutput(
            state, x * self.scale + self.shift, zero_loss(), {"in": jnp.sum(x)}, None
        )


def affine(scale: float, shift: float = 0.0) -> Affine:
    return Affine(jnp.asarray(scale, jnp.float32), shift)


class Counter(AbstractStatefulModule):
    """Adds the number of calls since the last reset to its input."""

    def initial_state(self):
        return jnp.zeros((), jnp.float32)

    def __call__(self, state, x, extras=None, *, key=None):
        del extras, key
        return StatefulModuleOutput(state + 1.0, x + state, zero_loss(), {}, None)


class Noise(AbstractStatefulModule):
    """Adds standard normal noise drawn from `key`."""

    def __call__(self, state, x, extras=None, *, key=None):
        del extras
        noise = jax.random.normal(key, jnp.shape(x))
        return StatefulModuleOutput(state, x + noise, zero_loss(), {}, None)


class Stash(AbstractStatefulModule):
    """Adds noise it stores as extras; in replay adds the stored noise instead."""

    def __call__(self, state, x, extras=None, *, key=None):
        noise = jax.random.normal(key, jnp.shape(x)) if extras is None else extras
        return StatefulModuleOutput(state, x + noise, zero_loss(), {}, noise)


class Penalty(AbstractStatefulModule):
    """Identity with a fixed regularisation loss."""

    loss: float = eqx.field(static=True)

    def __call__(self, state, x, extras=None, *, key=None):
        del extras, key
        loss = jnp.asarray(self.loss, jnp.float32)
        return StatefulModuleOutput(state, x, loss, {"loss": loss}, None)


class Seen(AbstractStatistics):
    total: Float[Array, ""]


class Tally(AbstractStatefulModule):
    """Emits its input as extras; `update_statistics` sums what it was given."""

    seen: Seen

    def __call__(self, state, x, extras=None, *, key=None):
        del extras, key
        return StatefulModuleOutput(state, x, zero_loss(), {}, x)

    def update_statistics(self, extras: Any):
        return Tally(Seen(self.seen.total + jnp.sum(extras)))


def tally() -> Tally:
    return Tally(Seen(jnp.zeros((), jnp.float32)))


class Pair(AbstractStatefulModule):
    """Returns the dict `{name + "_x": x, name + "_2x": 2x}`."""

    name: str = eqx.field(static=True)

    def __call__(self, state, x, extras=None, *, key=None):
        del extras, key
        out = {f"{self.name}_x": x, f"{self.name}_2x": 2.0 * x}
        return StatefulModuleOutput(state, out, zero_loss(), {}, None)


def test_sequential_chains_layers_and_keys_everything_by_position():
    net = Sequential([affine(2.0, 1.0), Counter(), affine(-1.0)])
    state = net.initial_state()
    assert list(state) == [0, 1, 2]
    out = net(state, jnp.array([3.0]))
    # (3 * 2 + 1) + 0 (first call) = 7, negated.
    np.testing.assert_array_equal(out.output, [-7.0])
    assert out.next_state == {0: (), 1: 1.0, 2: ()}
    # Layer 0 saw 3, layer 2 saw 7.
    assert out.metrics == {0: {"in": 3.0}, 1: {}, 2: {"in": 7.0}}
    assert out.extras == {0: None, 1: None, 2: None}
    second = net(out.next_state, jnp.array([3.0]))
    np.testing.assert_array_equal(second.output, [-8.0])
    assert len(net) == 3 and net[1] is net.layers[1]


def test_every_child_is_checked():
    # beartype checks one random item of a list or dict per call; children
    # are checked whole, so the non-module is refused wherever it sits.
    layer = Dense(2, 2, key=jax.random.key(0))
    for i in range(4):
        children = [layer] * 4
        children[i] = "Dense(2, 2)"
        with pytest.raises(TypeError, match="layers"):
            Sequential(children)
        with pytest.raises(TypeError, match="modules"):
            Map({f"k{j}": child for j, child in enumerate(children)})


def test_parallel_feeds_every_child_the_same_input():
    net = Parallel(double=affine(2.0), count=Counter())
    out = net(net.initial_state(), jnp.array([1.0, 2.0]))
    np.testing.assert_array_equal(out.output["double"], [2.0, 4.0])
    np.testing.assert_array_equal(out.output["count"], [1.0, 2.0])
    assert out.next_state == {"count": 1.0, "double": ()}
    assert out.metrics == {"count": {}, "double": {"in": 3.0}}
    assert net["double"] is net.modules["double"]


def test_regularisation_is_summed_and_metrics_nest_by_child():
    net = Sequential([Penalty(0.5), Parallel(a=Penalty(1.0), b=Penalty(2.25))])
    out = net(net.initial_state(), jnp.ones(2))
    # 0.5 + (1.0 + 2.25)
    assert out.regularization_loss == 3.75
    assert out.regularization_loss.dtype == jnp.float32
    assert out.metrics == {
        0: {"loss": 0.5},
        1: {"a": {"loss": 1.0}, "b": {"loss": 2.25}},
    }


def fold(key, *path):
    """The key the layer at `path` gets, by the documented rule: one fold of
    the outermost container's key. A child's position is folded in as it is,
    its name as the CRC-32 of its UTF-8 bytes; a deeper layer's path as the
    CRC-32 of its parts' reprs joined by "/"."""
    if len(path) > 1:
        return jax.random.fold_in(key, zlib.crc32("/".join(map(repr, path)).encode()))
    (part,) = path
    data = part if isinstance(part, int) else zlib.crc32(part.encode())
    return jax.random.fold_in(key, data)


def test_sequential_folds_each_position_into_the_key(getkey):
    key = getkey()
    net = Sequential([Noise(), affine(1.0), Noise()])
    out = net(net.initial_state(), jnp.zeros(3), key=key)
    expected = jax.random.normal(fold(key, 0), (3,)) + jax.random.normal(
        fold(key, 2), (3,)
    )
    np.testing.assert_array_equal(out.output, expected)


def test_named_containers_fold_each_name_into_the_key(getkey):
    key = getkey()
    net = Parallel(zeta=Noise(), alpha=Noise())
    out = net(net.initial_state(), jnp.zeros(2), key=key)
    for name in ("alpha", "zeta"):
        np.testing.assert_array_equal(
            out.output[name], jax.random.normal(fold(key, name), (2,))
        )


def test_a_new_stochastic_sibling_leaves_each_childs_noise_unchanged(getkey):
    key, x = getkey(), jnp.zeros(3)

    def noises(net):
        return net(net.initial_state(), x, key=key).extras

    # A deterministic layer made stochastic, and one more stochastic layer at
    # the end: the stashed noise of layer 1 is drawn from the same key.
    alone = noises(Sequential([affine(1.0), Stash()]))
    made_noisy = noises(Sequential([Stash(), Stash()]))
    appended = noises(Sequential([affine(1.0), Stash(), Stash()]))
    np.testing.assert_array_equal(made_noisy[1], alone[1])
    np.testing.assert_array_equal(appended[1], alone[1])
    # Named children, one added before and one after in name order.
    alone = noises(Parallel(m=Stash(), q=affine(1.0)))
    crowded = noises(Parallel(a=Stash(), m=Stash(), q=Stash(), z=Stash()))
    np.testing.assert_array_equal(crowded["m"], alone["m"])
    assert not np.array_equal(crowded["a"], crowded["m"])
    # Nested one level deeper: the same holds by the whole path.
    alone = noises(Sequential([affine(1.0), Parallel(m=Stash(), q=affine(1.0))]))
    crowded = noises(Sequential([Stash(), Parallel(a=Stash(), m=Stash(), q=Stash())]))
    np.testing.assert_array_equal(crowded[1]["m"], alone[1]["m"])
    assert not np.array_equal(crowded[1]["a"], crowded[1]["m"])


def test_the_actors_actions_do_not_change_when_the_critic_draws_noise(getkey):
    from eqx_ppo.nn import Dense, NormalTanhSampler, PPOAdapter, VariationalBottleneck

    k = iter(jax.random.split(getkey(), 4))
    actor = Sequential([Dense(3, 4, key=next(k)), NormalTanhSampler(0.0)])
    plain = PPOAdapter(action=actor, value=Sequential([Dense(3, 1, key=next(k))]))
    noisy = PPOAdapter(
        action=actor,
        value=Sequential(
            [VariationalBottleneck(3, 2, key=next(k)), Dense(2, 1, key=next(k))]
        ),
    )
    key, x = getkey(), jnp.ones(3)
    actions = [
        net(net.initial_state(), x, key=key).output.actions for net in (plain, noisy)
    ]
    np.testing.assert_array_equal(actions[0], actions[1])


class Tagged(AbstractLayerWrapper):
    """A wrapper that only adds a metric."""

    layer: AbstractStatefulModule

    def wrap_output(self, out):
        return out._replace(metrics={**out.metrics, "tagged": True})


def test_a_wrapped_container_routes_keys_as_the_bare_one(getkey):
    """Wrapping a container (a lesion, a probe) leaves its layers' noise, in a
    call and in a replay, as it was."""
    key, x = getkey(), jnp.zeros(3)
    inner = Sequential([Stash(), Parallel(a=Noise(), b=Stash())])
    bare = Sequential([affine(1.0), inner])
    wrapped = Sequential([affine(1.0), Tagged(inner)])

    def same(a, b):
        return jax.tree.all(jax.tree.map(np.array_equal, a, b))

    out, wrapped_out = (n(n.initial_state(), x, key=key) for n in (bare, wrapped))
    assert same(wrapped_out.output, out.output)
    assert same(wrapped_out.extras, out.extras)
    assert wrapped_out.metrics[1]["tagged"]
    np.testing.assert_array_equal(
        out.extras[1][1]["b"], jax.random.normal(fold(key, 1, 1, "b"), (3,))
    )
    keys = jax.random.split(key, (2, 3))
    xs, done = jnp.zeros((2, 3, 3)), jnp.zeros((2, 3), bool)
    bare_replay, wrapped_replay = (
        n.replay(n.initial_state(), xs, None, keys, done) for n in (bare, wrapped)
    )
    assert same(wrapped_replay.output, bare_replay.output)


def test_a_batch_of_keys_gives_each_child_every_keys_fold(getkey):
    # The replay folds a [T, M] batch of keys as the call folds each one.
    keys = jax.random.split(getkey(), (4, 3))
    seen = []

    class Keep(AbstractStatefulModule):
        def __call__(self, state, x, extras=None, *, key=None):
            seen.append(key)
            return StatefulModuleOutput(state, x, zero_loss(), {}, None)

        def replay(self, state0, xs, extras, keys, done):
            seen.append(keys)
            return super().replay(state0, xs, extras, keys, done)

    net = Map(b=Keep())
    x = {"b": jnp.zeros((4, 3, 1))}
    net.replay(net.initialize_state(3), x, None, keys, jnp.zeros((4, 3), bool))
    batch = seen[0]
    assert batch.shape == (4, 3)
    for t in range(4):
        for m in range(3):
            assert jnp.array_equal(
                jax.random.key_data(batch[t, m]),
                jax.random.key_data(fold(keys[t, m], "b")),
            )
    # No key stays no key, down to the leaves.
    seen.clear()
    net(net.initial_state(), {"b": jnp.zeros(1)})
    assert seen == [None]


def test_extras_are_routed_and_replay_reproduces_the_rollout(getkey):
    net = Sequential([affine(1.0), Parallel(a=Stash(), b=affine(3.0)), Map(a=Stash())])
    x = jnp.array([1.0, -1.0])
    rollout = net(net.initial_state(), x, key=getkey())
    assert rollout.extras[0] is None
    assert rollout.extras[1]["b"] is None
    assert rollout.extras[1]["a"].shape == (2,)
    assert rollout.extras[2]["a"].shape == (2,)
    # Replay with a different key: the stored noise, not the key, decides.
    replay = net(net.initial_state(), x, rollout.extras, key=getkey())
    np.testing.assert_array_equal(replay.output["a"], rollout.output["a"])
    # Changing one stored value changes exactly that contribution.
    edited = jax.tree.map(lambda e: e, rollout.extras)
    edited[2]["a"] = rollout.extras[2]["a"] + 1.0
    moved = net(net.initial_state(), x, edited, key=getkey())
    np.testing.assert_allclose(moved.output["a"], rollout.output["a"] + 1.0)


def test_concat_uses_sorted_key_order_eagerly_and_under_jit():
    # Children inserted in non-sorted order: z, a, m.
    net = Concat({"z": affine(1.0), "a": affine(10.0), "m": affine(100.0)})
    assert list(net.modules) == ["a", "m", "z"]
    x = {"z": jnp.array([1.0]), "m": jnp.array([1.0, 2.0]), "a": jnp.array([1.0])}
    expected = [10.0, 100.0, 200.0, 1.0]  # a, then m, then z
    eager = net(net.initial_state(), x).output
    jitted = eqx.filter_jit(lambda n, s, x: n(s, x).output)(net, net.initial_state(), x)
    rebuilt = jax.tree.map(lambda leaf: leaf, net)
    np.testing.assert_array_equal(eager, expected)
    np.testing.assert_array_equal(jitted, expected)
    np.testing.assert_array_equal(rebuilt(rebuilt.initial_state(), x).output, expected)


def test_keyword_and_dict_construction_agree():
    by_kwargs = Concat(b=affine(2.0), a=affine(1.0))
    by_dict = Concat({"a": affine(1.0), "b": affine(2.0)})
    assert jax.tree.structure(by_kwargs) == jax.tree.structure(by_dict)


def test_concat_dispatches_by_key_and_ignores_unused_entries():
    net = Concat(a=Counter(), b=affine(2.0))
    x = {"a": jnp.array([1.0]), "b": jnp.array([1.0, 2.0]), "unused": jnp.zeros(7)}
    out = net(net.initial_state(), x)
    np.testing.assert_array_equal(out.output, [1.0, 2.0, 4.0])
    assert out.next_state == {"a": 1.0, "b": ()}


def test_map_dispatches_per_key():
    net = Map({"x-pos": affine(2.0), "vel": Counter()})
    x = {"x-pos": jnp.array([1.0]), "vel": jnp.array([5.0]), "extra": jnp.zeros(1)}
    out = net(net.initial_state(), x)
    assert set(out.output) == {"x-pos", "vel"}
    np.testing.assert_array_equal(out.output["x-pos"], [2.0])
    np.testing.assert_array_equal(out.output["vel"], [5.0])


@pytest.mark.parametrize("cls", [Map, Concat])
def test_dispatching_containers_name_missing_keys(cls):
    net = cls(a=affine(1.0), b=affine(1.0))
    with pytest.raises(ValueError, match=r"keys \['a', 'b'\]; got keys \['a', 'c'\]"):
        net(net.initial_state(), {"a": jnp.ones(1), "c": jnp.ones(1)})
    with pytest.raises(ValueError, match=r"a dict with keys .*; got ArrayImpl"):
        net(net.initial_state(), jnp.ones(1))


def test_merge_flattens_dict_outputs():
    net = Merge(p=Pair("left"), q=Pair("right"))
    out = net(net.initial_state(), jnp.array([1.5]))
    assert set(out.output) == {"left_x", "left_2x", "right_x", "right_2x"}
    np.testing.assert_array_equal(out.output["right_2x"], [3.0])
    assert set(out.next_state) == {"p", "q"}


def test_merge_rejects_duplicate_keys():
    net = Merge(p=Pair("same"), q=Pair("same"))
    with pytest.raises(ValueError, match="'p' and 'q' both produce the key"):
        net(net.initial_state(), jnp.ones(1))


@pytest.mark.parametrize("cls", [Parallel, Concat, Map, Merge])
def test_named_containers_validate_their_children(cls):
    with pytest.raises(ValueError, match="at least one child"):
        cls()
    with pytest.raises(ValueError, match="at least one child"):
        cls({})
    with pytest.raises(ValueError, match="both a positional dict and keyword"):
        cls({"a": affine(1.0)}, b=affine(1.0))
    # The declared types (checked at run time in the suite) refuse the rest.
    for bad in ([affine(1.0)], {"a": jnp.tanh}, {1: affine(1.0)}):
        with pytest.raises(TypeError, match="modules"):
            cls(bad)
    with pytest.raises(TypeError, match="kwargs"):
        cls(a=jnp.tanh)


def test_sequential_validates_its_layers():
    with pytest.raises(ValueError, match="at least one child"):
        Sequential([])
    # The declared type: a sequence of modules, not one module or a dict.
    for bad in ([jnp.tanh], affine(1.0), {"a": affine(1.0)}):
        with pytest.raises(TypeError, match="layers"):
            Sequential(bad)


def test_reset_state_recurses_and_update_statistics_returns_new_containers():
    net = Sequential(
        [Counter(), Parallel(a=Counter(), b=tally()), Concat(a=Counter(), b=tally())]
    )
    state = net.initial_state()
    out = net(state, jnp.ones(1))
    assert out.next_state == {0: 1.0, 1: {"a": 1.0, "b": ()}, 2: {"a": 1.0, "b": ()}}
    reset = net.reset_state(out.next_state)
    assert reset == {0: 0.0, 1: {"a": 0.0, "b": ()}, 2: {"a": 0.0, "b": ()}}

    extras = {
        0: None,
        1: {"a": None, "b": jnp.ones((2, 3))},
        2: {"a": None, "b": jnp.full((2, 3), 2.0)},
    }
    updated = net.update_statistics(extras)
    assert isinstance(updated, Sequential)
    assert isinstance(updated[1], Parallel) and isinstance(updated[2], Concat)
    assert updated[1]["b"].seen.total == 6.0  # 2 * 3 ones
    assert updated[2]["b"].seen.total == 12.0  # 2 * 3 twos
    assert net[1]["b"].seen.total == 0.0  # the original is untouched


def test_update_statistics_with_no_extras_passes_none_to_children():
    class Strict(AbstractStatefulModule):
        def __call__(self, state, x, extras=None, *, key=None):
            return StatefulModuleOutput(state, x, zero_loss(), {}, None)

        def update_statistics(self, extras):
            assert extras is None
            return self

    net = Sequential([Strict(), Map(a=Strict())])
    assert jax.tree.structure(net.update_statistics(None)) == jax.tree.structure(net)


def test_carries_reset_per_env_under_vmap():
    net = Sequential([Parallel(count=Counter(), lin=affine(1.0)), Map(count=Counter())])
    n_envs = 3
    state = net.initialize_state(n_envs)
    x = jnp.zeros((n_envs, 1))
    step = jax.vmap(lambda s, xi: net(s, xi))
    for _ in range(2):
        state = step(state, x).next_state
    done = jnp.array([True, False, True])
    state = jax.vmap(lambda d, s: reset_where(net, d, s))(done, state)
    np.testing.assert_array_equal(state[0]["count"], [0.0, 2.0, 0.0])
    np.testing.assert_array_equal(state[1]["count"], [0.0, 2.0, 0.0])
    out = step(state, x)
    # Counter 0 adds its count c, Map's counter adds its count c again: 2c.
    np.testing.assert_array_equal(out.output["count"][:, 0], [0.0, 4.0, 0.0])


def test_scan_jit_and_filter_grad_through_containers(getkey):
    net = Sequential(
        [
            affine(2.0),
            Parallel(a=Counter(), b=affine(3.0)),
            Map(a=Stash(), b=affine(1.0)),
        ]
    )

    @eqx.filter_jit
    def rollout(net, key):
        def step(state, k):
            out = net(state, jnp.ones(1), key=k)
            return out.next_state, out.output["a"][0]

        return jax.lax.scan(step, net.initial_state(), jax.random.split(key, 4))

    key = getkey()
    final_state, outputs = rollout(net, key)
    # Child "a" of the Map that is layer 2 of the Sequential: one fold.
    noises = np.array(
        [jax.random.normal(fold(k, 2, "a"), ()) for k in jax.random.split(key, 4)]
    )
    # 1 * 2 + count (0, 1, 2, 3) + the noise of each step.
    np.testing.assert_allclose(outputs, 2.0 + np.arange(4) + noises, rtol=1e-6)
    assert final_state[1]["a"] == 4.0

    @eqx.filter_grad
    def loss(net):
        out = net(net.initial_state(), jnp.array([1.0, 2.0]), key=key)
        return jnp.sum(out.output["b"])

    grads = loss(net)
    # sum(1 * 3 * s0 * x) over x = (1, 2) with s0 = 2:
    # d/ds0 = 3 * 3 = 9, d/ds_parallel_b = 2 * 3 = 6, d/ds_map_b = 3 * 2 * 3 = 18.
    assert grads[0].scale == 9.0
    assert grads[1]["b"].scale == 6.0
    assert grads[2]["b"].scale == 18.0


def test_compiles_once_for_new_values(getkey):
    net = Sequential(
        [Parallel(a=affine(2.0), b=affine(1.0)), Concat(a=Stash(), b=Counter())]
    )

    @eqx.filter_jit
    @eqx.debug.assert_max_traces(max_traces=1)
    def call(net, state, x, key):
        return net(state, x, key=key)

    state = net.initial_state()
    for _ in range(3):
        x = jax.random.normal(getkey(), (2,))
        state = call(net, state, x, getkey()).next_state


def test_children_are_pytree_nodes_so_tree_maps_can_wrap_leaf_layers():
    class Wrapped(AbstractStatefulModule):
        inner: AbstractStatefulModule

        def __call__(self, state, x, extras=None, *, key=None):
            out = self.inner(state, x, extras, key=key)
            return out._replace(metrics={**out.metrics, "wrapped": out.output})

        def initial_state(self):
            return self.inner.initial_state()

    leaf_types = (Affine, Counter)
    net = Sequential([affine(2.0), Parallel(a=Counter(), b=affine(3.0))])
    wrapped = jax.tree.map(
        lambda node: Wrapped(node) if isinstance(node, leaf_types) else node,
        net,
        is_leaf=lambda node: isinstance(node, leaf_types),
    )
    x = jnp.array([1.0])
    plain, recorded = net(net.initial_state(), x), wrapped(wrapped.initial_state(), x)
    assert jax.tree.all(jax.tree.map(jnp.array_equal, plain.output, recorded.output))
    np.testing.assert_array_equal(recorded.metrics[1]["b"]["wrapped"], [6.0])
    assert recorded.metrics[0]["in"] == 1.0
