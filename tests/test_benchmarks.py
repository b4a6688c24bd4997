"""The benchmark scripts' own logic: profile attribution, pairing, formatting.

The benchmarks themselves need Brax, flax and nnx-ppo and minutes of machine
time; these tests cover the parts whose breakage would silently corrupt the
published numbers, on hand-made inputs and on a real compiled program.
"""

import pathlib
import subprocess
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks._common import spread
from benchmarks.multiseed import _paired
from benchmarks.profile import _busy_us, _instructions, markdown
from eqx_ppo.nn import Dense

_HLO = """\
HloModule m

ENTRY %main.1 (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  %dot.7 = f32[4]{0} dot(%p, %p), metadata={op_name="jit(f)/dot" stack_frame_id=3}
  %multiply_fusion.2 = f32[4]{0} fusion(%dot.7), kind=kLoop, calls=%c, \
metadata={op_name="jit(f)/transpose(jvp(mul))" stack_frame_id=2}
  %copy.9 = f32[4]{0} copy(%multiply_fusion.2)
  %while.4 = (s32[]) while(%t), condition=%cond, body=%body, \
metadata={op_name="jit(f)/while" stack_frame_id=3}
  ROOT %add.5 = f32[4]{0} add(%copy.9, %p), metadata={op_name="jit(f)/add" \
stack_frame_id=4}
}

FileNames
1 "/site-packages/jax/_src/numpy/lax_numpy.py"
2 "/repo/eqx_ppo/nn/_dense.py"
3 "/repo/eqx_ppo/ppo/_loss.py"

FunctionNames
1 "dot"
2 "Dense.__call__"
3 "ppo_loss.<locals>.surrogate"

FileLocations
1 {file_name_id=1 function_name_id=1 line=10 end_line=10 column=1 end_column=2}
2 {file_name_id=2 function_name_id=2 line=173 end_line=173 column=1 end_column=2}
3 {file_name_id=3 function_name_id=3 line=283 end_line=283 column=1 end_column=2}

StackFrames
1 {file_location_id=2}
2 {file_location_id=3}
3 {file_location_id=1 parent_frame_id=1}
4 {file_location_id=1}
"""


def test_instructions_attribute_ops_to_the_innermost_eqx_ppo_frame():
    ops = _instructions(_HLO)
    # frame 3 is a jax frame whose parent (frame 1) is Dense.__call__ line 173
    assert ops["dot.7"] == ("dot", "eqx_ppo/nn/_dense.py:173 (Dense.__call__)")
    # `<locals>.` dropped; `transpose(` in the op name marks the backward pass
    assert ops["multiply_fusion.2"] == (
        "multiply_fusion",
        "eqx_ppo/ppo/_loss.py:283 (ppo_loss.surrogate), backward",
    )
    assert ops["copy.9"] == ("copy", "no stack frame (copies XLA inserted)")
    # frame 4 has only a jax location and no parent
    assert ops["add.5"] == ("add", "outside eqx_ppo")
    # a while loop's event spans its body's ops, which count themselves
    assert "while.4" not in ops


def test_instructions_read_a_real_compiled_program():
    layer = Dense(3, 4, activation="tanh", key=jax.random.key(0))

    def loss(layer, x):
        return jnp.sum(jax.vmap(lambda v: layer((), v).output)(x))

    params, static = eqx.partition(layer, eqx.is_array)
    fn = jax.jit(lambda p, x: jax.grad(loss)(eqx.combine(p, static), x))
    text = fn.lower(params, jnp.ones((5, 3))).compile().as_text()
    sources = {source for _, source in _instructions(text).values()}
    dense = [s for s in sources if s.startswith("eqx_ppo/nn/_dense.py:")]
    assert dense, sources
    assert all("(Dense.forward)" in s for s in dense)
    assert any(s.endswith(", backward") for s in dense)


