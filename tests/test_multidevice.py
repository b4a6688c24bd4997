"""Data-parallel training over a device mesh (and over processes).

JAX fixes its device count when it starts, so every test runs a script in a
fresh Python with `XLA_FLAGS=--xla_force_host_platform_device_count=4`: four
CPU devices stand in for four accelerators. The scripts run with the suite's
settings (strict dtype promotion, warnings as errors, jaxtyping + beartype
checks of `eqx_ppo`).
"""

import pathlib
import socket
import subprocess
import sys
import textwrap

import pytest

from tests._helpers import cpu_child_env

# Each test starts processes with 4 virtual devices (about 2.5 min in all):
# they run with the slow tests, `pytest -m slow`, which CI runs too.
pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).parent.parent

_PRELUDE = """
import os
import warnings
warnings.simplefilter("error")
import jax
jax.config.update("jax_numpy_dtype_promotion", "strict")
from jaxtyping import install_import_hook
with install_import_hook(["eqx_ppo"], "beartype.beartype"):
    import eqx_ppo
    import eqx_ppo.ppo._step
import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from jax.tree_util import Partial
from eqx_ppo import LoggingLevel as L
from eqx_ppo import PPO, Distillation, EvalConfig, TrainConfig, init, step
from eqx_ppo import make_mesh, shard_state, shard_step


ENV = eqx_ppo.envs.make("move_to_center")
EVERY_LOG = (L.LOSSES | L.ACTOR_EXTRA | L.CRITIC_EXTRA | L.ROLLOUT_STATS
             | L.GRAD_NORM | L.NETWORK_METRICS | L.ENV_METRICS)


def lstm(key):
    # A normaliser (statistics), LSTM carries and a stochastic sampler: every
    # kind of state a sharded step must handle.
    return eqx_ppo.make_lstm_actor_critic(2, 2, 8, key=key)


def mlp(key):
    # Feed-forward (compiles faster); still a normaliser and a sampler.
    return eqx_ppo.make_mlp_actor_critic(2, 2, [8], [8], key=key)


def host(tree):
    def leaf(x):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        return np.asarray(jax.device_get(x), np.float64)
    return [leaf(x) for x in jax.tree.leaves(eqx.filter(tree, eqx.is_array))]


def assert_close(a, b, rtol=1e-5, atol=1e-6):
    la, lb = host(a), host(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        np.testing.assert_allclose(x, y, rtol=rtol, atol=atol)


def assert_metrics_close(a, b):
    assert a.keys() == b.keys(), set(a) ^ set(b)
    for k in a:
        np.testing.assert_allclose(
            np.asarray(a[k], np.float64), np.asarray(b[k], np.float64),
            rtol=1e-4, atol=1e-5, err_msg=k)
"""


