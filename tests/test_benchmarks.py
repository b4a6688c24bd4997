"""The benchmark scripts' own logic: profile attribution, pairing, formatting.

The benchmarks themselves need Brax, flax and nnx-ppo and minutes of machine
time; these tests cover the parts whose breakage would silently corrupt the
published numbers, on hand-made inputs and on a real compiled program.
"""

import dataclasses
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


def test_compile_ab_pairs_each_repetition():
    from benchmarks.compile_ab import markdown

    runs = {
        "this": [
            {"trace_s": 1.0, "lower_s": 1.0, "xla_s": 2.0, "compile_s": 4.0},
            {"trace_s": 3.0, "lower_s": 1.0, "xla_s": 2.0, "compile_s": 6.0},
        ],
        "baseline": [
            {"trace_s": 2.0, "lower_s": 1.0, "xla_s": 2.0, "compile_s": 5.0},
            {"trace_s": 3.0, "lower_s": 1.0, "xla_s": 2.0, "compile_s": 5.0},
        ],
    }
    ratios = {
        f: [a[f] / b[f] for a, b in zip(runs["this"], runs["baseline"], strict=True)]
        for f in runs["this"][0]
    }
    text = markdown(
        {
            "policy": "mlp",
            "baseline": "/x/base",
            "runs": runs,
            "ratios": ratios,
            "machine": {"backend": "cpu", "cpu_count": 2},
        }
    )
    assert "| tracing | 2.00 [1.00, 3.00] | 2.50 [2.00, 3.00] | 0.75 |" in text
    row = "| compile + first chunk | 5.00 [4.00, 6.00] | 5.00 [5.00, 5.00] | 1.00 |"
    assert row in text


def test_init_compile_compiles_each_part_alone():
    from benchmarks.init_compile import markdown, run

    result = run("cartpole", 4, (4, 4))
    names = [row["program"] for row in result["programs"]]
    assert names[:2] == ["network factory", "init on a built network"]
    assert all(row["xla_s"] > 0 and row["hlo_lines"] > 0 for row in result["programs"])
    text = markdown({**result, "machine": {"backend": "cpu"}})
    assert "| env reset, 4 envs |" in text


def test_accuracy_measures_ulps_against_float64():
    # On a CPU XLA's exp and log are within about one ulp: a wrong error
    # measure (relative error for ulps, float32 references) would not be.
    from benchmarks.accuracy import markdown, run

    result = run()
    rows = result["functions"]
    assert set(rows) >= {"exp", "log", "tanh", "softplus"}
    if result["backend"] == "cpu":
        assert 0.5 <= rows["exp"]["max_ulp"] <= 2 and 0.5 <= rows["log"]["max_ulp"] <= 2
        assert all(row["max_rel"] < 1e-6 for row in rows.values())
    machine = {"backend": "cpu", "cpu_count": 2}
    text = markdown({**result, "machine": machine, "versions": {}})
    assert "| `log` |" in text


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
    assert _replay_path("lru@32:parallel", 256) == "associative scan"
    assert _replay_path("mingru:scan", 16) == "scan"


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
    (a repeat could be hoisted out of the loop), as many as one `step` runs
    by default; the loss it reports is the first update's."""
    import eqx_ppo
    from benchmarks.memory import UPDATES_PER_CALL, _replay_program

    defaults = eqx_ppo.PPO()
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


def test_a_collapse_is_a_fall_after_holding_the_level():
    from benchmarks.stability import collapsed_seeds

    returns = np.array(
        [
            [38, 296, 500, 500, 500, 39],  # held 500, then fell: collapsed
            [41, 500, 176, 500, 500, 500],  # one early 500 fell back, then learned
            [41, 500, 500, 150, 500, 500],  # held twice, then fell once
            [10, 20, 300, 350, 390, 150],  # never reached 400
        ],
        dtype=float,
    ).T
    assert collapsed_seeds(returns, 400.0, 200.0) == 3
    assert collapsed_seeds(returns, 400.0, 200.0, held=2) == 2
    assert collapsed_seeds(returns, 400.0, 200.0, held=3) == 1
    # Falling to exactly the level is not below it.
    assert collapsed_seeds(np.array([[500.0], [200.0]]), 400.0, 200.0) == 0