def test_busy_time_is_the_union_of_intervals():
    # [0, 3] (two overlapping ops) + [5, 6] + [6, 7] (touching) = 3 + 2
    assert _busy_us([(5.0, 6.0), (0.0, 2.0), (1.0, 3.0), (6.0, 7.0)]) == 5.0
    assert _busy_us([(0.0, 4.0), (1.0, 2.0)]) == 4.0


def test_profile_markdown_rows_and_shares():
    result = {
        "spec": {"env": "e", "policy": "mlp", "n_seeds": 2, "n_envs": 8},
        "part": "update",
        "wall_ms": 3.0,
        "op_ms": 4.0,
        "ops": 1234,
        "busy_share": 0.75,
        "by_source": [{"name": "a.py:1 (f)", "ms": 3.0, "ops": 7}],
        "by_kind": [{"name": "dot", "ms": 1.0, "ops": 1234}],
    }
    result["spec"]["rollout_length"] = 20
    text = markdown(result)
    assert "(2 seeds x 8 envs x 20 steps)" in text
    assert "4.0 ms of op time in 1,234 op executions" in text
    assert "running 75% of the traced time" in text
    assert "| `a.py:1 (f)` | 3.00 | 75% | 7 |" in text
    assert "| `dot` | 1.00 | 25% | 1,234 |" in text


def test_paired_ratios_match_repetitions_and_skip_errors():
    runs = [
        {"rep": 0, "variant": "a", "sps": 90.0},
        {"rep": 0, "variant": "b", "sps": 100.0},
        {"rep": 1, "variant": "b", "sps": 50.0},
        {"rep": 1, "variant": "a", "sps": 40.0},
        {"rep": 2, "variant": "a", "sps": 1.0},
        {"rep": 2, "variant": "b", "error": "crashed"},
    ]
    assert _paired(runs, "a", "b", "sps") == [0.9, 0.8]


def test_spread_formats_median_and_range():
    assert spread([3.0, 1.0, 2.0]) == "2.00 [1.00, 3.00]"
    assert spread([1500.0, 2500.0, 2000.0]) == "2,000 [1,500, 2,500]"
    assert spread([12.345]) == "12.3"
    assert spread([float("nan")]) == "n/a"


@pytest.mark.slow
def test_memory_benchmark_quick_writes_both_results(tmp_path, monkeypatch):
    import json

    import benchmarks._common as common
    from benchmarks import memory

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    memory.main(["--quick"])

    replay = json.loads((tmp_path / "memory_replay.json").read_text())
    rows = {r["network"]: r for r in replay["rows"]}
    assert set(rows) == {"lstm", "mlp"}
    for r in rows.values():
        assert r["T"] == 4 and len(r["samples_ms"]) == 2 and r["loss_finite"]
        assert r["temp_bytes"] >= 0 and r["median_ms"] > 0
    # The MLP's speed-up is the paired per-round ratio of the two timings.
    ratios = np.divide(rows["lstm"]["samples_ms"], rows["mlp"]["samples_ms"])
    assert rows["mlp"]["speedup_vs_lstm"] == pytest.approx(np.median(ratios))
    text = (tmp_path / "memory_replay.md").read_text()
    assert "| lstm | " in text and "(1.00x)" in text and "| mlp (no memory" in text

    learning = json.loads((tmp_path / "memory_learning.json").read_text())
    (run,) = learning["runs"]
    assert run["network"] == "mlp" and run["task"] == "recall"
    assert len(run["curves"]) == 2  # one curve per seed
    assert len(run["eval_steps"]) == len(run["median_curve"]) >= 2
    finals = [curve[-1] for curve in run["curves"]]
    assert run["final_worst"] == min(finals) and run["final_best"] == max(finals)
    assert learning["settings"]["n_seeds"] == 2
    text = (tmp_path / "memory_learning.md").read_text()
    assert "`recall`" in text and "| mlp |" in text


