"""The sequence replay of the module contract: every container replays child by
child and equals a step-by-step loop of `__call__`, with resets inside the
sequence; the loss runs only the recurrent layers as scans."""

import equinox as eqx
import jax
import jax.extend
import jax.numpy as jnp
import pytest

import eqx_ppo
from eqx_ppo import nn
from tests._helpers import assert_ulp_close

T = 7
DONE_PATTERNS = {
    # a reset after the first step, two in a row, and one at the last step
    "edges": jnp.array([1, 0, 1, 1, 0, 0, 1], bool),
    "none": jnp.zeros(T, bool),
    "random": jax.random.bernoulli(jax.random.key(9), 0.4, (T,)),
}


def loop_reference(module, state0, xs, extras, keys, done):
    """The slow reference: `T` eager calls, resetting the carry on `done`."""
    state, outputs, losses = state0, [], []
    for t in range(T):
        x, e = jax.tree.map(lambda a, t=t: a[t], (xs, extras))
        k = None if keys is None else keys[t]
        out = module(state, x, e, key=k)
        outputs.append(out.output)
        losses.append(out.regularization_loss)
        state = nn.reset_where(module, done[t], out.next_state)
    return nn.SequenceOutput(state, _stack(outputs), jnp.stack(losses))


def _stack(per_step):
    return jax.tree.map(lambda *a: jnp.stack(a), *per_step)


def rollout_extras(module, state0, xs, keys, done):
    """The `extras` a rollout emits at each step, acting afresh, stacked `[T]`."""
    state, extras = state0, []
    for t in range(T):
        x = jax.tree.map(lambda a, t=t: a[t], xs)
        out = module(state, x, None, key=keys[t])
        extras.append(out.extras)
        state = nn.reset_where(module, done[t], out.next_state)
    return _stack(extras)


def count_scans(jaxpr) -> int:
    n = 0
    for eqn in jaxpr.eqns:
        n += eqn.primitive.name == "scan"
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            n += count_scans(sub)
    return n


def nets(key):
    k = iter(jax.random.split(key, 16))
    trunk = nn.Sequential(
        [
            nn.Normalizer(3),
            nn.Parallel(a=nn.LSTM(3, 4, key=next(k)), b=nn.GRU(3, 4, key=next(k))),
            nn.Concat(a=nn.Dense(4, 3, key=next(k)), b=nn.Dense(4, 3, key=next(k))),
        ]
    )
    actor = nn.Sequential(
        [
            nn.VariationalBottleneck(6, 4, key=next(k), kl_weight=0.1),
            nn.GRU(4, 4, key=next(k)),
            nn.Dense(4, 4, key=next(k)),
            nn.NormalTanhSampler(0.01),
        ]
    )
    critic = nn.Sequential(
        [eqx_ppo.Recorder(nn.LSTM(6, 5, key=next(k))), nn.Dense(5, 1, key=next(k))]
    )
    ppo = nn.Sequential([trunk, nn.PPOAdapter(action=actor, value=critic)])
    mapped = nn.Map(a=nn.LSTM(2, 3, key=next(k)), b=nn.Dense(2, 3, key=next(k)))
    merged = nn.Merge(
        p=nn.Parallel(u=nn.GRU(2, 3, key=next(k))),
        q=nn.Parallel(v=nn.Dense(2, 3, key=next(k))),
    )
    return {"ppo": (ppo, 3), "map": (mapped, 2), "merge": (merged, 2)}


def inputs(kind, size, key):
    if kind == "map":
        ka, kb = jax.random.split(key)
        return {
            "a": jax.random.normal(ka, (T, size)),
            "b": jax.random.normal(kb, (T, size)),
        }
    return jax.random.normal(key, (T, size))


@pytest.mark.parametrize("kind", ["ppo", "map", "merge"])
@pytest.mark.parametrize("pattern", sorted(DONE_PATTERNS))
def test_replay_sequence_equals_a_loop_of_calls(kind, pattern, getkey):
    net, size = nets(getkey())[kind]
    xs = inputs(kind, size, getkey())
    keys = jax.random.split(getkey(), T)
    done = DONE_PATTERNS[pattern]
    # a carry that is not the initial one, so a missed reset shows
    state0 = jax.tree.map(lambda s: s + 0.3, net.initial_state())
    # acting afresh, and replaying the rollout's extras (the loss's case)
    for extras in (None, rollout_extras(net, state0, xs, keys, done)):
        expected = loop_reference(net, state0, xs, extras, keys, done)
        actual = eqx.filter_jit(net.replay_sequence)(state0, xs, extras, keys, done)
        assert_ulp_close(actual, expected)


