"""`eqx-ppo train / eval / record` end to end on a tiny budget."""

import errno
import json
import pathlib
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from eqx_ppo import cli, envs, latest_checkpoint
from eqx_ppo.cli import main
from tests._helpers import cpu_child_env

TINY = ["--n-envs", "4", "--rollout-length", "4", "--hidden", "4", "--eval-every", "32"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    args = [
        "train",
        "--out",
        str(out),
        "--steps",
        "4096",
        "--n-envs",
        "32",
        "--seeds",
        "2",
        "--hidden",
        "8",
        "--eval-every",
        "2048",
        "--no-progress",
    ]
    assert main(args) == 0
    return out


def test_train_writes_the_run_folder(run_dir):
    names = {p.name for p in run_dir.iterdir()}
    assert {
        "metrics.jsonl",
        "eval.jsonl",
        "learning_curve.png",
        "summary.json",
        "run.json",
        "checkpoints",
    } <= names
    lines = [
        json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()
    ]
    steps = [line["step"] for line in lines]
    assert steps == sorted(steps) and steps[-1] == 4480  # 7 iterations of 640 steps
    assert len(lines[-1]["losses/actor/mean"]) == 2  # one value per seed
    summary = json.loads((run_dir / "summary.json").read_text())
    assert len(summary["final_eval_return"]) == 2
    assert (run_dir / "learning_curve.png").read_bytes()[:4] == b"\x89PNG"


def test_resume_continues_and_extends_history(run_dir, capsys):
    assert (
        main(["train", "--resume", str(run_dir), "--steps", "6000", "--no-progress"])
        == 0
    )
    assert "resuming from" in capsys.readouterr().out
    evals = [
        json.loads(x)["step"] for x in (run_dir / "eval.jsonl").read_text().splitlines()
    ]
    assert evals[0] == 0 and evals[-1] == 6400 and evals == sorted(evals)
    assert (
        main(["train", "--resume", str(run_dir), "--steps", "6000", "--no-progress"])
        == 0
    )
    assert "already trained" in capsys.readouterr().out
    # Without --steps the run keeps its own total, not the flag's default.
    assert main(["train", "--resume", str(run_dir), "--no-progress"]) == 0
    assert "already trained" in capsys.readouterr().out
    assert json.loads((run_dir / "run.json").read_text())["steps"] == 6000


def test_a_corrupted_checkpoint_gets_one_line_naming_the_one_before(
    run_dir, tmp_path, capsys
):
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    *_, previous, latest = sorted((run / "checkpoints").iterdir())
    state = latest / "state.eqx"
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0xFF
    state.write_bytes(bytes(data))
    before = (run / "run.json").read_text()
    assert main(["train", "--resume", str(run), "--steps", "9000"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"eqx-ppo train: --resume {run}: ")
    assert "does not match the checksum in its header: it is corrupted." in err
    assert err.endswith(
        f"To resume from {previous.name}, move {latest} out of {latest.parent}.\n"
    )
    assert (run / "run.json").read_text() == before
    assert main(["eval", "--checkpoint", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"eqx-ppo eval: --checkpoint {run}: ")
    assert err.endswith(f"The one before it: --checkpoint {previous}\n")


def test_a_resume_killed_while_writing_run_json_keeps_the_run(
    run_dir, tmp_path, monkeypatch
):
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    before = (run / "run.json").read_text()
    real = pathlib.Path.write_text

    def killed_mid_write(self, text, *args, **kwargs):
        if self.name.startswith("run.json"):
            real(self, text[: len(text) // 2])
            raise KeyboardInterrupt
        return real(self, text, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "write_text", killed_mid_write)
    with pytest.raises(KeyboardInterrupt):
        main(["train", "--resume", str(run), "--steps", "99999", "--no-progress"])
    assert (run / "run.json").read_text() == before


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _killed_after(step, where):
    """`train` as the CLI calls it, killed once `where` ("log" or
    "checkpoint") has handled `step`."""
    real = cli.train

    def train(*args, log_fn, checkpoint_fn, **kwargs):
        def log(metrics, s):
            log_fn(metrics, s)
            if where == "log" and s == step:
                raise KeyboardInterrupt

        def save(state, s):
            checkpoint_fn(state, s)
            if where == "checkpoint" and s == step:
                raise KeyboardInterrupt

        return real(*args, log_fn=log, checkpoint_fn=save, **kwargs)

    return train


@pytest.mark.parametrize("where, step", [("checkpoint", 1280), ("log", 1600)])
def test_a_killed_run_resumes_with_the_logs_of_an_uninterrupted_one(
    tmp_path, monkeypatch, where, step
):
    # 16 envs x 20 steps = 320 per iteration; evaluations and checkpoints
    # every 640 steps, so the kill comes right after a checkpoint, or one
    # iteration after it.
    flags = ["--steps", "2560", "--n-envs", "16", "--hidden", "8"]
    flags += ["--eval-every", "640", "--no-progress"]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    assert main(["train", "--out", str(straight), *flags]) == 0
    monkeypatch.setattr(cli, "train", _killed_after(step, where))
    assert main(["train", "--out", str(killed), *flags]) == 130
    monkeypatch.undo()
    evals = [0, 640, 1280]
    assert [row["step"] for row in _rows(killed / "eval.jsonl")] == evals
    assert main(["train", "--resume", str(killed), "--no-progress"]) == 0
    for name in ("metrics.jsonl", "eval.jsonl"):
        got, want = _rows(killed / name), _rows(straight / name)
        assert [row["step"] for row in got] == [row["step"] for row in want]
    returns = [r["eval/episode_reward/mean"] for r in _rows(killed / "eval.jsonl")]
    want = [r["eval/episode_reward/mean"] for r in _rows(straight / "eval.jsonl")]
    np.testing.assert_allclose(returns, want, rtol=1e-5)


def test_ctrl_c_names_the_command_that_continues_the_run(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    flags = ["--steps", "1280", "--n-envs", "16", "--hidden", "8", "--no-progress"]
    monkeypatch.setattr(cli, "train", _killed_after(640, "checkpoint"))
    assert main(["train", "--out", str(run), "--eval-every", "640", *flags]) == 130
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert err.endswith(
        f"interrupted; continue from the last checkpoint with: eqx-ppo train "
        f"--resume {run}\n"
    )
    # --steps on resume is the new total, here below the run's first one.
    assert main(["train", "--resume", str(run), "--steps", "960", "--no-progress"]) == 0
    assert [row["step"] for row in _rows(run / "eval.jsonl")] == [0, 640, 960]
    before = (run / "run.json").read_text()
    assert main(["train", "--resume", str(run), "--steps", "320", "--no-progress"]) == 0
    assert "is already trained to 960 steps; pass a larger --steps" in (
        capsys.readouterr().out
    )
    assert (run / "run.json").read_text() == before


def test_a_missing_optional_backend_gets_one_line(tmp_path, monkeypatch, capsys):
    def make(name, **kwargs):
        raise ImportError("This env needs `gymnax`, which is not installed.")

    monkeypatch.setattr(envs, "make", make)
    out = tmp_path / "run"
    assert main(["train", "--env", "gymnax:CartPole-v1", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == (
        "eqx-ppo train: --env gymnax:CartPole-v1: This env needs `gymnax`, which "
        "is not installed.\n"
    )
    assert not out.exists()


def test_a_run_whose_simulator_is_missing_gets_one_line(run_dir, monkeypatch, capsys):
    def make(name, **kwargs):
        raise ImportError("This env needs `brax`, which is not installed.")

    monkeypatch.setattr(envs, "make", make)
    assert main(["eval", "--checkpoint", str(run_dir)]) == 2
    assert capsys.readouterr().err == (
        "eqx-ppo eval: the run's env move_to_center: This env needs `brax`, which "
        "is not installed.\n"
    )


def test_resume_with_more_steps_keeps_the_runs_eval_spacing(tmp_path):
    # Without --eval-every the spacing is a tenth of the steps the run
    # started with (640 here), not of the resumed total.
    run = tmp_path / "run"
    flags = ["--n-envs", "16", "--hidden", "8", "--no-progress"]
    assert main(["train", "--out", str(run), "--steps", "6400", *flags]) == 0
    assert (
        main(["train", "--resume", str(run), "--steps", "9600", "--no-progress"]) == 0
    )
    steps = [row["step"] for row in _rows(run / "eval.jsonl")]
    assert steps == list(range(0, 9601, 640))


def test_resume_refuses_flags_it_cannot_honour(run_dir, capsys):
    before = (run_dir / "run.json").read_text()
    argv = ["train", "--resume", str(run_dir), "--lr", "0.5", "--seeds", "4"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"eqx-ppo train: --resume {run_dir}: --lr, --seeds cannot change a run "
        "(its settings are in run.json); drop them, or start a new run with --out."
    ]
    assert (run_dir / "run.json").read_text() == before


def test_missing_folders_get_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["train", "--resume", str(tmp_path / "empty")]) == 2
    assert capsys.readouterr().err == (
        f"eqx-ppo train: --resume {tmp_path / 'empty'}: no run.json there; not a "
        "run folder.\n"
    )
    assert main(["eval", "--checkpoint", str(tmp_path / "nowhere")]) == 2
    assert "not a run folder" in capsys.readouterr().err


def test_an_out_path_that_is_a_file_gets_one_line(tmp_path, capsys):
    afile = tmp_path / "notes.txt"
    afile.write_text("mine")
    assert main(["train", "--out", str(afile), "--steps", "64"]) == 2
    assert capsys.readouterr().err == (
        f"eqx-ppo train: --out {afile}: a file is there; pass a folder to write to.\n"
    )
    assert afile.read_text() == "mine"


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--n-envs", "30"], r"--n-envs 30: PPO\(n_envs=30, n_minibatches=4\): "),
        (["--lr", "nan"], r"--lr nan: PPO\(learning_rate=nan\): must be finite"),
        (["--env", "nope"], r"--env nope: make\('nope'\): unknown env\."),
        (
            ["--env-kwarg", "bogus=1"],
            r"--env-kwarg bogus=1: .*unexpected keyword argument 'bogus'",
        ),
    ],
    ids=["n-envs", "lr", "env", "env-kwargs"],
)
def test_bad_flags_get_one_line_and_leave_no_run_folder(tmp_path, capsys, flags, named):
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), "--no-progress", *flags]) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(rf"eqx-ppo train: {named}[^\n]*\n", err), err
    assert not out.exists()


@pytest.mark.parametrize(
    "flag", ["--steps", "--n-envs", "--seeds", "--minibatches", "--eval-every"]
)
def test_counts_must_be_positive(capsys, flag):
    with pytest.raises(SystemExit):
        main(["train", flag, "0"])
    assert f"argument {flag}: must be >= 1; got 0" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--recurrent", "-5"], r"--recurrent -5: .*hidden_size.*>= 1"),
        (
            ["--hidden", "8,8", "--entropy-weight=-1"],
            r"--hidden 8,8 --entropy-weight -1.0: .*entropy_weight.*>= 0",
        ),
    ],
)
def test_bad_network_flags_get_one_line_and_no_run_folder(
    tmp_path, capsys, flags, named
):
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), "--no-progress", *flags]) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(rf"eqx-ppo train: {named}[^\n]*\n", err), err
    assert not out.exists()