def test_gymnax_view_for_rejax_resets_on_done_and_keeps_the_last_reward():
    pytest.importorskip("gymnax")
    from benchmarks._worker import gymnax_view
    from eqx_ppo import envs

    env = envs.make("move_to_center", episode_length=3)
    view = gymnax_view(env, 3)
    key = jax.random.key(0)
    obs, state = view.reset(key)
    inner = env.reset(key)
    assert jnp.array_equal(obs, inner.obs)
    action = jnp.full((env.action_size,), 0.5)
    for t in range(3):
        reset_key = jax.random.fold_in(key, t)
        inner = env.step(inner, action)
        obs, state, reward, done, _ = view.step(reset_key, state, action)
        # The reward and done of the step itself, never the fresh episode's.
        assert reward == inner.reward
        assert bool(done) == (t == 2)
    # After the time limit, the view is at the start of a new episode.
    assert jnp.array_equal(obs, env.reset(reset_key).obs)
    assert view.action_space().shape == (env.action_size,)
    assert view.observation_space().shape == (env.observation_size,)


def test_rejax_runner_trains_and_reports_throughput():
    pytest.importorskip("rejax")
    from benchmarks._common import Spec
    from benchmarks._worker import run_rejax

    spec = Spec(
        system="rejax",
        env="move_to_center",
        n_envs=16,
        rollout_length=4,
        n_minibatches=2,
        n_epochs=1,
        total_steps=16 * 4 * 6,
        n_chunks=3,
        eval_envs=4,
    )
    # rejax computes `1 - done` on booleans, which the suite's strict
    # promotion refuses; the benchmark runs under JAX's standard rules.
    with jax.numpy_dtype_promotion("standard"):
        out = run_rejax(spec)
    assert out["steps"] == spec.run_steps
    assert out["sps"] > 0 and len(out["sps_chunks"]) == 2
    assert jnp.isfinite(out["eval_return"])


def test_fusion_forms_compute_the_same_gradients():
    from benchmarks.fusion import markdown, run

    result = run(rows=8, hidden=(4, 4, 4), rounds=2)
    assert result["gradients_agree"] == {
        "separate": True,
        "stacked": True,
        "block-diagonal": True,
    }
    assert result["speed_vs_separate"]["separate"] == 1.0
    text = markdown({**result, "machine": {"backend": "cpu", "cpu_count": 2}})
    assert "| stacked |" in text and "NO" not in text


def test_memory_kind_names_the_lru_state_size():
    from benchmarks.memory import _label, _replay_path, make_network
    from eqx_ppo import envs, nn

    env = envs.make("repeat_previous")
    for kind, states in (("lru", 4), ("lru@3", 3), ("lru@3:parallel", 3)):
        net = make_network(kind, env, jax.random.key(0), 8, ())
        lrus = [
            m
            for m in jax.tree.leaves(net, is_leaf=lambda m: isinstance(m, nn.LRU))
            if isinstance(m, nn.LRU)
        ]
        assert [m.hidden_size for m in lrus] == [states, states]
        assert all(m.out_size == 8 for m in lrus)
    assert _label("lru@32") == "lru, 32 complex states"
    assert _label("lru@32:parallel").startswith("lru, 32 complex states, associative")
    assert _replay_path("lru@32:parallel") == "associative scan"


@pytest.mark.parametrize("cell", ["lru", "mingru"])
def test_memory_floor_replays_the_projections_without_the_recurrence(cell):
    from benchmarks.memory import make_network
    from eqx_ppo import envs, nn

    env = envs.make("repeat_previous")
    net = make_network(f"{cell}:floor", env, jax.random.key(0), 4, ())
    floors = [
        m
        for m in jax.tree.leaves(net, is_leaf=lambda m: hasattr(m, "cell"))
        if hasattr(m, "cell")
    ]
    assert len(floors) == 2  # the actor's and the critic's cell
    floor = floors[0]
    xs = jax.random.normal(jax.random.key(1), (5, 2, floor.cell.in_size))
    done = jnp.zeros((5, 2), bool)
    state0 = floor.initialize_state(2)
    out = floor.replay(state0, xs, None, None, done)
    steps = xs.reshape(10, -1)
    _, drive = floor.cell._coefficients(steps)
    assert jnp.array_equal(
        out.output, floor.cell._output(drive, steps).reshape(5, 2, -1)
    )
    assert "scan" not in str(
        jax.make_jaxpr(lambda x: floor.replay(state0, x, None, None, done).output)(xs)
    )
    # The rollout still steps the real cell.
    step = floor(floor.initial_state(), xs[0, 0])
    assert jnp.array_equal(
        step.output, floor.cell(floor.initial_state(), xs[0, 0]).output
    )
    assert isinstance(floor.cell, nn.LRU if cell == "lru" else nn.MinGRU)