@pytest.mark.parametrize("kind", ["ppo", "map", "merge"])
def test_replay_envs_equals_each_envs_loop_of_calls(kind, getkey):
    # The loss's path: the envs of a minibatch replayed together, each with its
    # own carry, keys and resets (one done pattern per env), so a child that
    # mixed up the time and env axes, or the envs' keys, would show.
    net, size = nets(getkey())[kind]
    patterns = sorted(DONE_PATTERNS)
    n_envs = len(patterns)
    xs = jax.tree.map(
        lambda *a: jnp.stack(a, axis=1),
        *[inputs(kind, size, getkey()) for _ in patterns],
    )
    keys = jax.random.split(getkey(), (T, n_envs))
    done = jnp.stack([DONE_PATTERNS[p] for p in patterns], axis=1)
    state0 = jax.tree.map(
        lambda s: s + jnp.arange(1.0, n_envs + 1).reshape(-1, *[1] * (s.ndim - 1)),
        net.initialize_state(n_envs),
    )

    def env(tree, m):
        return jax.tree.map(lambda a: a[:, m], tree)

    extras = jax.tree.map(
        lambda *a: jnp.stack(a, axis=1),
        *[
            rollout_extras(
                net,
                jax.tree.map(lambda s, m=m: s[m], state0),
                env(xs, m),
                keys[:, m],
                done[:, m],
            )
            for m in range(n_envs)
        ],
    )
    actual = eqx.filter_jit(net.replay_envs)(state0, xs, extras, keys, done)
    for m in range(n_envs):
        expected = loop_reference(
            net,
            jax.tree.map(lambda s, m=m: s[m], state0),
            env(xs, m),
            env(extras, m),
            keys[:, m],
            done[:, m],
        )
        at = nn.SequenceOutput(
            jax.tree.map(lambda s, m=m: s[m], actual.last_state),
            *env((actual.output, actual.regularization_loss), m),
        )
        assert_ulp_close(at, expected)


def test_replay_envs_runs_a_layer_without_a_carry_once_over_all_steps(getkey):
    # A layer without a carry replays the minibatch's T x M steps as one
    # sequence (XLA's matmuls on [T x M, in] are faster than on [T, M, in]);
    # a layer with a carry replays each env's [T] steps, its carry reset on
    # done.
    seen = []

    class Probe(nn.AbstractStatelessLayer):
        def forward(self, x):
            return x

        def replay_sequence(self, state0, xs, extras, keys, done):
            seen.append(("probe", xs.shape, done.shape))
            return super().replay_sequence(state0, xs, extras, keys, done)

    class Sum(nn.AbstractStatefulModule):
        def initial_state(self):
            return jnp.zeros(3)

        def __call__(self, state, x, extras=None, *, key=None):
            total = state + x
            return nn.StatefulModuleOutput(total, total, jnp.zeros(()), {}, None)

        def replay_sequence(self, state0, xs, extras, keys, done):
            seen.append(("sum", xs.shape, done.shape))
            return super().replay_sequence(state0, xs, extras, keys, done)

    net = nn.Sequential([Probe(), Sum(), Probe()])
    n_envs = 5
    xs = jax.random.normal(getkey(), (T, n_envs, 3))
    done = jax.random.bernoulli(getkey(), 0.3, (T, n_envs))
    state0 = net.initialize_state(n_envs)
    out = net.replay_envs(state0, xs, None, None, done)
    assert seen == [
        ("probe", (T * n_envs, 3), (T * n_envs,)),
        ("sum", (T, 3), (T,)),
        ("probe", (T * n_envs, 3), (T * n_envs,)),
    ]
    assert out.output.shape == (T, n_envs, 3)
    expected = jax.vmap(
        lambda s, x, d: loop_reference(net, s, x, None, None, d),
        in_axes=(0, 1, 1),
        out_axes=nn.SequenceOutput(0, 1, 1),
    )(state0, xs, done)
    assert_ulp_close(out, expected)


