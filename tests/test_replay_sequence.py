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
from eqx_ppo.ppo._loss import replay_envs
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
    jaxpr = jax.make_jaxpr(lambda *a: replay_envs(net, *a))(
        state0, xs, None, keys, done
    )
    assert count_scans(jaxpr.jaxpr) == 4
