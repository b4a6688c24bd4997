"""Metric reduction, sinks, and the driver's video hook."""

import concurrent.futures
import csv
import gc
import json
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eqx_ppo
from eqx_ppo import LoggingLevel
from eqx_ppo.logging import CSVLogger, JSONLLogger, combine_loggers, reduce_metric
from eqx_ppo.ppo._host import CompileTimer as _CompileTimer, paused_gc


def test_reduce_metric_names_and_values():
    out = {}
    reduce_metric(
        out, "net", {"a": jnp.array([1.0, 3.0]), "flag": jnp.array([True, False])}
    )
    assert set(out) == {"net/a/mean", "net/a/std", "net/flag"}
    assert float(out["net/a/mean"]) == 2.0
    assert float(out["net/a/std"]) == 1.0
    assert float(out["net/flag"]) == 0.5
    out = {}
    reduce_metric(out, "r", jnp.arange(5.0), percentiles=(0, 50, 100))
    assert {k: float(v) for k, v in out.items()} == {
        "r/p0": 0.0,
        "r/p50": 2.0,
        "r/p100": 4.0,
    }


def test_jsonl_and_csv_sinks(tmp_path):
    jsonl, table = JSONLLogger(tmp_path / "m.jsonl"), CSVLogger(tmp_path / "m.csv")
    log = combine_loggers(jsonl, table)
    log({"a": 1.0}, 10)
    log({"a": 2.0, "b": float("nan")}, 20)
    log({"a": [3.0, 4.0]}, 30)
    lines = [
        json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()
    ]
    assert lines == [
        {"step": 10, "a": 1.0},
        {"step": 20, "a": 2.0, "b": None},
        {"step": 30, "a": [3.0, 4.0]},
    ]
    with (tmp_path / "m.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["step"] for r in rows] == ["10", "20", "30"]
    assert rows[2]["a/seed1"] == "4.0" and rows[0]["a"] == "1.0"


def test_jsonl_takes_the_numpy_and_jax_values_of_a_hand_written_loop(tmp_path):
    log = JSONLLogger(tmp_path / "m.jsonl")
    log(
        {
            "a": np.float32(1.5),
            "b": jnp.asarray(jnp.inf),
            "c": np.asarray([1.0, np.nan], np.float32),
            "n": np.int64(7),
        },
        np.int64(3),
    )
    (line,) = (tmp_path / "m.jsonl").read_text().splitlines()
    assert json.loads(line) == {
        "step": 3,
        "a": 1.5,
        "b": None,
        "c": [1.0, None],
        "n": 7,
    }


def test_tensorboard_sink(tmp_path):
    pytest.importorskip("tensorboardX")
    log = eqx_ppo.TensorBoardLogger(tmp_path)
    log({"x": 1.0, "y": [1.0, 2.0]}, 5)
    assert any(p.name.startswith("events.out") for p in tmp_path.iterdir())


def test_video_fn_gets_rendered_frames_and_throughput_is_logged():
    env = eqx_ppo.envs.make("move_to_center")
    videos, logged = [], []
    config = eqx_ppo.TrainConfig(
        learner=eqx_ppo.PPO(
            n_envs=8,
            rollout_length=10,
            total_steps=160,
            n_minibatches=2,
            logging_level=eqx_ppo.LoggingLevel.ALL,
        ),
        eval=eqx_ppo.EvalConfig(enabled=False),
        video=eqx_ppo.VideoConfig(
            enabled=True,
            every_steps=80,
            episode_length=25,
            render_kwargs={"height": 32, "width": 48},
        ),
        progress=False,
    )
    eqx_ppo.train(
        env,
        lambda k: eqx_ppo.make_mlp_actor_critic(2, 2, [8], [8], key=k),
        config,
        video_fn=videos.append,
        log_fn=lambda m, s: logged.append((s, m)),
    )
    assert [v.step for v in videos] == [0, 80, 160]
    # Every iteration's log carries its step; a video's rate comes with it.
    steps = [s for s, m in logged if "throughput/video_sps" in m]
    assert steps == [0, 80, 160]
    assert all(m["throughput/video_sps"] > 0 for s, m in logged if s in steps)
    assert [m["total_steps"] for s, m in logged if s > 0] == [80, 160]
    logged = [m for _, m in logged]
    assert (
        videos[0].frames.shape == (25, 32, 48, 3) and videos[0].frames.dtype == np.uint8
    )
    # Episodes are 20 steps: the first episode's length and return are reported.
    assert videos[0].episode_length == 20
    assert videos[0].episode_reward < 0
    keys = set(logged[-1])
    for expected in (
        "losses/actor/mean",
        "losses/critic/mean",
        "losses/clipping_fraction/mean",
        "losses/critic_R^2/mean",
        "grad_norm/mean",
        "weights/mean",
        "rollout_batch/reward/mean",
        "rollout_batch/done_rate",
        "throughput/train_sps",
    ):
        assert expected in keys, expected


def test_advantages_are_logged_as_the_surrogate_weighs_them_and_eval_has_a_rate():
    env = eqx_ppo.envs.make("move_to_center")
    logged = []
    eqx_ppo.train(
        env,
        lambda k: eqx_ppo.make_mlp_actor_critic(2, 2, [8], [8], key=k),
        eqx_ppo.TrainConfig(
            learner=eqx_ppo.PPO(
                n_envs=8,
                rollout_length=10,
                total_steps=160,
                n_minibatches=2,
                logging_level=LoggingLevel.CRITIC_EXTRA | LoggingLevel.THROUGHPUT,
            ),
            eval=eqx_ppo.EvalConfig(every_steps=160, n_envs=4, max_episode_length=20),
            progress=False,
        ),
        log_fn=lambda m, s: logged.append((s, m)),
    )
    # Normalised per minibatch, the advantages of all updates have mean 0 and
    # std 1 (a mean of raw advantages per update would not).
    for step, m in logged[1:]:
        assert m["total_steps"] == step
        np.testing.assert_allclose(m["losses/advantages/mean"], 0.0, atol=1e-6)
        np.testing.assert_allclose(m["losses/advantages/std"], 1.0, rtol=1e-4)
        # Before normalisation they keep the reward's scale.
        assert m["losses/raw_advantages/std"] > 0.1
        assert m["losses/raw_advantages/mean"] != m["losses/advantages/mean"]
    assert [s for s, m in logged if "throughput/eval_sps" in m] == [0, 160]
    assert all(m.get("throughput/eval_sps", 1) > 0 for _, m in logged)


def _train_small(config, log_fn):
    """`move_to_center` with a network no other file compiles (13 and 11 units)."""
    return eqx_ppo.train(
        eqx_ppo.envs.make("move_to_center"),
        lambda k: eqx_ppo.make_mlp_actor_critic(2, 2, [13], [11], key=k),
        config,
        log_fn=log_fn,
    )


def test_throughput_leaves_out_the_time_spent_compiling():
    # A network size no other test compiles: the first chunk compiles (~3 s)
    # and runs (~50 ms, as each later chunk); its rate must be one of running.
    config = eqx_ppo.TrainConfig(
        learner=eqx_ppo.PPO(
            n_envs=64,
            rollout_length=32,
            total_steps=64 * 32 * 40,
            n_minibatches=2,
            logging_level=eqx_ppo.LoggingLevel.THROUGHPUT,
        ),
        eval=eqx_ppo.EvalConfig(enabled=False),
        log_every_steps=64 * 32 * 10,
        progress=False,
    )
    rates = []
    _train_small(config, lambda m, s: rates.append(m["throughput/train_sps"]))
    chunks = rates[::10]  # one rate per chunk of ten iterations
    assert len(chunks) == 4
    assert chunks[0] > np.median(chunks[1:]) / 10


def _count_dispatches(monkeypatch) -> list[int]:
    """The iterations of each chunk `train` dispatches, in order."""
    dispatched = []
    compile_chunk = eqx_ppo.ppo._train.compile_chunk

    def counting(chunk, states):
        compiling = compile_chunk(chunk, states)

        def run(states, n_active):
            dispatched.append(n_active)
            return compiling.result()(states, n_active)

        done = concurrent.futures.Future()
        done.set_result(run)
        return done

    monkeypatch.setattr(eqx_ppo.ppo._train, "compile_chunk", counting)
    return dispatched


def test_a_chunks_rows_are_logged_while_the_next_chunk_runs(monkeypatch):
    # Six one-iteration chunks, an evaluation after the third: each row is
    # logged once the next chunk is dispatched, except where the evaluation
    # needs the states the chunk returned, and at the end.
    dispatched = _count_dispatches(monkeypatch)
    config = eqx_ppo.TrainConfig(
        learner=eqx_ppo.PPO(
            n_envs=8, rollout_length=4, total_steps=8 * 4 * 6, n_minibatches=2
        ),
        eval=eqx_ppo.EvalConfig(every_steps=8 * 4 * 3, n_envs=2, max_episode_length=5),
        log_every_steps=8 * 4,
        progress=False,
    )
    logged = []
    _train_small(config, lambda m, step: logged.append((step // 32, len(dispatched))))
    assert dispatched == [1] * 6
    assert logged == [(0, 0), (1, 2), (2, 3), (3, 3), (4, 5), (5, 6), (6, 6)]


@pytest.mark.parametrize(
    ("iterations", "chunks"), [(12, [5, 5, 2]), (3, [3]), (600, [12] * 50)]
)
def test_chunks_default_to_a_fiftieth_of_the_run_and_5_iterations_at_least(
    monkeypatch, iterations, chunks
):
    dispatched = _count_dispatches(monkeypatch)
    config = eqx_ppo.TrainConfig(
        learner=eqx_ppo.PPO(n_envs=8, rollout_length=2, total_steps=16 * iterations),
        eval=eqx_ppo.EvalConfig(enabled=False),
        progress=False,
    )
    rows = []
    _train_small(config, lambda m, step: rows.append(step))
    assert dispatched == chunks
    assert rows == [16 * (i + 1) for i in range(iterations)]  # a row each


@pytest.mark.parametrize("checkpoints", [False, True])
@pytest.mark.parametrize("videos", [False, True])
def test_the_chunks_program_is_sized_by_the_config_alone(checkpoints, videos):
    # A run resumed without checkpoint_fn or video_fn must compile the
    # program of the run it continues (bit-identical resume).
    from eqx_ppo.ppo._train import _Schedule

    def schedule(total_steps, **kwargs):
        config = eqx_ppo.TrainConfig(
            learner=eqx_ppo.PPO(n_envs=8, rollout_length=2, total_steps=total_steps),
            video=eqx_ppo.VideoConfig(every_steps=16),
            checkpoint_every_steps=16,
            **kwargs,
        )
        return _Schedule.of(config, checkpoints, videos)

    every_3 = eqx_ppo.EvalConfig(every_steps=48)
    assert schedule(16 * 40, eval=every_3, log_every_steps=16 * 8).chunk_length == 3
    off = eqx_ppo.EvalConfig(enabled=False)
    assert schedule(16 * 40, eval=off, log_every_steps=16 * 8).chunk_length == 8
    assert schedule(16 * 40, eval=off).chunk_length == 5  # the default's least
    assert schedule(16 * 3, eval=off).chunk_length == 3  # the whole run


def test_compile_timer_counts_compiling_only():
    f = jax.jit(lambda x: jnp.sin(x) * 3.0 + x**2)
    t0 = time.perf_counter()
    with _CompileTimer() as first:
        f(jnp.ones(17)).block_until_ready()
    wall = time.perf_counter() - t0
    with _CompileTimer() as again:
        f(jnp.ones(17)).block_until_ready()
    assert first.seconds > 0 and again.seconds == 0
    # The running time is the wall time left once compiling is taken out.
    assert 0 <= first.running <= wall - first.seconds
    # Another thread's compile (`train`'s chunk) is not this timer's.
    g = jax.jit(lambda x: jnp.cos(x) - x)
    with _CompileTimer() as other:
        worker = threading.Thread(target=lambda: g(jnp.ones(19)).block_until_ready())
        worker.start()
        worker.join()
    assert other.seconds == 0


def test_paused_gc_restores_the_collectors_state_even_on_an_error():
    assert gc.isenabled()
    with paused_gc():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), paused_gc():
        raise RuntimeError
    assert gc.isenabled()
    gc.disable()  # a user's choice outlives the pause
    try:
        with paused_gc():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_train_leaves_the_garbage_collector_on():
    config = eqx_ppo.TrainConfig(
        learner=eqx_ppo.PPO(n_envs=2, rollout_length=2, total_steps=8, n_minibatches=1),
        eval=eqx_ppo.EvalConfig(n_envs=2, max_episode_length=3, every_steps=4),
        progress=False,
    )
    seen = []
    eqx_ppo.train(
        eqx_ppo.envs.make("move_to_center"),
        lambda k: eqx_ppo.make_mlp_actor_critic(2, 2, [4], [4], key=k),
        config,
        log_fn=lambda m, s: seen.append(gc.isenabled()),
    )
    assert seen and all(seen) and gc.isenabled()  # paused only while tracing


def test_jsonl_logger_never_mixes_two_runs(tmp_path):
    path = tmp_path / "m.jsonl"
    JSONLLogger(path)({"a": 1.0}, 1)
    with pytest.raises(FileExistsError, match=r"m\.jsonl already holds a log.*append"):
        JSONLLogger(path)
    JSONLLogger(path, append=True)({"a": 2.0}, 2)
    steps = [json.loads(line)["step"] for line in path.read_text().splitlines()]
    assert steps == [1, 2]
    empty = tmp_path / "empty.jsonl"
    empty.touch()
    JSONLLogger(empty)({"a": 3.0}, 3)  # an empty file holds no run yet


def test_csv_logger_never_mixes_or_loses_a_run(tmp_path):
    path = tmp_path / "m.csv"
    CSVLogger(path)({"a": 1.0}, 1)
    with pytest.raises(FileExistsError, match=r"m\.csv already holds a log.*append"):
        CSVLogger(path)
    resumed = CSVLogger(path, append=True)
    resumed({"a": 2.0}, 2)
    resumed({"a": 3.0, "b": 4.0}, 3)  # a new key rewrites the old rows too
    with path.open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["step"], r["a"], r["b"]) for r in rows] == [
        ("1", "1.0", ""),
        ("2", "2.0", ""),
        ("3", "3.0", "4.0"),
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.csv"]
    other = tmp_path / "other.csv"
    other.write_text("x,y\n1,2\n")
    with pytest.raises(ValueError, match=r"other\.csv is not a CSVLogger log"):
        CSVLogger(other, append=True)


def test_a_csv_rewrite_cut_short_leaves_the_log_whole(tmp_path, monkeypatch):
    path = tmp_path / "m.csv"
    log = CSVLogger(path)
    log({"a": 1.0}, 1)
    log({"a": 2.0}, 2)
    before = path.read_text()

    class Killed(csv.DictWriter):
        def writerows(self, rows):
            super().writerow(rows[0])
            raise KeyboardInterrupt  # the run is killed mid-rewrite

    monkeypatch.setattr(eqx_ppo.logging.csv, "DictWriter", Killed)
    with pytest.raises(KeyboardInterrupt):
        log({"a": 3.0, "b": 1.0}, 3)
    assert path.read_text() == before


def test_continuing_a_log_cut_mid_line_drops_the_unfinished_line(tmp_path):
    jsonl, table = tmp_path / "m.jsonl", tmp_path / "m.csv"
    JSONLLogger(jsonl)({"a": 1.0}, 1)
    CSVLogger(table)({"a": 1.0}, 1)
    for path in (jsonl, table):  # a run killed while writing step 2
        with path.open("a") as f:
            f.write('{"step": 2, "a": 2.' if path is jsonl else "2,2.")
    for sink, path in ((JSONLLogger, jsonl), (CSVLogger, table)):
        with pytest.warns(UserWarning, match=r"ended in an unfinished line"):
            log = sink(path, append=True)
        log({"a": 3.0}, 3)
    steps = [json.loads(line)["step"] for line in jsonl.read_text().splitlines()]
    assert steps == [1, 3]
    with table.open() as f:
        assert [(r["step"], r["a"]) for r in csv.DictReader(f)] == [
            ("1", "1.0"),
            ("3", "3.0"),
        ]


@pytest.mark.parametrize("sink", [JSONLLogger, CSVLogger])
def test_a_log_path_must_not_be_a_folder(tmp_path, sink):
    with pytest.raises(IsADirectoryError, match=r"is a folder; pass the path of"):
        sink(tmp_path, append=True)


class _FakeBar:
    """Records what the driver does with its progress bar."""

    made: list["_FakeBar"] = []

    def __init__(self, *, total, initial, unit, unit_scale, desc, disable):
        self.total, self.n, self.unit, self.descs = total, initial, unit, [desc]
        self.disable = disable
        self.postfixes, self.rates = [], []
        self.start_t = 0.0  # tqdm's clock: the driver moves it past compile time
        _FakeBar.made.append(self)

    def update(self, n):
        self.n += n

    def set_description(self, desc):
        self.descs.append(desc)

    def set_postfix(self, **kwargs):
        self.postfixes.append(kwargs)

    def set_postfix_str(self, text, refresh=True):
        self.rates.append(text)

    def close(self):
        pass


def test_progress_bar_counts_env_steps_of_all_seeds_and_says_compiling(monkeypatch):
    import tqdm.auto

    monkeypatch.setattr(tqdm.auto, "tqdm", _FakeBar)
    _FakeBar.made.clear()
    config = eqx_ppo.TrainConfig(
        learner=eqx_ppo.PPO(
            n_envs=4, rollout_length=5, total_steps=50, n_minibatches=2
        ),  # 50 steps round up to 3 iterations of 20
        eval=eqx_ppo.EvalConfig(every_steps=20, n_envs=2, max_episode_length=5),
        n_seeds=2,
        progress=True,
    )
    env = eqx_ppo.envs.make("move_to_center")
    eqx_ppo.train(
        env, lambda k: eqx_ppo.make_mlp_actor_critic(2, 2, [4], [4], key=k), config
    )
    [bar] = _FakeBar.made
    assert bar.unit == "env-step"
    assert bar.total == bar.n == 3 * 20 * 2  # the real total, both seeds
    assert bar.descs[0] == "compiling" and bar.descs[-1] == "train"
    assert all(set(p) == {"eval_return"} for p in bar.postfixes)
    # Elapsed time, rate and estimate leave the compilation out: the clock
    # moved forward by the seconds spent compiling the evaluation and waiting
    # for the first chunk's compile.
    assert bar.start_t > 0.1
    assert bar.rates and all(r.endswith("steps/s now") for r in bar.rates)


def test_combine_loggers_refuses_what_cannot_log(tmp_path):
    path = tmp_path / "log.jsonl"
    with pytest.raises(TypeError, match="log_fns"):
        combine_loggers(JSONLLogger(tmp_path / "a.jsonl"), str(path))


@pytest.mark.parametrize(
    ("module", "make"),
    [
        ("tensorboardX", lambda path: eqx_ppo.TensorBoardLogger(path)),
        ("wandb", lambda path: eqx_ppo.WandbLogger(project="p", dir=str(path))),
    ],
)
def test_a_logger_without_its_package_names_the_extra(
    module, make, tmp_path, monkeypatch
):
    import sys

    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(
        ImportError, match=rf"needs {module}\. Fix: .*eqx_ppo\[logging\]"
    ):
        make(tmp_path)


def test_final_metrics_are_the_last_row_logged_or_not():
    """Without a `log_fn` the driver makes only the rows it needs (the last
    of each chunk); `final_metrics` is the row a `log_fn` gets last."""
    config = eqx_ppo.TrainConfig(
        learner=eqx_ppo.PPO(n_envs=4, rollout_length=4, total_steps=16 * 6),
        eval=eqx_ppo.EvalConfig(enabled=False),
        n_seeds=2,
        log_every_steps=16 * 3,
        progress=False,
    )
    rows = []

    def run(log_fn):
        return eqx_ppo.train(
            eqx_ppo.envs.make("move_to_center"),
            lambda k: eqx_ppo.make_mlp_actor_critic(2, 2, [4], [4], key=k),
            config,
            key=jax.random.key(2),
            log_fn=log_fn,
        )

    logged = run(lambda metrics, step: rows.append((step, metrics)))
    quiet = run(None)
    assert [step for step, _ in rows] == [16 * i for i in range(1, 7)]
    assert logged.final_metrics == rows[-1][1] == quiet.final_metrics
    assert all(
        len(v) == 2 for k, v in quiet.final_metrics.items() if k != "total_steps"
    )