def test_replay_envs_names_a_batch_that_is_not_time_then_envs(getkey, unchecked):
    ppo, size = nets(getkey())["ppo"]
    n_envs = 3
    xs = jax.random.normal(getkey(), (T, n_envs, size))
    keys = jax.random.split(getkey(), (T, n_envs))
    done = jax.random.bernoulli(getkey(), 0.3, (T, n_envs))
    layers = [
        ppo,
        nn.Dense(size, 2, key=getkey()),
        nn.GRU(size, 2, key=getkey()),
        nn.MinGRU(size, 2, key=getkey()),
        nn.Parallel(a=nn.Dense(size, 2, key=getkey())),
    ]
    for net in layers:
        name = type(net).__name__
        state0 = net.initialize_state(n_envs)
        with pytest.raises(ValueError, match=rf"{name}\.replay_envs\(done=bool\[7\]\)"):
            net.replay_envs(state0, xs, None, keys, done[:, 0])
        with pytest.raises(ValueError, match=r"done\[:, None\]"):
            net.replay_envs(state0, xs, None, keys, done.astype(jnp.float32))
        swapped = rf"{name}\.replay_envs\(xs=float32\[3, 7, {size}\]\)"
        with pytest.raises(ValueError, match=swapped + r".*\[T, M\] = \[7, 3\]"):
            net.replay_envs(state0, jnp.swapaxes(xs, 0, 1), None, keys, done)
        with pytest.raises(ValueError, match=rf"{name}\.replay_envs\(keys="):
            net.replay_envs(state0, xs, None, keys[:, :2], done)


def test_route_sequence_keys_routes_every_key_of_a_batch(getkey):
    children = [
        nn.NormalTanhSampler(0.01),
        nn.Dense(2, 2, key=getkey()),
        nn.VariationalBottleneck(2, 2, key=getkey()),
    ]
    keys = jax.random.split(getkey(), (T, 3))
    routed = nn.route_sequence_keys(keys, children)
    assert routed[1] is None
    for t in range(T):
        for m in range(3):
            expected = nn.route_keys(keys[t, m], children)
            for got, want in zip(routed, expected, strict=True):
                if want is not None:
                    assert got.shape == (T, 3)
                    assert jnp.array_equal(
                        jax.random.key_data(got[t, m]), jax.random.key_data(want)
                    )


def test_legacy_raw_keys_replay_as_the_loop_of_calls(getkey, unchecked):
    # `jax.random.PRNGKey`'s uint32 key data, `[T, 2]`, which a call accepts
    # (the annotations name typed keys, hence `unchecked`); the container
    # splits each step's key for its two stochastic children.
    net = nn.Sequential(
        [
            nn.VariationalBottleneck(3, 2, key=getkey()),
            nn.Dense(2, 4, key=getkey()),
            nn.NormalTanhSampler(0.1),
        ]
    )
    xs = jax.random.normal(getkey(), (T, 3))
    done = jnp.zeros(T, bool).at[2].set(True)
    raw = jax.random.split(jax.random.PRNGKey(0), T)
    replay = net.replay_sequence(net.initial_state(), xs, None, raw, done)
    expected = nn.scan_sequence(net, net.initial_state(), xs, None, raw, done)
    assert_ulp_close(replay, expected)
    routed = nn.route_sequence_keys(raw, list(net.layers))
    assert routed[0].shape == routed[2].shape == (T, 2) and routed[1] is None


def test_default_replay_is_one_batched_call_without_a_carry(getkey):
    net = nn.Sequential([nn.Dense(3, 4, key=getkey()), nn.Dense(4, 2, key=getkey())])
    xs = jax.random.normal(getkey(), (T, 3))
    done = DONE_PATTERNS["edges"]
    for module in (net, net[0]):
        state0 = module.initial_state()
        jaxpr = jax.make_jaxpr(module.replay_sequence)(state0, xs, None, None, done)
        assert count_scans(jaxpr.jaxpr) == 0
        expected = loop_reference(module, state0, xs, None, None, done)
        actual = module.replay_sequence(state0, xs, None, None, done)
        assert_ulp_close(actual, expected)


def test_loss_replay_scans_only_the_recurrent_layers(getkey):
    # Four recurrent layers (an LSTM and a GRU side by side in the trunk, a GRU
    # in the actor, an LSTM in the critic): the minibatch replay holds exactly
    # four scans, so the Dense layers, the bottleneck and the sampler run as
    # batched calls. A container scanned whole would merge scans (Sequential:
    # one in all; Parallel or PPOAdapter: three).
    net, size = nets(getkey())["ppo"]
    m = 5
    xs = jax.random.normal(getkey(), (T, m, size))
    keys = jax.random.split(getkey(), (T, m))
    done = jax.random.bernoulli(getkey(), 0.3, (T, m))
    state0 = net.initialize_state(m)
    jaxpr = jax.make_jaxpr(net.replay_envs)(state0, xs, None, keys, done)
    assert count_scans(jaxpr.jaxpr) == 4