@pytest.mark.slow  # loads the MuJoCo model; keeps the default suite under 15 min
def test_playground_benchmark_env_is_the_same_env_for_every_system():
    pytest.importorskip("mujoco_playground")
    from benchmarks._common import EPISODE_LENGTH, eqx_env, raw_env

    # Playground's env code mixes Python floats and booleans.
    with jax.numpy_dtype_promotion("standard"):
        ours, theirs = eqx_env("cartpole_balance"), raw_env("cartpole_balance")
        assert ours.observation_size == theirs.observation_size
        assert ours.action_size == theirs.action_size
    assert theirs._config.impl == "jax"
    assert ours.max_len == EPISODE_LENGTH["cartpole_balance"]


# Warnings Brax raises on import, outside our control.
@pytest.mark.slow  # compiles a Brax env; keeps the default suite under 15 min
@pytest.mark.filterwarnings("ignore:JAXopt is no longer maintained:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:Brax System:UserWarning")
@pytest.mark.filterwarnings("ignore:Accessing .* from `Data` is deprecated")
def test_layout_forms_agree_and_render():
    pytest.importorskip("brax")
    from benchmarks.layout import markdown, run

    # Brax's env code mixes booleans and Python floats.
    with jax.numpy_dtype_promotion("standard"):
        result = run(seeds=2, envs_per_seed=3, rows=4, rounds=2)
    assert all(result["gemm_gradients_agree"].values())
    assert len(result["gemm_gradients_agree"]) == 3
    assert result["env_results_agree"]
    text = markdown({**result, "machine": {"backend": "cpu", "cpu_count": 2}})
    assert "| batched GEMM (the seed vmap) |" in text and "1.00x" in text
    assert "nested vmap, 2 x 3" in text and "NO" not in text


def test_dips_table_pairs_each_checkpoint_both_ways():
    from benchmarks.dips import markdown

    result = {
        "seeds": 2,
        "steps": [0, 102_400],
        "returns": {
            "deterministic": [[40.0, 45.0], [500.0, 120.0]],
            "stochastic": [[30.0, 31.0], [150.0, 110.0]],
        },
        "collapsed": {"deterministic": 1, "stochastic": 0},
        "reached_level": 400.0,
        "collapsed_level": 200.0,
    }
    text = markdown(result)
    assert "| seed | 0k | 102k |" in text
    assert "| 0 | 40 / 30 | 500 / 150 |" in text
    assert "| 1 | 45 / 31 | 120 / 110 |" in text
    assert "deterministic 1/2, stochastic 0/2" in text


def test_memory_replay_program_runs_each_update_on_new_parameters():
    """The timed program is `updates` gradient steps, none a repeat of the last
    (a repeat could be hoisted out of the loop), as many as one `ppo_step` runs
    by default; the loss it reports is the first update's."""
    import eqx_ppo
    from benchmarks.memory import UPDATES_PER_CALL, _replay_program

    defaults = eqx_ppo.PPOConfig()
    assert UPDATES_PER_CALL == defaults.n_epochs * defaults.n_minibatches
    fn, (params, minibatch), _, _, finite, first = _replay_program(
        "mlp", 4, 2, 4, updates=3
    )
    final, values = fn(params, minibatch)
    assert finite and values.shape == (3,)
    assert len(set(values.tolist())) == 3
    assert first == values[0]
    assert not all(
        jnp.array_equal(a, b)
        for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(final), strict=True)
    )