def test_help_shows_every_default(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for flag, default in {
        "--steps": 300000,
        "--n-envs": 128,
        "--rollout-length": 20,
        "--lr": 0.001,
        "--lr-schedule": "constant",
        "--hidden": "32,32",
        "--entropy-weight": 0.01,
        "--minibatches": 4,
        "--epochs": 4,
        "--env": "move_to_center",
    }.items():
        # the first "(default: ...)" after the flag is its own
        first = rf"{flag} \S+ (?:(?!\(default:).)*\(default: {default}\)"
        assert re.search(first, text), flag


def test_train_refuses_an_out_folder_holding_a_run(run_dir, capsys):
    before = (run_dir / "metrics.jsonl").read_text()
    assert main(["train", "--out", str(run_dir), "--steps", "640"]) == 2
    err = capsys.readouterr().err
    assert f"eqx-ppo train: {run_dir} already holds a run; continue it with" in err
    assert (run_dir / "metrics.jsonl").read_text() == before


def test_eval_and_record(run_dir, capsys):
    assert (
        main(
            [
                "eval",
                "--checkpoint",
                str(run_dir),
                "--n-envs",
                "4",
                "--episode-length",
                "20",
            ]
        )
        == 0
    )
    assert "eval/episode_reward/mean" in capsys.readouterr().out
    seeds = {}
    for seed in (0, 1):
        argv = ["eval", "--checkpoint", str(run_dir), "--seed", str(seed)]
        assert main(argv + ["--n-envs", "4", "--episode-length", "20"]) == 0
        printed = capsys.readouterr().out
        assert f"seed {seed} of 2" in printed
        seeds[seed] = printed.splitlines()[1:]
    assert seeds[0] != seeds[1]  # two different trained networks
    assert main(["eval", "--checkpoint", str(run_dir), "--seed", "2"]) == 2
    assert (
        "--seed 2: the run trained 2 seed(s); pass 0 .. 1." in capsys.readouterr().err
    )
    out = run_dir / "acts.npz"
    assert (
        main(
            [
                "record",
                "--checkpoint",
                str(run_dir),
                "--n-envs",
                "3",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "20 steps x 3 envs" in printed  # move_to_center's own episode limit
    assert "peak |a| over live steps" in printed
    with np.load(out) as data:
        assert data["dones"].shape == (20, 3)
        assert data["1/action/0"].shape == (20, 3, 8)
    # NumPy adds the suffix to an --out without it; the CLI names that file,
    # and makes its folder.
    argv = ["record", "--checkpoint", str(run_dir), "--n-envs", "1"]
    bare = run_dir / "new" / "acts_bare"
    assert main([*argv, "--out", str(bare)]) == 0
    first_line = capsys.readouterr().out.splitlines()[0]
    assert first_line.endswith(f"-> {bare}.npz")
    assert bare.with_name("acts_bare.npz").is_file()
    # Without --out, each seed and checkpoint gets its own file.
    latest = latest_checkpoint(run_dir / "checkpoints").name
    for seed in ("0", "1"):
        argv = ["record", "--checkpoint", str(run_dir), "--seed", seed]
        assert main(argv + ["--n-envs", "2", "--episode-length", "5"]) == 0
    capsys.readouterr()
    for seed in (0, 1):
        with np.load(run_dir / f"activations_{latest}_seed{seed}.npz") as data:
            assert data["dones"].shape == (5, 2)


def test_bad_flags_are_rejected(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--hidden", "8,-1"])
    assert "--hidden" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # no abbreviations: --resume checks names
        main(["train", "--st", "640"])
    assert "unrecognized arguments: --st 640" in capsys.readouterr().err


def test_env_kwargs_reach_the_env(capsys):
    import jax
    import jax.numpy as jnp

    from eqx_ppo.cli._args import _env_kwargs
    from eqx_ppo.cli._settings import _make_env

    # Each flag one NAME=VALUE, the value JSON if it parses: commas inside a
    # value are the value's (a gymnax params dict with two fields).
    items = ["backend=spring", "start_radius=2.5", "on=true"]
    items += ['env_params={"gravity": 9.8, "masscart": 1.0}', "name=a,b"]
    assert _env_kwargs(items) == {
        "backend": "spring",
        "start_radius": 2.5,
        "on": True,
        "env_params": {"gravity": 9.8, "masscart": 1.0},
        "name": "a,b",
    }
    run = {"env": "move_to_center", "env_kwargs": _env_kwargs(["start_radius=2.5"])}
    start = _make_env(run).reset(jax.random.key(0)).obs
    assert float(jnp.linalg.norm(start)) == pytest.approx(2.5)
    with pytest.raises(SystemExit):
        main(["train", "--env-kwarg", "spring"])
    assert "argument --env-kwarg: expected NAME=VALUE" in capsys.readouterr().err


def test_env_kwarg_values_may_hold_commas(tmp_path, monkeypatch, capsys):
    pytest.importorskip("gymnax")
    out = tmp_path / "run"
    params = '{"gravity": 9.81, "masscart": 1.5}'
    argv = ["train", "--env", "gymnax:CartPole-v1", "--out", str(out)]
    argv += ["--env-kwarg", f"env_params={params}", "--no-progress"]
    monkeypatch.setattr(cli, "train", _killed_after(0, "log"))
    assert main(argv) == 130
    run = json.loads((out / "run.json").read_text())
    assert run["env_kwargs"] == {"env_params": {"gravity": 9.81, "masscart": 1.5}}
    env = cli._make_env(run)
    assert (env.env_params.gravity, env.env_params.masscart) == (9.81, 1.5)


def test_eval_takes_the_run_its_checkpoints_folder_or_one_checkpoint(run_dir, capsys):
    latest = latest_checkpoint(run_dir / "checkpoints")
    printed = {}
    for name, path in {
        "run": run_dir,
        "checkpoints": run_dir / "checkpoints",
        "latest": latest,
    }.items():
        argv = ["eval", "--checkpoint", str(path), "--n-envs", "4"]
        assert main(argv + ["--episode-length", "20"]) == 0
        printed[name] = capsys.readouterr().out.splitlines()[1:]
    assert any("eval/episode_reward/mean" in line for line in printed["run"])
    assert printed["run"] == printed["checkpoints"] == printed["latest"]
    assert main(["eval", "--checkpoint", str(run_dir / "run.json")]) == 2
    assert "not a run folder, its checkpoints folder or a checkpoint" in (
        capsys.readouterr().err
    )


def test_record_peaks_count_live_steps_only():
    from eqx_ppo.cli import live_peak

    value = np.array([[[1.0], [-2.0]], [[0.5], [9.0]], [[3.0], [0.0]]])  # [T, B, 1]
    dones = np.array([[False, False], [False, True], [False, True]])
    assert live_peak(value, dones) == 3.0  # the 9.0 came after env 1's episode


def test_cell_picks_the_recurrent_layer(tmp_path, capsys):
    import jax

    from eqx_ppo import envs
    from eqx_ppo.cli import build_network
    from eqx_ppo.nn import LRU, LSTM

    run = {"recurrent": 4, "cell": "lru", "hidden": [], "entropy_weight": 0.01}
    recall = envs.make("recall")
    net = build_network({**run, "lru_state_size": 2}, recall, jax.random.key(0))
    assert isinstance(net.layers[-1].action.layers[1], LRU)
    assert net.layers[-1].action.layers[1].hidden_size == 2
    lstm = {**run, "cell": "lstm", "lru_state_size": None}
    net = build_network(lstm, recall, jax.random.key(0))
    assert isinstance(net.layers[-1].action.layers[0], LSTM)
    out = tmp_path / "run"
    assert main(["train", "--cell", "gru", "--out", str(out), "--no-progress"]) == 2
    assert "add --recurrent SIZE" in capsys.readouterr().err
    assert not out.exists()


def test_an_lru_run_saves_its_state_size_and_evaluates(tmp_path, capsys):
    # The saved size, not the factory's default of the day, shapes the
    # network that eval and --resume rebuild.
    out = tmp_path / "lru"
    argv = ["train", "--out", str(out), "--env", "recall", "--recurrent", "5"]
    argv += ["--cell", "lru", "--steps", "256", "--n-envs", "8", "--no-progress"]
    assert main(argv) == 0
    assert json.loads((out / "run.json").read_text())["lru_state_size"] == 3
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(out), "--n-envs", "2"]) == 0
    assert "eval/episode_reward/mean" in capsys.readouterr().out


@pytest.mark.parametrize(
    "env, length",
    [("move_to_center", 20), ("recall", 5), ("counter", 9), ("repeat_first_hard", 64)],
)
def test_runs_evaluate_and_record_episodes_of_the_envs_own_length(env, length):
    # Envs that end their episodes themselves have no time limit to read;
    # their `max_len` spares evaluating and recording 1000 mostly-masked steps.
    args = cli._args._parser().parse_args(["train", "--env", env])
    args.given = {"--env"}
    assert cli._settings._new_run(args)[1]["episode_length"] == length


SMALL = ["--n-envs", "16", "--hidden", "8", "--eval-every", "640", "--no-progress"]


@pytest.mark.parametrize("where", ["checkpoint", "log"])
def test_a_run_killed_at_step_0_resumes_with_step_0_logged_once(
    tmp_path, monkeypatch, capsys, where
):
    # Killed after the step-0 checkpoint, the run resumes from it; killed
    # between logging step 0 and that checkpoint, it has trained nothing and
    # --resume starts it over. Either way the logs read as an uninterrupted
    # run's: before, the first logged step 0 twice, the second was stuck
    # (--out said to --resume, --resume that there was no checkpoint).
    flags = ["--steps", "1280", *SMALL]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    assert main(["train", "--out", str(straight), *flags]) == 0
    monkeypatch.setattr(cli, "train", _killed_after(0, where))
    assert main(["train", "--out", str(killed), *flags]) == 130
    monkeypatch.undo()
    assert [row["step"] for row in _rows(killed / "eval.jsonl")] == [0]
    assert main(["train", "--out", str(killed), *flags]) == 2
    assert f"continue it with --resume {killed}" in capsys.readouterr().err
    assert main(["train", "--resume", str(killed), "--no-progress"]) == 0
    for name in ("metrics.jsonl", "eval.jsonl"):
        got, want = _rows(killed / name), _rows(straight / name)
        assert [row["step"] for row in got] == [row["step"] for row in want]
    printed = capsys.readouterr().out.splitlines()[1]
    assert printed == (
        "resuming from " + str(killed / "checkpoints" / "step_000000000")
        if where == "checkpoint"
        else "no checkpoint yet: starting over"
    )


@pytest.mark.parametrize(
    "text, problem",
    [
        ('{"env": "move_to', r"cannot be read \(JSONDecodeError: "),
        ("[1, 2]", r"is not a JSON object"),
        ('{"env": "move_to_center"}', r"lacks \['cell', 'entropy_weight', "),
    ],
    ids=["cut-off", "a-list", "keys-missing"],
)
def test_an_unreadable_run_json_gets_one_line_and_keeps_the_run(
    run_dir, tmp_path, capsys, text, problem
):
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    (run / "run.json").write_text(text)
    checkpoints = sorted(p.name for p in (run / "checkpoints").iterdir())
    for argv, flag in (
        (["train", "--resume", str(run)], "--resume"),
        (["eval", "--checkpoint", str(run)], "--checkpoint"),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert re.fullmatch(
            rf"eqx-ppo {argv[0]}: {flag} {re.escape(str(run))}: "
            rf"{re.escape(str(run / 'run.json'))} {problem}.*, so the run cannot be "
            r"rebuilt .* Fix: restore it; every checkpoint's header keeps a copy, "
            r"eqx_ppo\.read_header\('[^']+'\)\.metadata\.\n",
            err,
        ), err
    assert (run / "run.json").read_text() == text
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == checkpoints


def test_a_diverging_run_gets_one_line_and_keeps_its_checkpoints(tmp_path, capsys):
    run = tmp_path / "run"
    argv = ["train", "--out", str(run), "--steps", "1280", "--lr", "1e12", *SMALL]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(
        r"eqx-ppo train: training stopped: Non-finite [^\n]* On the command line: "
        r"start a new run with a lower --lr than 1e\+12 \(--resume keeps a run's "
        r"settings\); its checkpoints up to step_000000000 are kept\.\n",
        err,
    ), err
    assert latest_checkpoint(run / "checkpoints").name == "step_000000000"
    assert not (run / "summary.json").exists()


@pytest.mark.parametrize("writer", ["log", "checkpoint"])
def test_a_full_disk_gets_one_line_and_the_run_resumes(
    tmp_path, monkeypatch, capsys, writer
):
    flags = ["--steps", "1920", *SMALL]
    straight, full = tmp_path / "straight", tmp_path / "full"
    assert main(["train", "--out", str(straight), *flags]) == 0

    def no_space():
        raise OSError(errno.ENOSPC, "No space left on device")

    if writer == "log":
        write = cli.JSONLLogger.__call__

        def log(self, metrics, step):
            if step == 1280:
                no_space()
            write(self, metrics, step)

        monkeypatch.setattr(cli.JSONLLogger, "__call__", log)
    else:
        from eqx_ppo.checkpoint import _files

        write = _files._write_synced

        def save(file, data):
            if "step_000001280" in file.parent.name:
                no_space()
            return write(file, data)

        monkeypatch.setattr(_files, "_write_synced", save)
    assert main(["train", "--out", str(full), *flags]) == 2
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert re.fullmatch(
        rf"eqx-ppo train: writing {re.escape(str(full))} failed: [^\n]*No space "
        r"left on device[^\n]* Fix: free space or fix the folder, then continue "
        rf"with: eqx-ppo train --resume {re.escape(str(full))}; its checkpoints up "
        r"to step_000000640 are kept\.\n",
        err,
    ), err
    assert latest_checkpoint(full / "checkpoints").name == "step_000000640"
    assert main(["train", "--resume", str(full), "--no-progress"]) == 0
    for name in ("metrics.jsonl", "eval.jsonl"):
        got, want = _rows(full / name), _rows(straight / name)
        assert [row["step"] for row in got] == [row["step"] for row in want]


def _stop(*args, **kwargs):
    raise KeyboardInterrupt  # train, stopped before it trains


def test_the_first_line_says_the_steps_that_will_be_trained(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(cli, "train", _stop)
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), "--steps", "1000", *SMALL]) == 130
    assert capsys.readouterr().out.splitlines()[0] == (
        "training move_to_center for 1,280 env steps (--steps 1,000 rounded up to "
        f"whole iterations of 16 envs x 20 steps), 1 seed(s) -> {out}"
    )


def test_eval_runs_as_many_episodes_as_training_evaluations(run_dir):
    run = json.loads((run_dir / "run.json").read_text())
    episodes = cli.train_config(run, progress=False).eval.n_envs
    args = cli._parser().parse_args(["eval", "--checkpoint", str(run_dir)])
    assert args.n_envs == episodes == cli.EVAL_ENVS
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["eval_episodes"] == episodes


def test_gymnax_cartpole_gets_its_own_defaults_unless_given(
    tmp_path, monkeypatch, capsys
):
    pytest.importorskip("gymnax")
    monkeypatch.setattr(cli, "train", _stop)
    for given, lr in (([], 3e-3), (["--lr", "1e-3"], 1e-3)):
        out = tmp_path / f"run{lr}"
        argv = ["train", "--env", "gymnax:CartPole-v1", "--out", str(out), *given]
        assert main(argv) == 130
        run = json.loads((out / "run.json").read_text())
        assert (run["steps"], run["lr"], run["lr_schedule"]) == (500_000, lr, "linear")
        assert run["normalize_advantages"] is False
        flags = "--steps 500000" + (" --lr 0.003" if not given else "")
        assert capsys.readouterr().out.splitlines()[0] == (
            f"gymnax:CartPole-v1 trains with its own defaults: {flags} "
            "--lr-schedule linear --no-normalize-advantages"
        )


def test_a_decaying_run_cannot_change_its_total(run_dir, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    settings = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**settings, "lr_schedule": "linear"}))
    assert main(["train", "--resume", str(run), "--steps", "9000"]) == 2
    assert capsys.readouterr().err == (
        f"eqx-ppo train: --steps 9000: this run's learning rate decays to 0 over "
        f"its {settings['steps']:,} steps (--lr-schedule linear), which changing "
        "the total would rewrite; start a new run with --out.\n"
    )


