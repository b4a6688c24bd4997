"""Multi-seed initialisation: the vmapped network factory must not deadlock.

On a 2-core CPU, `jax.nn.initializers.orthogonal` under `vmap` became one
batched QR per recurrent kernel; XLA:CPU ran two of them at once on its
two-thread intra-op pool, each waiting for sub-tasks on that same pool, and
`train(..., TrainConfig(n_seeds=4))` with an LSTM(256) hung forever in
its init. eqx_ppo's `orthogonal` (`eqx_ppo.nn._dense`) loops over the batch
instead.
"""

import dataclasses
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from eqx_ppo import nn
from eqx_ppo.nn._dense import orthogonal
from tests._helpers import cpu_child_env

_HANG_REPRO = textwrap.dedent(
    """
    import eqx_ppo

    env = eqx_ppo.envs.make("recall")
    config = eqx_ppo.TrainConfig(
        learner=eqx_ppo.PPO(
            n_envs=8, rollout_length=16, total_steps=128, n_minibatches=1
        ),
        eval=eqx_ppo.EvalConfig(enabled=False),
        n_seeds=4,
        progress=False,
    )
    result = eqx_ppo.train(
        env,
        lambda k: eqx_ppo.make_lstm_actor_critic(2, 1, lstm_size=256, key=k),
        config,
    )
    print("trained", result.total_steps)
    """
)