def test_results_name_the_processor_and_its_vector_instructions():
    from benchmarks._common import _processor, cores

    intel = (
        "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8481C\n"
        "flags\t\t: fpu sse4_2 avx avx2 avx512f amx_tile\n\n"
        "processor\t: 1\nmodel name\t: ignored, the first core's name counts\n"
    )
    amd = (
        "cpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC\n"
        "flags\t\t: fpu sse4_2 fma avx avx2\n"
    )
    assert _processor(intel) == {
        "cpu": "Intel(R) Xeon(R) Platinum 8481C",
        "cpu_id": "",
        "vector_isa": "AVX-512",
    }
    assert _processor(amd) == {
        "cpu": "AMD EPYC",
        "cpu_id": "family 25 model 17",
        "vector_isa": "AVX2",
    }
    assert _processor("model name\t: Old\nflags\t: fpu avx\n")["vector_isa"] == "AVX"
    assert _processor("model name\t: Old\nflags\t: fpu sse2\n")["vector_isa"] == "SSE"
    assert _processor("")["vector_isa"] == "unknown"
    m = {"cpu_count": 2, **_processor(amd), "xla_flags": ""}
    assert cores(m) == "2 cores of AMD EPYC (family 25 model 17, AVX2)"
    capped = {**m, "xla_flags": "--xla_cpu_max_isa=SSE4_2"}
    assert cores(capped) == (
        "2 cores of AMD EPYC (family 25 model 17, AVX2, "
        "XLA_FLAGS=--xla_cpu_max_isa=SSE4_2)"
    )
    intel_m = {"cpu_count": 2, **_processor(intel), "xla_flags": ""}
    assert cores(intel_m) == "2 cores of Intel(R) Xeon(R) Platinum 8481C (AVX-512)"
    assert cores({"cpu_count": 2}) == "2 CPU cores"


def test_stability_results_name_the_machine_and_run_as_a_file():
    from benchmarks._common import _processor
    from benchmarks.stability import markdown

    amd = "cpu family\t: 23\nmodel\t\t: 1\nmodel name\t: AMD EPYC\nflags\t: avx2\n"
    m = {"jax": "0.10.2", "cpu_count": 2, **_processor(amd), "xla_flags": ""}
    row = {
        "env": "cartpole",
        "seeds": 16,
        "median": 500.0,
        "p10": 480.0,
        "worst": 412.0,
        "reached": 16,
        "collapsed": 0,
        "reached_level": 450.0,
        "collapsed_level": 200.0,
        "optimum": 500,
        "wall_s": 61.2,
    }
    table = markdown([row], "after", m).splitlines()
    assert table[2] == "JAX 0.10.2 on 2 cores of AMD EPYC (family 23 model 1, AVX2)."
    assert table[-1] == (
        "| cartpole | 16 | 500 | 480 | 412 | 16/16 | 0/16 | 450 / 200 | 500 | 61 |"
    )
    # The docstring's way to measure another checkout's defaults: the script
    # run as a file, which finds `_common` beside it.
    script = pathlib.Path(__file__).parent.parent / "benchmarks" / "stability.py"
    run = subprocess.run(
        [sys.executable, str(script), "--help"], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    assert "--override" in run.stdout


@pytest.mark.parametrize(
    "script",
    ["compare", "dips", "fusion", "guards", "layout", "memory", "multiseed"]
    + ["profile", "quality", "scaling"],
)
def test_every_publishing_script_can_write_under_another_name(script, capsys):
    # Rerunning a benchmark from a checkout must not have to overwrite the
    # committed results it is compared with.
    import importlib

    module = importlib.import_module(f"benchmarks.{script}")
    with pytest.raises(SystemExit) as exit_info:
        module.main(["--help"])
    assert exit_info.value.code == 0
    assert "--name" in capsys.readouterr().out