@pytest.mark.slow  # 60-120 s: four seeds of 500,000 steps
def test_gymnax_cartpole_is_solved_at_the_cli_defaults(tmp_path):
    pytest.importorskip("gymnax")
    out = tmp_path / "run"
    argv = ["train", "--env", "gymnax:CartPole-v1", "--seeds", "4"]
    assert main([*argv, "--out", str(out), "--no-progress"]) == 0
    returns = json.loads((out / "summary.json").read_text())["final_eval_return"]
    assert sum(r >= 475 for r in returns) >= 3, returns


def test_the_compile_cache_makes_a_second_run_load_its_programs(tmp_path):
    """In fresh processes, as users run it: the first run writes its compiled
    programs to `--compile-cache`, the second loads every one of them (JAX
    counts a cache hit each) and trains to the same result;
    `--no-compile-cache` writes none. Every program is cached (a minimum
    compile time of 0 through JAX's variable, which the CLI keeps): which
    ones pass the CLI's 0.5 s depends on the machine's speed and load."""
    cache = tmp_path / "cache"
    script = (
        "import jax, sys\n"
        "hits = []\n"
        "jax.monitoring.register_event_listener("
        "lambda e, **k: hits.append(e) if e.endswith('cache_hits') else None)\n"
        "from eqx_ppo.cli import main\n"
        "code = main(sys.argv[1:])\n"
        "print('hits', len(hits))\n"
        "sys.exit(code)\n"
    )
    flags = [*TINY, "--no-progress", "--steps", "64"]

    def run(out, *extra):
        done = subprocess.run(
            [sys.executable, "-c", script, "train", *flags, "--out", str(out), *extra],
            capture_output=True,
            text=True,
            env=cpu_child_env(JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0"),
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    first = run(tmp_path / "a", "--compile-cache", str(cache))
    assert f"compiled programs are cached in {cache}" in first
    assert "hits 0" in first
    written = sorted(p.name for p in cache.iterdir())
    for program in ("_init_seeds", "_run_chunk", "_evaluate"):
        assert any(name.startswith(f"jit_{program}-") for name in written)
    second = run(tmp_path / "b", "--compile-cache", str(cache))
    assert int(second.split("hits ")[1].split()[0]) == len(written)
    assert sorted(p.name for p in cache.iterdir()) == written
    summary = [json.loads((tmp_path / r / "summary.json").read_text()) for r in "ab"]
    assert summary[0]["final_eval_return"] == summary[1]["final_eval_return"]
    off = run(tmp_path / "c", "--no-compile-cache")
    assert "cached in" not in off and "hits 0" in off


@pytest.mark.parametrize("given", [None, "2.5"])
def test_the_cli_caches_programs_over_half_a_second_unless_jax_is_told(tmp_path, given):
    # In a fresh process: the suite's own JAX may already have a cache set.
    script = (
        "import jax\n"
        "from eqx_ppo.cli import _parser, _use_compile_cache\n"
        f"_use_compile_cache(_parser().parse_args(['train', '--compile-cache', "
        f"{str(tmp_path)!r}]))\n"
        "print(jax.config.jax_compilation_cache_dir)\n"
        "print(jax.config.jax_persistent_cache_min_compile_time_secs)\n"
    )
    env = cpu_child_env()
    env.pop("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", None)  # the suite sets it
    if given is not None:
        env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = given
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(tmp_path), "0.5" if given is None else given]


def test_compile_cache_flags_are_checked(tmp_path, capsys):
    argv = ["train", *TINY, "--out", str(tmp_path / "r")]
    with pytest.raises(SystemExit):
        main([*argv, "--compile-cache", str(tmp_path), "--no-compile-cache"])
    assert "not allowed with argument --compile-cache" in capsys.readouterr().err
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert main([*argv, "--compile-cache", str(blocked / "c")]) == 2
    assert "--compile-cache" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