@pytest.mark.slow  # 15-30 s; the jaxpr test below guards the same fix quickly
def test_multi_seed_lstm_init_finishes():
    # The deadlock never ended. A subprocess, so a regression fails this test
    # instead of hanging the suite.
    done = subprocess.run(
        [sys.executable, "-c", _HANG_REPRO],
        capture_output=True,
        env=cpu_child_env(),  # a CPU deadlock
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "trained 128" in done.stdout


def test_orthogonal_gives_jax_values_unbatched_and_vmapped():
    init = orthogonal()
    reference = jax.nn.initializers.orthogonal()
    keys = jax.random.split(jax.random.key(0), 3)
    one = init(keys[1], (6, 6))
    np.testing.assert_array_equal(one, reference(keys[1], (6, 6)))
    q = np.asarray(one)
    np.testing.assert_allclose(q @ q.T, np.eye(6), atol=1e-5)
    # Vmapped (and nested), every slice is that key's unbatched matrix: the
    # same QR on the same shape, looped.
    batched = jax.jit(jax.vmap(lambda k: init(k, (6, 4))))(keys)
    nested = jax.jit(jax.vmap(jax.vmap(lambda k: init(k, (6, 4)))))(keys.reshape(1, 3))
    for i, k in enumerate(keys):
        expected = jax.jit(lambda k: reference(k, (6, 4)))(k)
        np.testing.assert_allclose(batched[i], expected, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(nested[0, i], expected, rtol=1e-6, atol=1e-7)


def _qr_operand_shapes(jaxpr) -> list[tuple[int, ...]]:
    from jax.extend.core import jaxprs_in_params

    shapes = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "qr":
            shapes.append(eqn.invars[0].aval.shape)
        for sub in jaxprs_in_params(eqn.params):
            shapes += _qr_operand_shapes(sub)
    return shapes


def test_vmapped_recurrent_init_runs_no_batched_qr():
    """The deadlock needs batched QR calls; the default init makes none."""
    keys = jax.random.split(jax.random.key(0), 3)
    ours = jax.make_jaxpr(jax.vmap(lambda k: nn.LSTM(4, 5, key=k).recurrent_kernel))
    shapes = _qr_operand_shapes(ours(keys).jaxpr)
    assert shapes and all(s == (5, 5) for s in shapes), shapes
    # JAX's own initialiser does batch them: what this test guards against.
    theirs = jax.make_jaxpr(
        jax.vmap(lambda k: jax.nn.initializers.orthogonal()(k, (5, 5)))
    )
    assert (3, 5, 5) in _qr_operand_shapes(theirs(keys).jaxpr)


def test_initialisation_compiles_once_per_shape():
    """A second run with the same env, factory and config reuses the compiled
    initialisation: the factory is traced once, whatever the seed, and once
    more for runs given keys, whatever their values."""
    import eqx_ppo
    from eqx_ppo.ppo._train import _init_seeds

    traces = []

    def initial(config, key=None):
        seed = np.uint32(config.seed)
        return _init_seeds(env, networks, config.learner, key, seed, config.n_seeds)[0]

    def networks(key):
        traces.append(1)
        return eqx_ppo.make_mlp_actor_critic(2, 2, [4], [4], key=key)

    env = eqx_ppo.envs.make("move_to_center")
    for n_seeds in (1, 3):
        config = eqx_ppo.TrainConfig(
            learner=eqx_ppo.PPO(n_envs=4, rollout_length=4, total_steps=16),
            n_seeds=n_seeds,
            progress=False,
        )
        traces.clear()
        first = initial(config)
        initial(dataclasses.replace(config, seed=9))
        again = initial(config)
        assert len(traces) == 1, n_seeds
        initial(config, key=jax.random.key(7))
        initial(config, key=jax.random.key(8))
        assert len(traces) == 2, n_seeds
        assert all(
            bool(np.array_equal(a, b))
            for a, b in zip(
                jax.tree.leaves(first.network),
                jax.tree.leaves(again.network),
                strict=True,
            )
        )


def test_the_chunk_compiles_in_a_thread_while_the_initialisation_runs():
    """`train` lowers the initialisation, then the chunk for the shapes it
    will output, and compiles the chunk in a thread while the
    initialisation compiles on the caller's: each once. A second run of the
    same env, factory and config compiles neither again."""
    import threading

    import eqx_ppo

    events = []

    def listen(event, duration, **kwargs):
        name = kwargs.get("fun_name", "")
        if "_run_chunk" in name or "_init_seeds" in name:
            kind = event.rsplit("/", 1)[-1]
            name = name.removeprefix("jit(").removesuffix(")")
            events.append((kind, name, threading.get_ident()))

    config = eqx_ppo.TrainConfig(
        learner=eqx_ppo.PPO(n_envs=4, rollout_length=4, total_steps=32),
        eval=eqx_ppo.EvalConfig(enabled=False),
        progress=False,
    )

    def factory(key):
        return eqx_ppo.make_mlp_actor_critic(2, 2, [7, 3], [5], key=key)

    def run():
        return eqx_ppo.train(eqx_ppo.envs.make("move_to_center"), factory, config)

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        first = run()
        n_first = len(events)
        again = run()
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    kinds = [(kind, name) for kind, name, _ in events[:n_first]]
    compiles = [e for e in events if e[0] == "backend_compile_duration"]
    assert [name for _, name, _ in compiles] == ["_init_seeds", "_run_chunk"]
    threads = {name: thread for _, name, thread in compiles}
    assert threads["_init_seeds"] == threading.get_ident() != threads["_run_chunk"]
    lowered = kinds.index(("jaxpr_to_mlir_module_duration", "_run_chunk"))
    assert lowered < kinds.index(("backend_compile_duration", "_init_seeds"))
    assert len(events) == n_first  # the second run reused both programs
    assert first.total_steps == again.total_steps == 32
    leaves = [jax.tree.leaves(r.training_state) for r in (first, again)]
    for a, b in zip(*leaves, strict=True):
        if isinstance(a, jax.Array) and not jax.dtypes.issubdtype(
            a.dtype, jax.dtypes.prng_key
        ):
            assert bool((a == b).all())


@pytest.mark.parametrize("reset_mode", ["cached", "fresh", "initial"])
def test_the_runs_programs_trace_the_envs_reset_and_step_once(reset_mode):
    """Every env's `reset` and `step` are one jitted function under the envs'
    `vmap`, so a run's programs (the initialisation, the chunk, the evaluation
    at another number of envs) share their traces: the env's code is traced
    once per run (a Brax env's reset and step are seconds of tracing on a TPU
    host). The initialisation too is traced once (the network factory runs
    once), though the chunk is lowered for its shapes before it is lowered."""
    import eqx_ppo

    traced = []

    def factory(key):
        traced.append(("factory", key.shape))
        return _factory(key)

    class Counted(eqx_ppo.envs.AbstractWrapper):  # a new class: nothing cached
        env: eqx_ppo.envs.AbstractEnv

        def reset(self, key):
            traced.append(("reset", key.shape))
            return self.env.reset(key)

        def step(self, state, action):
            traced.append(("step", action.shape))
            return self.env.step(state, action)

    config = eqx_ppo.TrainConfig(
        learner=eqx_ppo.PPO(
            n_envs=4, rollout_length=4, total_steps=32, reset_mode=reset_mode
        ),
        eval=eqx_ppo.EvalConfig(n_envs=3, max_episode_length=5, every_steps=16),
        progress=False,
    )
    env = Counted(eqx_ppo.envs.make("move_to_center"))
    result = eqx_ppo.train(env, factory, config)
    assert result.total_steps == 32
    assert len(result.eval_history) == 3  # at steps 0, 16 and 32
    assert sorted(traced) == [("factory", ()), ("reset", ()), ("step", (2,))]


def _factory(key):
    return nn.make_mlp_actor_critic(2, 2, [4], [4], key=key)
