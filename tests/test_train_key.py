"""`train(key=...)`, of PPO and distillation alike: randomness enters as a
key; `TrainConfig.seed` stays the default."""

import collections
import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqx_ppo
from tests._helpers import assert_ulp_close

ENV = eqx_ppo.envs.make("move_to_center")


def networks(key):
    return eqx_ppo.make_mlp_actor_critic(2, 2, (8,), (8,), key=key)


def config(seed=0, n_seeds=1, evaluate=False):
    return eqx_ppo.TrainConfig(
        learner=eqx_ppo.PPO(
            n_envs=4, rollout_length=4, total_steps=32, n_minibatches=2, n_epochs=1
        ),
        eval=eqx_ppo.EvalConfig(
            enabled=evaluate, every_steps=32, n_envs=2, max_episode_length=5
        ),
        seed=seed,
        n_seeds=n_seeds,
        progress=False,
    )


def same(a, b):
    """Bit-equal array leaves (keys compared as key data)."""
    a, b = ([data(x) for x in jax.tree.leaves(t) if eqx.is_array(x)] for t in (a, b))
    return len(a) == len(b) and all(
        bool((x == y).all()) for x, y in zip(a, b, strict=True)
    )


def data(x):
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        return jax.random.key_data(x)
    return x


def test_key_equals_the_seed_it_replaces():
    by_seed = eqx_ppo.train(ENV, networks, config(seed=5, evaluate=True))
    by_key = eqx_ppo.train(
        ENV, networks, config(seed=0, evaluate=True), key=jax.random.key(5)
    )
    # Same program, same keys: bit-identical state and eval metrics.
    assert same(by_seed.training_state, by_key.training_state)
    assert by_seed.eval_history == by_key.eval_history


def test_a_batch_of_keys_gives_one_per_seed():
    by_seed = eqx_ppo.train(ENV, networks, config(seed=5, n_seeds=2))
    keys = jax.numpy.stack([jax.random.key(5), jax.random.key(6)])
    by_keys = eqx_ppo.train(ENV, networks, config(n_seeds=2), key=keys)
    assert same(by_seed.training_state, by_keys.training_state)


@pytest.mark.parametrize("seed", [0, 2**31 - 1, 2**32 - 3])
def test_the_seeds_keys_are_those_of_each_seed(seed):
    # `train` without a key derives seed i's keys from jax.random.key(seed + i),
    # in one vmapped program; up to the top of the 32-bit range.
    from eqx_ppo.ppo._train import _seed_keys

    got = _seed_keys(None, config(seed=seed, n_seeds=3))
    each = jax.numpy.stack([jax.random.key(seed + i) for i in range(3)])
    assert same(got, _seed_keys(each, config(n_seeds=3)))