def _env(devices: int) -> dict[str, str]:
    """This environment with `devices` CPU devices and without the suite's
    compilation cache (`conftest.py`): the two processes of one distributed
    run would read entries while the other writes them."""
    env = cpu_child_env(XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    return env


def run(script: str, *, devices: int = 4, timeout: int = 600, args=()) -> str:
    """Run `script` after the prelude in a fresh Python with `devices` CPU devices."""
    env = _env(devices)
    proc = subprocess.run(
        [sys.executable, "-c", _PRELUDE + textwrap.dedent(script), *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc.stdout


def test_sharded_step_matches_one_device():
    """One iteration on 4 devices equals one on 1 device given the same
    minibatches; the compiled iteration has no all-to-all."""
    out = run(
        """
        mesh = make_mesh()
        assert mesh.size == 4
        config = PPO(n_envs=16, rollout_length=6, n_epochs=2, n_minibatches=2,
                     learning_rate=1e-2, logging_level=EVERY_LOG,
                     logging_percentiles=(10, 50, 90), reset_mode="initial")
        state = init(ENV, lstm(jax.random.key(1)), config, key=jax.random.key(0))
        sharded = eqx.filter_jit(shard_step(Partial(step, ENV, config), mesh))
        four, four_metrics = sharded(shard_state(state, mesh))

        # One device, given the minibatches the four devices use: global
        # minibatch j is the union of every device's local minibatch j (local
        # permutations of 4 envs from fold_in(key, device), offset by 4 * device).
        original = eqx_ppo.ppo._step._permutations

        def blockwise(key, n_envs, n_epochs, n_minibatches, axis_name):
            assert axis_name is None  # the one-device step
            local = [original(jax.random.fold_in(key, d), n_envs // 4, n_epochs,
                              n_minibatches, None) + d * (n_envs // 4)
                     for d in range(4)]
            return jnp.concatenate(local, axis=1)

        eqx_ppo.ppo._step._permutations = blockwise
        one, one_metrics = eqx.filter_jit(step)(ENV, config, state)
        eqx_ppo.ppo._step._permutations = original

        # Every leaf (parameters, Adam moments, normaliser statistics, env
        # states and start states, LSTM carries, key, counters) and every
        # metric (losses, R^2, percentiles of gathered rollout data, grad norm).
        assert_close(one, four)
        assert_metrics_close(one_metrics, four_metrics)
        assert len(four_metrics) > 30

        # The collectives of one iteration, with the default logging.
        config = PPO(n_envs=16, rollout_length=6, n_epochs=2, n_minibatches=2)
        state = shard_state(init(ENV, lstm(jax.random.key(1)), config,
                                 key=jax.random.key(0)), mesh)
        hlo = (eqx.filter_jit(shard_step(Partial(step, ENV, config), mesh))
               .lower(state).compile().compiled.as_text())
        print("all-reduce ops per iteration:", hlo.count("all-reduce("))
        print("all-gather ops per iteration:", hlo.count("all-gather("))
        # Shuffles are device-local: no all-to-all traffic.
        assert "all-to-all" not in hlo
        assert hlo.count("all-reduce(") >= 1
        """
    )
    print(out)


def test_state_and_rollout_are_sharded_and_errors_are_clear():
    run(
        """
        from eqx_ppo.ppo._rollout import SaveAt, StepCarry, run_episodes
        mesh = make_mesh()
        env_spec, replicated = NamedSharding(mesh, P("env")), NamedSharding(mesh, P())
        config = TrainConfig(
            learner=PPO(n_envs=8, rollout_length=4, total_steps=64, n_minibatches=2),
            eval=EvalConfig(enabled=False), progress=False)
        saved = []
        result = eqx_ppo.train(ENV, lstm, config, mesh=mesh,
                               checkpoint_fn=lambda s, step: saved.append(s))
        state = result.training_state
        for x in jax.tree.leaves((state.env_state, state.carry)):
            assert x.sharding == env_spec, x.sharding
            assert {s.data.shape[0] for s in x.addressable_shards} == {2}
        for x in jax.tree.leaves(eqx.filter(
                (state.network, state.opt_state, state.key, state.steps),
                eqx.is_array)):
            assert x.sharding == replicated, x.sharding
        # checkpoint_fn gets the whole state on one device.
        for x in jax.tree.leaves(eqx.filter(saved[-1], eqx.is_array)):
            assert len(x.devices()) == 1
        assert saved[-1].env_state.obs.shape == (8, 2)

        # Rollout buffers are built per device: [T, 2] per shard, [T, 8] in all.
        def sharded_rollout(network, env_state, net_state, key):
            return run_episodes(ENV, network, StepCarry(env_state, net_state), key,
                                length=4, reset="cached", axis_name="env",
                                save=SaveAt(transitions=("obs",)))[1].transitions
        dynamic, static = eqx.partition(state.network, eqx.is_array)
        data = jax.jit(jax.shard_map(
            lambda d, e, n, k: sharded_rollout(eqx.combine(d, static), e, n, k),
            mesh=mesh, in_specs=(P(), P("env"), P("env"), P()),
            out_specs=P(None, "env"), check_vma=False,
        ))(dynamic, state.env_state, state.carry, state.key)
        assert data.obs.sharding == NamedSharding(mesh, P(None, "env"))
        assert data.obs.shape == (4, 8, 2)
        assert {s.data.shape for s in data.obs.addressable_shards} == {(4, 2, 2)}

        # n_envs must split into n_devices * n_minibatches local minibatches.
        bad = TrainConfig(learner=PPO(n_envs=12, n_minibatches=2), progress=False)
        try:
            eqx_ppo.train(ENV, lstm, bad, mesh=mesh)
        except ValueError as e:
            message = str(e)
        else:
            raise AssertionError("no error")
        assert "n_envs=12" in message and "4 * 2 = 8" in message, message
        assert "Fix" in message
        try:
            eqx_ppo.train(ENV, lstm, config, mesh=jax.sharding.Mesh(
                np.asarray(jax.devices()).reshape(2, 2), ("a", "b")))
        except ValueError as e:
            assert "'env'" in str(e), e
        else:
            raise AssertionError("no error")
        """
    )


def test_driver_on_mesh_matches_one_device_with_seeds_and_distillation():
    run(
        """
        mesh = make_mesh()
        ppo = PPO(n_envs=8, rollout_length=5, total_steps=8 * 5 * 3,
                  n_epochs=1, n_minibatches=1, learning_rate=1e-2,
                  logging_level=EVERY_LOG)
        config = TrainConfig(learner=ppo, seed=3, n_seeds=2, progress=False,
            eval=EvalConfig(every_steps=80, n_envs=4, max_episode_length=6))
        # Seeds x envs: each device holds 2 envs of each of 2 seeds.
        multi = eqx_ppo.train(ENV, mlp, config, mesh=mesh)
        obs = multi.training_state.env_state.obs
        assert obs.sharding == NamedSharding(mesh, P(None, "env")), obs.sharding
        assert {s.data.shape for s in obs.addressable_shards} == {(2, 2, 2)}
        for i in range(2):
            single = eqx_ppo.train(ENV, mlp, TrainConfig(
                learner=ppo, seed=3 + i, progress=False, eval=config.eval))
            assert_close(eqx_ppo.select_seed(multi.training_state, i),
                         single.training_state)
            for k, v in single.final_metrics.items():
                got = multi.final_metrics[k]  # per seed, but total_steps
                got = got[i] if isinstance(got, list) else got
                np.testing.assert_allclose(got, v, rtol=1e-4, atol=1e-5, err_msg=k)
        print("seeds x mesh ok")

        # Without a mesh, the run stays on the device the caller chose.
        with jax.default_device(jax.devices()[2]):
            placed = eqx_ppo.train(ENV, mlp, TrainConfig(
                learner=ppo, seed=4, progress=False, eval=config.eval))
        for leaf in jax.tree.leaves(placed.training_state):
            if isinstance(leaf, jax.Array):
                assert leaf.devices() == {jax.devices()[2]}, leaf.devices()
        assert_close(placed.training_state, single.training_state)  # seed 4
        print("default device ok")

        teacher = eqx_ppo.make_mlp_actor_critic(2, 2, [8], [8],
                                                key=jax.random.key(7))
        student = lambda k: eqx_ppo.make_mlp_actor_critic(2, 2, [8], [8], key=k)
        dconfig = TrainConfig(
            learner=Distillation(
                teacher, n_envs=8, rollout_length=5, total_steps=8 * 5 * 2,
                n_epochs=1, n_minibatches=1, learning_rate=1e-2,
                logging_level=L.LOSSES | L.ROLLOUT_STATS),
            eval=EvalConfig(enabled=False), progress=False)
        on_mesh = eqx_ppo.train(ENV, student, dconfig, mesh=mesh)
        alone = eqx_ppo.train(ENV, student, dconfig)
        assert on_mesh.training_state.carry["student"] is not None
        assert_close(on_mesh.training_state, alone.training_state)
        assert_metrics_close(on_mesh.final_metrics, alone.final_metrics)
        print("distillation ok")
        """
    )


def test_checkpoint_from_four_devices_resumes_on_one_and_two(tmp_path):
    run(
        """
        import sys
        directory = sys.argv[1]
        ppo = PPO(n_envs=8, rollout_length=5, total_steps=8 * 5 * 3,
                  n_epochs=1, n_minibatches=1, learning_rate=1e-2)
        config = TrainConfig(learner=ppo, eval=EvalConfig(enabled=False),
                             checkpoint_every_steps=80, progress=False)
        full = eqx_ppo.train(
            ENV, mlp, config, mesh=make_mesh(),
            checkpoint_fn=eqx_ppo.make_checkpoint_fn(directory, config, keep=None))
        path = [p for p in eqx_ppo.list_checkpoints(directory)
                if eqx_ppo.read_header(p).step == 80][0]
        for devices in (None, jax.devices()[:1], jax.devices()[:2]):
            state = eqx_ppo.load_checkpoint(path, env=ENV, networks=mlp,
                                            config=config)
            mesh = None if devices is None else make_mesh(devices)
            resumed = eqx_ppo.train(ENV, mlp, config, initial_state=state,
                                    mesh=mesh)
            assert resumed.total_iterations == 1
            assert_close(resumed.training_state, full.training_state)
            if mesh is not None:
                obs = resumed.training_state.env_state.obs
                assert len(obs.sharding.device_set) == len(devices)
            print("resumed on", "no mesh" if devices is None else len(devices))
        # A host copy (NumPy leaves), as checkpoint_fn is told to keep, resumes
        # on a mesh too.
        host_copy = jax.device_get(state)
        resumed = eqx_ppo.train(ENV, mlp, config, initial_state=host_copy,
                                mesh=make_mesh())
        assert_close(resumed.training_state, full.training_state)
        """,
        args=(str(tmp_path),),
    )


def test_four_devices_learn_move_to_center():
    out = run(
        """
        steps = 100_000
        config = TrainConfig(
            learner=PPO(n_envs=64, rollout_length=20, total_steps=steps,
                        learning_rate=3e-3, n_minibatches=4),
            eval=EvalConfig(every_steps=steps, n_envs=64, max_episode_length=20,
                            logging_percentiles=None),
            seed=int(os.environ.get("EQX_PPO_TEST_SEED_OFFSET", "0")), n_seeds=4,
            progress=False)
        result = eqx_ppo.train(
            ENV, lambda k: eqx_ppo.make_mlp_actor_critic(2, 2, [32, 32], [32, 32],
                                                         key=k),
            config, mesh=make_mesh())
        finals = np.asarray(result.eval_history[-1]["eval/episode_reward/mean"])
        print("eval returns", finals)
        # Optimal -2.0, random about -20; 16 unsharded seeds end in [-2.2, -2.1].
        assert np.median(finals) > -2.6 and finals.min() > -3.5, finals
        """
    )
    print(out)


_MULTI_PROCESS = """
import sys, pathlib
process_id, port, directory = int(sys.argv[1]), sys.argv[2], pathlib.Path(sys.argv[3])
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}",
                           num_processes=2, process_id=process_id)
assert jax.device_count() == 4 and jax.local_device_count() == 2
ppo = PPO(n_envs=8, rollout_length=5, total_steps=8 * 5 * 2,
          n_epochs=2, n_minibatches=2, learning_rate=1e-2)
config = TrainConfig(learner=ppo, checkpoint_every_steps=80, progress=False,
                     eval=EvalConfig(every_steps=80, n_envs=4, max_episode_length=6))
logged = []
result = eqx_ppo.train(
    ENV, mlp, config, mesh=make_mesh(),
    log_fn=lambda m, s: logged.append(s),
    checkpoint_fn=eqx_ppo.make_checkpoint_fn(directory / "multi", config, keep=None))
# Host events on process 0 only.
assert (len(logged) > 0) == (process_id == 0), logged
assert (len(result.eval_history) > 0) == (process_id == 0)
if process_id == 0:
    saved = eqx_ppo.load_checkpoint(directory / "multi", env=ENV, networks=mlp)
    assert int(saved.steps) == 80
    (directory / "eval.txt").write_text(
        repr(result.eval_history[-1]["eval/episode_reward/mean"]))
print("process", process_id, "done")
"""

_SINGLE_PROCESS = """
import sys, pathlib
directory = pathlib.Path(sys.argv[1])
ppo = PPO(n_envs=8, rollout_length=5, total_steps=8 * 5 * 2,
          n_epochs=2, n_minibatches=2, learning_rate=1e-2)
config = TrainConfig(learner=ppo, progress=False,
                     eval=EvalConfig(every_steps=80, n_envs=4, max_episode_length=6))
result = eqx_ppo.train(ENV, mlp, config, mesh=make_mesh())
multi = eqx_ppo.load_checkpoint(directory / "multi", env=ENV, networks=mlp)
# Two processes of two devices train exactly like one process of four.
assert_close(multi, result.training_state)
eval_multi = float((directory / "eval.txt").read_text())
np.testing.assert_allclose(
    eval_multi, result.eval_history[-1]["eval/episode_reward/mean"], rtol=1e-5)
print("same as one process")
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_train_like_one(tmp_path):
    """`jax.distributed` on CPU: 2 processes x 2 devices equal 1 process x 4."""
    port = str(_free_port())
    env = _env(2)
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                _PRELUDE + _MULTI_PROCESS,
                str(i),
                port,
                str(tmp_path),
            ],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    try:
        outputs = [p.communicate(timeout=600) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (stdout, stderr) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, stdout[-3000:] + stderr[-6000:]
    run(_SINGLE_PROCESS, args=(str(tmp_path),))
