"""The replay of the module contract: `replay` of a `[T, M]` batch equals each
env's step-by-step loop of `__call__`, carries reset where the rollout reset
them; containers replay child by child, so the loss runs only the recurrent
layers as scans and everything else as one batched call over all steps."""

import contextlib

import equinox as eqx
import jax
import jax.extend
import jax.numpy as jnp
import pytest

import eqx_ppo
from eqx_ppo import nn
from eqx_ppo.nn._module import merges_steps, reset_where
from eqx_ppo.ppo._chunk import over_seeds
from tests._helpers import assert_ulp_close

T = 7
DONE_PATTERNS = {
    # a reset after the first step, two in a row, and one at the last step
    "edges": jnp.array([1, 0, 1, 1, 0, 0, 1], bool),
    "none": jnp.zeros(T, bool),
    "random": jax.random.bernoulli(jax.random.key(9), 0.4, (T,)),
}
N_ENVS = len(DONE_PATTERNS)


def loop_reference(module, state0, xs, extras, keys, done):
    """The slow reference for one env: `T` eager calls, resetting the carry on
    `done`, as the rollout does."""
    state, outputs, losses = state0, [], []
    for t in range(T):
        x, e = jax.tree.map(lambda a, t=t: a[t], (xs, extras))
        k = None if keys is None else keys[t]
        out = module(state, x, e, key=k)
        outputs.append(out.output)
        losses.append(out.regularization_loss)
        state = reset_where(module, done[t], out.next_state)
    return nn.SequenceOutput(state, _stack(outputs), jnp.stack(losses))


def _stack(per_step, axis=0):
    return jax.tree.map(lambda *a: jnp.stack(a, axis), *per_step)


def env(tree, m):
    """Env `m`'s `[T, ...]` sequence of a `[T, M, ...]` batch."""
    return jax.tree.map(lambda a: a[:, m], tree)


def rollout_extras(module, state0, xs, keys, done):
    """The `extras` a rollout of one env emits at each step, stacked `[T]`."""
    state, extras = state0, []
    for t in range(T):
        x = jax.tree.map(lambda a, t=t: a[t], xs)
        out = module(state, x, None, key=keys[t])
        extras.append(out.extras)
        state = reset_where(module, done[t], out.next_state)
    return _stack(extras)


def count_scans(jaxpr) -> int:
    n = 0
    for eqn in jaxpr.eqns:
        n += eqn.primitive.name == "scan"
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            n += count_scans(sub)
    return n


def matmul_shapes(jaxpr) -> list[tuple[int, ...]]:
    """The left operand's shape of every `dot_general`, at any depth."""
    shapes = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            shapes.append(eqn.invars[0].aval.shape)
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            shapes += matmul_shapes(sub)
    return shapes


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


def inputs(kind, size, key, n_envs=N_ENVS):
    if kind == "map":
        ka, kb = jax.random.split(key)
        return {
            "a": jax.random.normal(ka, (T, n_envs, size)),
            "b": jax.random.normal(kb, (T, n_envs, size)),
        }
    return jax.random.normal(key, (T, n_envs, size))


def batch(net, kind, size, getkey):
    """A `[T, M]` batch with one done pattern per env, each env starting from
    its own carry, not the initial one (so a missed reset shows), and the
    extras each env's rollout emitted."""
    xs = inputs(kind, size, getkey())
    keys = jax.random.split(getkey(), (T, N_ENVS))
    done = jnp.stack([DONE_PATTERNS[p] for p in sorted(DONE_PATTERNS)], axis=1)
    state0 = jax.tree.map(
        lambda s: s + jnp.arange(1.0, N_ENVS + 1).reshape(-1, *[1] * (s.ndim - 1)),
        net.initialize_state(N_ENVS),
    )
    extras = _stack(
        [
            rollout_extras(
                net,
                jax.tree.map(lambda s, m=m: s[m], state0),
                env(xs, m),
                keys[:, m],
                done[:, m],
            )
            for m in range(N_ENVS)
        ],
        axis=1,
    )
    return state0, xs, extras, keys, done


@pytest.mark.parametrize("kind", ["ppo", "map", "merge"])
def test_replay_equals_each_envs_loop_of_calls(kind, getkey):
    # The loss's path: the envs of a minibatch replayed together, each with its
    # own carry, keys and resets, so a child that mixed up the time and env
    # axes, or the envs' keys, would show. Acting afresh, and replaying the
    # rollout's extras (the loss's case).
    net, size = nets(getkey())[kind]
    state0, xs, extras, keys, done = batch(net, kind, size, getkey)
    for replayed in (None, extras):
        actual = eqx.filter_jit(net.replay)(state0, xs, replayed, keys, done)
        for m in range(N_ENVS):
            expected = loop_reference(
                net,
                jax.tree.map(lambda s, m=m: s[m], state0),
                env(xs, m),
                None if replayed is None else env(replayed, m),
                keys[:, m],
                done[:, m],
            )
            at = nn.SequenceOutput(
                jax.tree.map(lambda s, m=m: s[m], actual.last_state),
                *env((actual.output, actual.regularization_loss), m),
            )
            assert_ulp_close(at, expected)


@pytest.mark.parametrize("kind", ["ppo", "map", "merge"])
def test_replaying_some_envs_equals_slicing_the_replay_of_all(kind, getkey):
    net, size = nets(getkey())[kind]
    state0, xs, extras, keys, done = batch(net, kind, size, getkey)
    full = eqx.filter_jit(net.replay)(state0, xs, extras, keys, done)
    some = jnp.array([2, 0])
    sub = eqx.filter_jit(net.replay)(
        jax.tree.map(lambda s: s[some], state0),
        *jax.tree.map(lambda a: a[:, some], (xs, extras, keys, done)),
    )
    expected = nn.SequenceOutput(
        jax.tree.map(lambda s: s[some], full.last_state),
        *jax.tree.map(lambda a: a[:, some], (full.output, full.regularization_loss)),
    )
    assert_ulp_close(sub, expected)


