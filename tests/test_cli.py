"""`eqx-ppo train / eval / record` end to end on a tiny budget."""

import json

import numpy as np
import pytest

from eqx_ppo.cli import main


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
    out = run_dir / "acts.npz"
    assert (
        main(
            [
                "record",
                "--checkpoint",
                str(run_dir),
                "--n-envs",
                "3",
                "--episode-length",
                "20",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    with np.load(out) as data:
        assert data["dones"].shape == (20, 3)
        assert data["1/action/0"].shape == (20, 3, 8)


def test_bad_flags_are_rejected():
    with pytest.raises(SystemExit):
        main(["train", "--hidden", "8,-1"])
    with pytest.raises(ValueError, match="unknown env"):
        main(["train", "--env", "nope", "--no-progress"])