def test_train_compiles_each_program_once_and_runs_no_eager_op():
    # On an accelerator each program is a compile, or a load from the cache:
    # the driver initialises (splitting the keys), runs the chunks, evaluates
    # and takes the seed out with one program each, and its three evaluations
    # (the first on the initialisation's states, the others on the chunks')
    # are one program. Sizes no other test uses, so nothing is in memory yet.
    compiled = collections.Counter()

    def listen(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiled[kwargs.get("fun_name")] += 1

    run = dataclasses.replace(
        config(evaluate=True),
        eval=eqx_ppo.EvalConfig(every_steps=16, n_envs=3, max_episode_length=5),
    )
    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        result = eqx_ppo.train(
            ENV, lambda k: eqx_ppo.make_mlp_actor_critic(2, 2, (7,), (5,), key=k), run
        )
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    assert len(result.eval_history) == 3
    programs = ["_init_seeds", "_run_chunk", "_evaluate", "seed_zero"]
    assert compiled == {f"jit({p})": 1 for p in programs}


def test_one_key_is_split_over_seeds():
    key = jax.random.key(3)
    result = eqx_ppo.train(ENV, networks, config(n_seeds=2), key=key)
    first = eqx_ppo.train(ENV, networks, config(), key=jax.random.split(key, 2)[0])
    seeds = result.training_state
    assert not same(
        eqx_ppo.select_seed(seeds.network, 0), eqx_ppo.select_seed(seeds.network, 1)
    )
    # seed 0 of the batch is the run with the first split key (to rounding:
    # the vmapped program is another program)
    assert seeds.steps[0] == first.training_state.steps
    assert_ulp_close(
        eqx_ppo.select_seed(seeds.network, 0), first.training_state.network
    )
    assert same(
        jax.random.key_data(eqx_ppo.select_seed(seeds.key, 0)),
        jax.random.key_data(first.training_state.key),
    )


@pytest.mark.parametrize("index", [True, 1.0, np.float32(1), jnp.array(1.0)])
def test_select_seed_refuses_an_index_that_is_not_an_integer(index):
    # `True` would pass `operator.index` and then add an axis instead of
    # picking seed 1; a float would fail inside NumPy or JAX indexing.
    tree = {"w": jnp.arange(6.0).reshape(2, 3)}
    with pytest.raises(TypeError, match=r"parameter '?seed_index"):
        eqx_ppo.select_seed(tree, index)
    picked = eqx_ppo.select_seed(tree, np.int64(1))
    np.testing.assert_array_equal(picked["w"], [3.0, 4.0, 5.0])


def test_select_seed_refuses_a_seed_out_of_range_or_a_single_seed_tree():
    key = jax.random.key(3)
    seeds = eqx_ppo.train(ENV, networks, config(n_seeds=2), key=key).training_state
    assert same(
        eqx_ppo.select_seed(seeds.network, -1), eqx_ppo.select_seed(seeds.network, 1)
    )
    for index in (2, -3):  # JAX indexing would clamp both to a seed
        with pytest.raises(
            IndexError,
            match=rf"select_seed\(seed_index={index}\): out of range for 2 seeds\. "
            r"Fix: pass 0 <= seed_index < 2\.",
        ):
            eqx_ppo.select_seed(seeds, index)
    with pytest.raises(
        ValueError, match=r"select_seed\(tree=\.\.\.\): the array leaves share no"
    ):
        eqx_ppo.select_seed(networks(key), 0)


def test_select_seed_of_a_train_result_is_that_seeds_result(unchecked):
    result = eqx_ppo.train(
        ENV, networks, config(n_seeds=2, evaluate=True), key=jax.random.key(4)
    )
    assert len(result.eval_history) == 2
    for index in (0, 1, -1):
        one = eqx_ppo.select_seed(result, index)
        assert same(
            one.training_state, eqx_ppo.select_seed(result.training_state, index)
        )
        for got, full in (
            (one.final_metrics, result.final_metrics),
            *zip(one.eval_history, result.eval_history, strict=True),
        ):
            assert set(got) == set(full)
            for key, value in full.items():
                expected = value[index] if isinstance(value, list) else value
                assert got[key] == expected, key
        assert one.total_steps == result.total_steps
    with pytest.raises(IndexError, match=r"out of range for 2 seeds"):
        eqx_ppo.select_seed(result, 2)
    # It used to return anything without array leaves unchanged.
    with pytest.raises(ValueError, match=r"share no leading seed axis"):
        eqx_ppo.select_seed(result.final_metrics, 0)


def test_analysis_of_a_multi_seed_network_asks_for_one_seed():
    stacked = eqx_ppo.train(
        ENV, networks, config(n_seeds=2), key=jax.random.key(6)
    ).training_state.network
    sizes = {"n_envs": 2, "max_episode_length": 3}
    for _, call in (
        ("eval_rollout", lambda net, k: eqx_ppo.eval_rollout(ENV, net, k, **sizes)),
        (
            "record_activations_rollout",
            lambda net, k: eqx_ppo.record_activations_rollout(ENV, net, key=k, **sizes),
        ),
    ):
        with pytest.raises(
            ValueError,
            match=r"Every array of `network` has a leading axis of 2: a network from "
            r"a run with TrainConfig\(n_seeds=2\)\? Fix: pick one seed",
        ):
            call(stacked, jax.random.key(0))
        # One seed, or a vmap over the seeds, is what it asks for.
        call(eqx_ppo.select_seed(stacked, 1), jax.random.key(0))
        keys = jax.random.split(jax.random.key(0), 2)
        eqx.filter_vmap(call)(stacked, keys)


def test_distillation_takes_a_key():
    teacher = networks(jax.random.key(0))
    dconfig = eqx_ppo.TrainConfig(
        learner=eqx_ppo.Distillation(
            teacher,
            n_envs=4,
            rollout_length=4,
            total_steps=32,
            n_minibatches=2,
            n_epochs=1,
        ),
        eval=eqx_ppo.EvalConfig(enabled=False),
        seed=5,
        progress=False,
    )
    by_seed = eqx_ppo.train(ENV, networks, dconfig)
    by_key = eqx_ppo.train(
        ENV,
        networks,
        dataclasses.replace(dconfig, seed=0),
        key=jax.random.key(5),
    )
    assert same(by_seed.training_state, by_key.training_state)