@pytest.mark.parametrize(
    "script",
    ["compare", "dips", "fusion", "guards", "layout", "lesions", "memory", "multiseed"]
    + ["profile", "quality", "scaling", "compile_time", "seeds_at_scale"]
    + ["init_compile", "compile_ab", "accuracy", "chunk_overhead"],
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


def test_compare_runs_the_env_and_minibatch_count_asked_for(monkeypatch):
    from benchmarks import compare

    seen = {}
    monkeypatch.setattr(
        compare,
        "run",
        lambda base, systems, reps, **_: seen.update(base=base, systems=systems),
    )
    monkeypatch.setattr(compare, "publish", lambda *args: None)
    monkeypatch.setattr(compare, "machine", lambda: None)
    compare.main(["--env", "cartpole", "--minibatches", "32", "--systems", "eqx,brax"])
    assert seen["systems"] == ["eqx", "brax"]
    assert (seen["base"].env, seen["base"].n_minibatches) == ("cartpole", 32)
    compare.main(["--systems", "eqx"])
    assert seen["base"].n_minibatches == 8  # the other settings' count


# ------------------------------------------------- backend-agnostic orchestration

_NO_JAX_IN_PARENTS = """
import os, sys
from benchmarks import (
    _common, accelerator, compare, compile_time, memory, multiseed, profile,
    quality, scaling, seeds_at_scale,
)
for platforms in ("", "tpu"):
    os.environ["JAX_PLATFORMS"] = platforms
    accelerator.main(["--dry-run", "--part", "all"])
_common.machine()
_common.versions()
seeds_at_scale.items(seeds_at_scale.Settings())
compile_time.plan(compile_time.default_spec("cartpole", True))
loaded = sorted(m for m in sys.modules if m == "jax" or m.startswith("jax."))
assert not loaded, loaded
print("no jax")
"""


def test_orchestrators_never_import_jax():
    # On a TPU only one process can hold the chip: a parent that imported JAX
    # (and so could open it) made every worker fail with "libtpu lockfile".
    root = pathlib.Path(__file__).parent.parent
    run = subprocess.run(
        [sys.executable, "-c", _NO_JAX_IN_PARENTS],
        capture_output=True,
        text=True,
        cwd=root,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.rstrip().endswith("no jax")
    # The TPU plan sizes its runs for the chip and says how long it takes.
    assert "JAX should find 'tpu' here: accelerator sizes" in run.stdout
    assert "compare_cartpole_2048_4x32: env steps per run: eqx " in run.stdout
    assert "estimated: compare+lstm+multiseed" in run.stdout


def test_results_are_named_after_the_backend():
    from benchmarks._common import result_stem

    assert result_stem("{backend}_compare_x", "tpu") == "tpu_compare_x"
    assert result_stem("{backend}_compare_x", "cpu") == "cpu_compare_x"
    # A CPU keeps the committed plain names; an accelerator never overwrites them.
    assert result_stem("compare_x", "cpu") == "compare_x"
    assert result_stem("compare_x", "gpu") == "gpu_compare_x"


def test_publish_takes_the_backend_from_the_workers_result(tmp_path, monkeypatch):
    import json

    import benchmarks._common as common

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    device = {"backend": "tpu", "device_kind": "TPU v5 lite", "device_count": 1}
    started = {"jax": "0.10.2", "cpu_count": 13, "cpu": "AMD EPYC", "vector_isa": ""}

    def render(result):
        return common.hardware(result["machine"])

    path = common.publish("{backend}_x", {"device": device}, render, started)
    assert path == tmp_path / "tpu_x.md"
    assert path.read_text() == "1 x TPU v5 lite (tpu), host: 13 cores of AMD EPYC ()"
    saved = json.loads((tmp_path / "tpu_x.json").read_text())
    assert saved["machine"]["device_kind"] == "TPU v5 lite"
    assert saved["machine"]["jax"] == "0.10.2"


def test_expected_backend_follows_jax_platforms(monkeypatch):
    from benchmarks._common import expected_backend

    monkeypatch.setenv("JAX_PLATFORMS", "cuda,cpu")
    assert expected_backend() == "gpu"
    monkeypatch.setenv("JAX_PLATFORMS", "tpu")
    assert expected_backend() == "tpu"


def test_rotation_moves_the_first_system_each_repetition():
    from benchmarks.accelerator import rotation

    assert rotation(["a", "b", "c"], 0) == ["a", "b", "c"]
    assert rotation(["a", "b", "c"], 1) == ["b", "c", "a"]
    assert rotation(["a", "b", "c"], 5) == ["c", "a", "b"]


def test_session_items_pair_every_repetition_and_size_for_steady_work():
    from benchmarks import accelerator
    from benchmarks._common import Spec

    sizes = accelerator.Sizes(accelerator=True)
    settings = accelerator.settings(
        ["compare", "lstm"], sizes, ["cartpole"], ["eqx", "brax", "rejax"]
    )
    assert [s.stem for s in settings] == [
        "compare_cartpole_2048_4x32",
        "compare_cartpole_8192_4x256",
        "compare_inverted_pendulum_lstm",
    ]
    items = accelerator.session_items(settings, 3, sizes)
    for setting in settings:
        mine = [i for i in items if i["setting"] == setting.stem]
        reps = [[i["label"] for i in mine if i["rep"] == r] for r in range(3)]
        # every repetition runs each system once; the order rotates
        assert all(sorted(r) == sorted(setting.variants) for r in reps)
        assert len({tuple(r) for r in reps}) == min(3, len(setting.variants))
        # only repetition 0 is scored by the evaluator (not at 8192 envs)
        evaluated = {i["rep"] for i in mine if Spec.from_json(i["spec"]).evaluate}
        assert evaluated == (set() if "8192" in setting.stem else {0})
        assert {Spec.from_json(i["spec"]).seed for i in mine} == {0, 1, 2}
    # no system compiles first in both compare settings
    firsts = [items[0]["label"], items[9]["label"]]
    assert firsts[0] != firsts[1]
    # >= 5 s of steady work (all chunks but the first) for the fastest system,
    # and for rejax, sized by its own throughput
    small = settings[0].variants
    rates = accelerator.RATES["cartpole", 2048, 32]
    for label in ("eqx", "rejax"):
        spec = small[label]
        steady = spec.run_steps * (spec.n_chunks - 1) / spec.n_chunks
        rate = max(rates.values()) if label == "eqx" else rates["rejax"]
        assert 5.0 <= steady / rate < 6.5
    assert small["eqx"].run_steps == small["brax"].run_steps > small["rejax"].run_steps
    assert settings[1].variants["eqx"].hidden == (256,) * 4
    assert settings[1].variants["eqx"].n_minibatches == 32
    assert all(i["estimate_s"] > 0 for i in items)


def test_accelerator_summary_pairs_runs_of_one_repetition():
    from benchmarks._common import Spec
    from benchmarks.accelerator import Setting, markdown, summarise

    setting = Setting("s", "compare", "title", {"eqx": Spec(), "brax": Spec()})

    def run(label, rep, sps, compile_s, **extra):
        return dict(label=label, rep=rep, sps=sps, compile_s=compile_s, steps=100,
                    train_wall_s=2.0, **extra)  # fmt: skip

    runs = [
        run("eqx", 0, 10.0, 30.0, eval_return=500.0),
        run("brax", 0, 5.0, 20.0, eval_return=480.0),
        run("brax", 1, 4.0, 3.0),
        run("eqx", 1, 12.0, 1.0),
        {"label": "eqx", "rep": 2, "error": "crashed"},
        run("brax", 2, 8.0, 3.0),
    ]
    summary = summarise(setting, runs)
    assert summary["paired_ratios"] == {"brax": [2.0, 3.0]}
    eqx = summary["variants"]["eqx"]
    assert eqx["compile_cold_s"] == [30.0] and eqx["compile_warm_s"] == [1.0]
    assert eqx["eval_return"] == [500.0] and eqx["sps"] == [10.0, 12.0]
    result = {
        "title": "a setting",
        "spec": dataclasses.asdict(Spec()),
        "summary": summary,
        "runs": runs,
        "reps": 3,
        "machine": {
            "jax": "0.10.2",
            "backend": "tpu",
            "device_kind": "TPU v5 lite",
            "cpu_count": 13,
        },  # fmt: skip
    }
    text = markdown(result)
    assert "| eqx_ppo | 11.0 [10.0, 12.0] | 30.0 | 1.00 | 500.0 |" in text
    assert (
        "eqx_ppo / Brax PPO: **2.50 [2.00, 3.00]** (per repetition: 2.00, 3.00)" in text
    )
    assert "compile + first chunk, cold, eqx_ppo / Brax PPO: 1.50" in text
    assert "on 1 x TPU v5 lite (tpu)" in text
    assert "rep 2 eqx_ppo: crashed" in text


_STUB_WORKER = """
import json, os, sys
session = json.loads(sys.argv[-1])
print("noise from an import", flush=True)
print(json.dumps({"event": "ready", "device": {"backend": "stub"}}), flush=True)
for index, item in enumerate(session["items"]):
    if item.get("crash"):
        sys.stderr.write("segfault in " + item["name"])
        sys.stderr.flush()
        os._exit(3)
    print(json.dumps({"index": index, "result": {"name": item["name"]}}), flush=True)
"""


def test_run_session_streams_results_and_outlives_a_crashed_worker():
    from benchmarks._common import run_session

    items = [{"name": "a"}, {"name": "b", "crash": True}, {"name": "c"}]
    seen, ready = [], []
    results = run_session(
        items,
        command=[sys.executable, "-c", _STUB_WORKER],
        on_result=lambda i, r: seen.append(i),
        on_ready=ready.append,
    )
    assert results[0] == {"name": "a", "device": {"backend": "stub"}}
    assert "worker exited 3" in results[1]["error"]
    assert "segfault in b" in results[1]["error"]
    # a fresh worker ran the item after the crash
    assert results[2] == {"name": "c", "device": {"backend": "stub"}}
    assert seen == [0, 1, 2] and len(ready) == 2


def test_serve_session_reports_errors_and_skips_past_the_deadline(capsys):
    import json
    import time

    from benchmarks._common import serve_session

    def run_item(item):
        if item["fail"]:
            raise ValueError("broken run")
        return {"ok": item["n"]}

    session = {
        "deadline": time.time() + 60,
        "items": [
            {"fail": False, "n": 1},
            {"fail": True, "n": 2},
            {"fail": False, "n": 3, "estimate_s": 3600},
        ],
    }
    serve_session(json.dumps(session), run_item)
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines[0]["event"] == "ready" and lines[0]["device"]["backend"] == "cpu"
    assert lines[1] == {"index": 0, "result": {"ok": 1}}
    assert "ValueError: broken run" in lines[2]["result"]["error"]
    assert lines[3]["result"]["skipped"] and "deadline" in lines[3]["result"]["error"]


def test_compile_phases_name_programs_that_exist():
    """A renamed program would silently fall into "eager ops" (as `_init_seed`
    did, putting a TPU run's 16 s initialisation compile there)."""
    from benchmarks.compile_time import PHASES
    from eqx_ppo.ppo import _chunk, _host, _train

    for name in PHASES:
        homes = (_train, _chunk, _host)
        program = next(getattr(m, name) for m in homes if hasattr(m, name))
        assert hasattr(program, "lower"), f"{name} is not a compiled program"


def test_compile_events_are_attributed_to_programs_and_phases():
    from benchmarks.compile_time import (
        CompileEvents,
        by_phase,
        by_program,
        summarise_run,
    )

    trace, lower, compile_ = (
        "/jax/core/compile/jaxpr_trace_duration",
        "/jax/core/compile/jaxpr_to_mlir_module_duration",
        "/jax/core/compile/backend_compile_duration",
    )
    records = [
        [trace, "_run_chunk", 1.0, False],
        [lower, "_run_chunk", 0.5, False],
        [compile_, "_run_chunk", 8.0, False],
        [trace, "_run_chunk", 1.0, False],
        [trace, "_init_seeds", 0.25, False],
        [compile_, "_init_seeds", 0.5, True],
        [compile_, "squeeze", 0.125, False],
        [trace, "squeeze", 0.0, False],
        [trace, "squeeze", 0.0, False],
    ]
    programs = by_program(records)
    assert programs["_run_chunk"]["trace_s"] == 2.0
    assert programs["_run_chunk"]["traces"] == 2
    assert programs["_init_seeds"]["cache_hits"] == 1
    phases = by_phase(programs)
    assert set(phases) == {"chunk", "init", "eager ops"}
    assert phases["chunk"]["compile_s"] == 8.0 and phases["chunk"]["programs"] == 1
    summary = summarise_run({"compile_events": records, "compile_s": 12.0})
    # an eager op traced per shape is not a program traced twice
    assert summary["traced_twice"] == ["_run_chunk"]
    assert summary["distinct_programs"] == 3
    assert summary["total"]["compile_s"] == 8.625

    # JAX's own events name the jitted function, cold and then from the cache
    def double(x):
        return 2 * x

    with CompileEvents() as events:
        jax.jit(double)(jnp.arange(3.0)).block_until_ready()
    mine = by_program(events.records)["double"]
    assert mine["traces"] == mine["lowerings"] == mine["compiles"] == 1


def test_seeds_memory_compiles_the_drivers_chunk():
    # It calls the driver's private chunk program, so a change of that
    # program's signature must fail here, not on an accelerator.
    import dataclasses

    from benchmarks._worker import seeds_memory
    from benchmarks.seeds_at_scale import Settings

    settings = Settings(
        env="cartpole", steps=512, n_envs=4, rollout_length=8, hidden=(4,), chunks=2
    )
    out = seeds_memory(dataclasses.asdict(settings), 2)
    assert out["n_seeds"] == 2 and out["peak_bytes"] > out["alias_bytes"] > 0


def test_seed_memory_fit_is_linear_in_the_seed_count():
    from benchmarks.seeds_at_scale import fit_memory, memory_points

    assert memory_points(2048) == (256, 1024)
    points = [
        {"n_seeds": 1024, "peak_bytes": 1000 + 1024 * 50, "device_bytes": 200_000},
        {"n_seeds": 256, "peak_bytes": 1000 + 256 * 50},
    ]
    fit = fit_memory(points)
    assert fit["per_seed_bytes"] == 50.0 and fit["fixed_bytes"] == 1000.0
    assert fit["max_seeds"] == (200_000 - 1000) // 50


def _events_of_a_tpu_trace():
    """A trace as a TPU backend writes it: ops on the device's "XLA Ops" line,
    named in `args`; module and step events beside them; a host thread with an
    event named like an op."""
    meta = [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/host:CPU"}},
        {"ph": "M", "pid": 2, "name": "process_name",
         "args": {"name": "/device:TPU:0"}},
        {"ph": "M", "pid": 2, "tid": 1, "name": "thread_name",
         "args": {"name": "XLA Modules"}},
        {"ph": "M", "pid": 2, "tid": 2, "name": "thread_name",
         "args": {"name": "XLA Ops"}},
        {"ph": "M", "pid": 2, "tid": 3, "name": "thread_name",
         "args": {"name": "Framework Ops"}},
    ]  # fmt: skip

    def x(pid, tid, name, ts, dur, **args):
        return {"ph": "X", "pid": pid, "tid": tid, "name": name, "ts": ts,
                "dur": dur, "args": args}  # fmt: skip

    return meta + [
        x(2, 1, "jit_f(7)", 0.0, 100.0),
        x(2, 2, "%dot.7", 0.0, 30.0, hlo_module="jit_f(7)"),
        x(2, 2, "fusion", 40.0, 20.0, hlo_op="multiply_fusion.2"),
        x(2, 2, "add.5", 50.0, 10.0, hlo_module="jit_other"),
        x(2, 3, "add.5", 0.0, 99.0),
        x(1, 9, "dot.7", 0.0, 99.0),
    ]


def test_profile_reads_a_device_traces_op_line_only():
    from benchmarks.profile import attribute

    ops = _instructions(_HLO)
    result = attribute(_events_of_a_tpu_trace(), ops, "jit_f", top=5)
    assert result["per_op"]
    # dot.7 and multiply_fusion.2, 3 traced calls; the other module's add.5,
    # the framework op and the host event are not op executions
    assert result["ops"] == round(2 / 3)
    assert result["op_ms"] == pytest.approx((30.0 + 20.0) / 1e3 / 3)
    assert [r["name"] for r in result["by_kind"]] == ["dot", "multiply_fusion"]
    # [0, 30] and [40, 60] over a span of 60
    assert result["busy_share"] == pytest.approx(50.0 / 60.0)


def test_profile_without_per_op_events_says_so():
    from benchmarks.profile import attribute

    events = _events_of_a_tpu_trace()[:5] + [
        {"ph": "X", "pid": 2, "tid": 1, "name": "jit_f(7)", "ts": 0, "dur": 5}
    ]
    result = attribute(events, _instructions(_HLO), "jit_f", top=5)
    assert result == {
        "per_op": False,
        "trace_lines": [
            "/device:TPU:0",
            "/host:CPU",
            "Framework Ops",
            "XLA Modules",
            "XLA Ops",
        ],
        "events": 6,
    }
    text = markdown(
        {
            "spec": {
                "env": "e",
                "policy": "mlp",
                "n_seeds": 1,
                "n_envs": 8,
                "rollout_length": 20,
            },  # fmt: skip
            "part": "step",
            "wall_ms": 3.0,
            **result,
        }
    )
    assert "The trace holds no per-op events of the program (6 events" in text
    assert "no per-op table" in text


@pytest.mark.slow  # a worker process that trains twice; about 30 s on 2 cores
def test_accelerator_quick_compare_writes_cpu_results(tmp_path):
    import json

    root = pathlib.Path(__file__).parent.parent
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.accelerator", "--part", "compare",
         "--quick", "--envs", "cartpole", "--systems", "eqx", "--scales", "small",
         "--reps", "2", "--results", str(tmp_path)],
        capture_output=True, text=True, cwd=root,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads((tmp_path / "cpu_compare_cartpole_32_4x8.json").read_text())
    assert result["machine"]["backend"] == "cpu"
    assert sorted(r["rep"] for r in result["runs"]) == [0, 1]
    assert all(r["sps"] > 0 and r["label"] == "eqx" for r in result["runs"])
    assert (tmp_path / "cpu_compare_cartpole_32_4x8.md").exists()


def test_the_command_stops_on_another_backend_than_planned(monkeypatch):
    from benchmarks import accelerator

    monkeypatch.setenv("JAX_PLATFORMS", "tpu")
    command = accelerator.Command(accelerator.parse_args(["--part", "compare"]))
    assert command.sizes.accelerator
    command.check_device({"backend": "tpu"})
    # accelerator sizes on a CPU would run for hours
    with pytest.raises(SystemExit, match="the worker runs on a CPU"):
        command.check_device({"backend": "cpu"})
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    command = accelerator.Command(accelerator.parse_args(["--part", "compare"]))
    with pytest.raises(SystemExit, match="rerun with JAX_PLATFORMS=tpu"):
        command.check_device({"backend": "tpu"})
    quick = accelerator.Command(accelerator.parse_args(["--quick"]))
    quick.check_device({"backend": "tpu"})  # --quick: toy sizes anywhere


def test_op_trace_sums_a_device_traces_ops_per_category_and_iteration():
    from benchmarks.op_trace import device_ops, markdown, summarise

    def x(pid, tid, name, ts, dur, **args):
        return {"ph": "X", "pid": pid, "tid": tid, "name": name, "ts": ts,
                "dur": dur, "args": args}  # fmt: skip

    events = _events_of_a_tpu_trace()[:5] + [
        x(2, 2, "fusion.1", 0.0, 3000.0, hlo_category="convolution fusion",
          long_name="%fusion.1 = f32[8,8]"),
        x(2, 2, "fusion.1", 4000.0, 1000.0, hlo_category="convolution fusion",
          long_name="%fusion.1 = f32[8,8]"),
        x(2, 2, "add.3", 6000.0, 600.0, hlo_category="loop fusion"),
        # A loop's event spans the ops it runs; a module line and a host
        # thread hold no op executions.
        x(2, 2, "while.9", 0.0, 9000.0, hlo_category="while"),
        x(2, 1, "jit_f(7)", 0.0, 9000.0),
        x(1, 9, "fusion.1", 0.0, 99.0, hlo_category="convolution fusion"),
    ]  # fmt: skip
    ops = device_ops(events)
    assert [op["name"] for op in ops] == ["fusion.1", "fusion.1", "add.3"]
    brax = summarise(ops, iterations=1, top=1)
    assert brax["op_ms"] == pytest.approx(4.6)
    assert brax["by_category"] == [
        {"name": "convolution fusion", "ms": 4.0, "ops": 2, "us_per_op": 2000.0},
        {"name": "loop fusion", "ms": 0.6, "ops": 1, "us_per_op": 600.0},
    ]
    assert brax["top_ops"] == [
        {"name": "fusion.1", "ms": 4.0, "ops": 2, "us_per_op": 2000.0,
         "long_name": "%fusion.1 = f32[8,8]"}
    ]  # fmt: skip
    eqx = summarise(ops[2:], iterations=2, top=5)
    result = {
        "spec": {"env": "cartpole", "n_envs": 8, "hidden": [4, 4],
                 "n_minibatches": 2},
        "runs": [{"system": "brax", "sps": 2e6, **brax},
                 {"system": "eqx", "sps": 1e6, **eqx},
                 {"system": "rejax", "error": "exit 1: boom"}],
        "machine": {"jax": "0.10.2", "backend": "tpu", "device_kind": "TPU v5 lite"},
    }  # fmt: skip
    text = markdown(result)
    assert "| HLO category | brax: ms (ops) | eqx: ms (ops) |" in text
    assert "| convolution fusion | 4.00 (2) | - |" in text
    assert "| loop fusion | 0.60 (1) | 0.30 (0) |" in text
    assert "| all ops | 4.60 | 0.30 |" in text
    assert "| `fusion.1` | 4.00 | 2 | 2000.0 | `%fusion.1 = f32[8,8]` |" in text
    assert "rejax failed: exit 1: boom" in text
    assert "no device op lines" in markdown({**result, "runs": result["runs"][2:]})


@pytest.mark.slow  # two worker processes that train briefly; about 60 s on 2 cores
def test_op_trace_traces_both_systems_and_a_cpu_trace_has_no_device_ops(tmp_path):
    import json

    pytest.importorskip("brax")
    root = pathlib.Path(__file__).parent.parent
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.op_trace", "--n-envs", "64",
         "--hidden", "8,8", "--minibatches", "4", "--iterations", "3",
         "--name", str(tmp_path / "op_trace")],
        capture_output=True, text=True, cwd=root,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads((tmp_path / "op_trace.json").read_text())
    assert [r["system"] for r in result["runs"]] == ["brax", "eqx"]
    # 3 iterations run as two chunks of 2; the trace holds the second
    assert all(r["traced_iterations"] == 2 and r["sps"] > 0 for r in result["runs"])
    assert "no device op lines" in (tmp_path / "op_trace.md").read_text()


def test_chunk_overhead_times_one_chunk_against_chunks_of_k():
    from benchmarks.chunk_overhead import main, markdown, run

    result = run("move_to_center", 8, (4,), iterations=4, reps=2)
    assert result["rounds"] == 2 and result["per_chunk"] == 1
    one, many = result["one_chunk_s"], result["chunked_s"]
    assert 0 < one and 0 < many
    assert result["overhead_per_chunk_ms"] == 1e3 * (many - one) / 3
    assert result["rate_ratio"] == one / many
    text = markdown(result)
    assert "2 alternated rounds" in text
    assert "| host time per chunk (ms) |" in text
    result = run("move_to_center", 8, (4,), iterations=4, reps=1, per_chunk=2)
    many = result["chunked_s"]
    assert result["overhead_per_chunk_ms"] == 1e3 * (many - result["one_chunk_s"])
    assert "as chunks of 2" in markdown(result)
    with pytest.raises(SystemExit):
        main(["--iterations", "10", "--per-chunk", "4"])