@pytest.mark.parametrize(
    "backend, merged, rows",
    [("cpu", False, "merged"), ("tpu", False, "time, env"), ("tpu", True, "merged")],
)
def test_replay_runs_a_layer_without_a_carry_once_over_all_steps(
    getkey, monkeypatch, backend, merged, rows
):
    # A layer without a carry replays the minibatch's T x M steps as one batch:
    # merged into [T x M, in] rows on a CPU (XLA:CPU's weight gradients are
    # faster there) and in `merged_steps()`, as [T, M, in] on a TPU otherwise
    # (less memory traffic there); a layer with a carry is scanned over the T
    # steps, the M envs batched inside.
    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    with nn.merged_steps() if merged else contextlib.nullcontext():
        _replay_runs_a_layer_without_a_carry_once(getkey, rows)


def _replay_runs_a_layer_without_a_carry_once(getkey, rows):
    class Sum(nn.AbstractStatefulModule):
        def initial_state(self):
            return jnp.zeros(3)

        def __call__(self, state, x, extras=None, *, key=None):
            total = state + x
            return nn.StatefulModuleOutput(total, total, jnp.zeros(()), {}, None)

    net = nn.Sequential(
        [nn.Dense(3, 3, key=getkey()), Sum(), nn.Dense(3, 3, key=getkey())]
    )
    n_envs = 5
    xs = jax.random.normal(getkey(), (T, n_envs, 3))
    done = jax.random.bernoulli(getkey(), 0.3, (T, n_envs))
    state0 = net.initialize_state(n_envs)
    jaxpr = jax.make_jaxpr(net.replay)(state0, xs, None, None, done).jaxpr
    shape = (T * n_envs, 3) if rows == "merged" else (T, n_envs, 3)
    assert matmul_shapes(jaxpr) == [shape, shape]
    [scan] = [e for e in jaxpr.eqns if e.primitive.name == "scan"]
    assert scan.params["length"] == T
    out = net.replay(state0, xs, None, None, done)
    assert out.output.shape == (T, n_envs, 3)
    for m in range(n_envs):
        expected = loop_reference(
            net,
            jax.tree.map(lambda s, m=m: s[m], state0),
            xs[:, m],
            None,
            None,
            done[:, m],
        )
        assert_ulp_close(
            nn.SequenceOutput(
                jax.tree.map(lambda s, m=m: s[m], out.last_state),
                out.output[:, m],
                out.regularization_loss[:, m],
            ),
            expected,
        )


def test_merged_steps_ends_with_its_block_even_on_an_error(monkeypatch):
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    with pytest.raises(ValueError), nn.merged_steps():
        assert merges_steps()
        raise ValueError
    assert not merges_steps()


def test_many_seeds_in_one_vmap_replay_merged_steps(getkey, monkeypatch):
    # Weights batched over seeds: on a TPU the [T, M, ...] layout trained at
    # 0.56x the merged one's speed, so `over_seeds` traces in `merged_steps()`;
    # one seed runs on its slice, unbatched, in the TPU's own layout.
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    net = nn.Dense(3, 3, key=getkey())
    n_envs = 5
    xs = jax.random.normal(getkey(), (T, n_envs, 3))
    done = jnp.zeros((T, n_envs), bool)

    def replay(x):
        return net.replay((), x, None, None, done).output

    for n_seeds, shape in [(1, (T, n_envs, 3)), (2, (2, T * n_envs, 3))]:
        seeds = jnp.stack([xs] * n_seeds)
        jaxpr = jax.make_jaxpr(lambda s: over_seeds(replay, s))(seeds).jaxpr
        assert matmul_shapes(jaxpr) == [shape]
        out = over_seeds(replay, seeds)
        assert_ulp_close(out, jnp.stack([replay(xs)] * n_seeds))


def test_replay_declares_a_time_then_env_batch(getkey):
    # The suite checks annotations at run time: `done` and `keys` of another
    # layout than `[T, M]` are refused by the declared shapes.
    layer = nn.GRU(3, 2, key=getkey())
    xs = jax.random.normal(getkey(), (T, 4, 3))
    keys = jax.random.split(getkey(), (T, 4))
    done = jnp.zeros((T, 4), bool)
    state0 = layer.initialize_state(4)
    with pytest.raises(TypeError, match="done"):
        layer.replay(state0, xs, None, keys, done[:, 0])
    with pytest.raises(TypeError, match="keys"):
        layer.replay(state0, xs, None, keys[:, :2], done)


def test_default_replay_is_one_batched_call_without_a_carry(getkey):
    net = nn.Sequential([nn.Dense(3, 4, key=getkey()), nn.Dense(4, 2, key=getkey())])
    xs = jax.random.normal(getkey(), (T, 1, 3))
    done = DONE_PATTERNS["edges"][:, None]
    for module in (net, net[0]):
        state0 = module.initialize_state(1)
        jaxpr = jax.make_jaxpr(module.replay)(state0, xs, None, None, done)
        assert count_scans(jaxpr.jaxpr) == 0
        expected = loop_reference(
            module, module.initial_state(), xs[:, 0], None, None, done[:, 0]
        )
        actual = module.replay(state0, xs, None, None, done)
        assert_ulp_close(
            nn.SequenceOutput(
                module.initial_state(),
                actual.output[:, 0],
                actual.regularization_loss[:, 0],
            ),
            expected,
        )


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
    jaxpr = jax.make_jaxpr(net.replay)(state0, xs, None, keys, done)
    assert count_scans(jaxpr.jaxpr) == 4
