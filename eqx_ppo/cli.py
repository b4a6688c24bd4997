"""`eqx-ppo`: train, evaluate and record from the command line.

`eqx-ppo train` trains on a built-in env (no simulator needed) and writes a run
folder: `metrics.jsonl`, `eval.jsonl`, `learning_curve.png`, `summary.json`,
`run.json` (what is needed to rebuild the network) and `checkpoints/`.
"""

import argparse
import json
import pathlib
import sys
import time
from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import numpy as np

from . import envs
from .envs._registry import pinned_kwargs
from .logging import JSONLLogger, LoggingLevel, replace_file
from .nn import make_mlp_actor_critic, make_recurrent_actor_critic
from .nn._recurrent_factories import default_lru_state_size
from .ppo import EvalConfig, PPOConfig, TrainConfig, select_seed, train_ppo

DEFAULT_ENV = "move_to_center"


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(s) for s in text.split(",") if s)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated ints like 32,32; got {text!r}"
        ) from None
    if any(s < 1 for s in sizes):
        raise argparse.ArgumentTypeError(f"sizes must be positive; got {text!r}")
    return sizes


def _count(text: str) -> int:
    """A positive int flag (a number of steps, envs, seeds, ...)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int; got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1; got {value}")
    return value


class _Defaults(argparse.ArgumentDefaultsHelpFormatter):
    """`--help` with every default, except `None` and on/off switches."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or isinstance(action.default, bool):
            return action.help
        return super()._get_help_string(action)


RESUMABLE_FLAGS = frozenset({"--resume", "--steps", "--no-progress"})
"""The `train` flags a resumed run honours; the run's `run.json` fixes the rest."""

NETWORK_FLAGS = ("--hidden", "--recurrent", "--cell", "--entropy-weight")
"""The `train` flags, besides `--env`, that the network is built from."""

CONFIG_FLAGS = (
    "--steps",
    "--n-envs",
    "--rollout-length",
    "--seeds",
    "--lr",
    "--minibatches",
    "--epochs",
    "--eval-every",
)
"""The `train` flags the `TrainConfig` is built from."""

ENV_FLAGS = ("--env", "--env-kwargs")
"""The `train` flags the env is made from."""


class CLIError(Exception):
    """A mistake in the command line: printed as one line, exit status 2."""


def _env_kwargs(text: str) -> dict[str, Any]:
    """`k=v,k=v` -> a dict; each value is read as JSON if it parses (numbers,
    `true`/`false`), else kept as a string."""
    kwargs: dict[str, Any] = {}
    for item in filter(None, text.split(",")):
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise argparse.ArgumentTypeError(
                f"expected name=value pairs like backend=spring; got {item!r}"
            )
        try:
            kwargs[name] = json.loads(value)
        except ValueError:
            kwargs[name] = value
    return kwargs


def _parser() -> argparse.ArgumentParser:
    # No abbreviated flags: `--resume` checks the flags given by their names.
    parser = argparse.ArgumentParser(
        prog="eqx-ppo", description=__doc__.split("\n")[0], allow_abbrev=False
    )
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser(
        "train",
        help="train a policy and write a run folder",
        formatter_class=_Defaults,
        allow_abbrev=False,
    )
    train.add_argument(
        "--env",
        default=DEFAULT_ENV,
        help=f"built-in env ({', '.join(envs.registered_names())}) or "
        "brax:<name> / playground:<name> / gymnax:<name> / popgym_arcade:<name> "
        "(each needs its extra)",
    )
    train.add_argument(
        "--env-kwargs",
        type=_env_kwargs,
        default=None,
        metavar="K=V,...",
        help="options for the env, e.g. backend=spring for brax:inverted_pendulum "
        "(the environments guide lists each backend's)",
    )
    train.add_argument(
        "--steps",
        type=_count,
        default=300_000,
        help="env steps in all (with --resume: the new total, more or fewer "
        "than the run's)",
    )
    train.add_argument("--n-envs", type=_count, default=128, help="parallel envs")
    train.add_argument(
        "--rollout-length", type=_count, default=20, help="steps per env per iteration"
    )
    train.add_argument(
        "--seeds",
        type=_count,
        default=1,
        help="train this many seeds in one vmapped program",
    )
    train.add_argument("--seed", type=int, default=0, help="the first seed")
    train.add_argument(
        "--hidden",
        type=_sizes,
        default=(32, 32),
        help="hidden sizes of actor and critic, e.g. 64,64",
    )
    train.add_argument(
        "--recurrent",
        type=int,
        default=0,
        metavar="SIZE",
        help="use a recurrent policy with this many units (the cell: --cell)",
    )
    train.add_argument(
        "--cell",
        choices=("lstm", "gru", "lru", "mingru"),
        default="lstm",
        help="the recurrent cell of --recurrent",
    )
    train.add_argument("--lr", type=float, default=1e-3, help="learning rate")
    train.add_argument(
        "--entropy-weight", type=float, default=1e-2, help="entropy bonus weight"
    )
    train.add_argument(
        "--minibatches", type=_count, default=4, help="minibatches per epoch"
    )
    train.add_argument("--epochs", type=_count, default=4, help="epochs per iteration")
    train.add_argument(
        "--eval-every",
        type=_count,
        default=None,
        help="env steps between evaluations (default: steps/10)",
    )
    train.add_argument(
        "--out",
        type=pathlib.Path,
        default=None,
        help="run folder (default runs/<env>-<time>)",
    )
    train.add_argument(
        "--resume",
        type=pathlib.Path,
        default=None,
        help="continue the run in this folder from its latest checkpoint; only "
        "--steps and --no-progress may be given with it",
    )
    train.add_argument("--no-progress", action="store_true", help="no progress bar")

    for name, text in (
        ("eval", "evaluate a checkpoint"),
        ("record", "record activations of a checkpoint"),
    ):
        p = sub.add_parser(
            name, help=text, formatter_class=_Defaults, allow_abbrev=False
        )
        p.add_argument(
            "--checkpoint",
            type=pathlib.Path,
            required=True,
            help="a run folder (its latest checkpoint), its checkpoints folder, "
            "or one checkpoint folder in it",
        )
        p.add_argument(
            "--n-envs", type=_count, default=16, help="episodes, one per env"
        )
        p.add_argument(
            "--episode-length",
            type=_count,
            default=None,
            help="steps per env (default: the env's own episode limit)",
        )
        p.add_argument(
            "--seed",
            type=int,
            default=0,
            help="which of a multi-seed run's seeds (0 .. seeds-1)",
        )
        p.add_argument(
            "--eval-seed", type=int, default=0, help="seed of the episodes' randomness"
        )
        if name == "record":
            p.add_argument(
                "--out",
                type=pathlib.Path,
                default=None,
                help="the .npz file to write (default: "
                "RUN/activations_<checkpoint>_seed<seed>.npz)",
            )
    return parser


def build_network(run: dict[str, Any], env: Any, key: jax.Array):
    """The network a run's `run.json` describes, freshly initialised with `key`."""
    obs_size = env.observation_size
    n_actions = getattr(env, "n_actions", None)
    discrete = n_actions is not None
    action_size = n_actions if discrete else env.action_size
    if run["recurrent"]:
        cell = run.get("cell", "lstm")
        return make_recurrent_actor_critic(
            obs_size,
            action_size,
            run["recurrent"],
            key=key,
            cell=cell,
            # Runs from before it was saved used the LRU's then default, one
            # complex state per unit.
            lru_state_size=run.get("lru_state_size", run["recurrent"])
            if cell == "lru"
            else None,
            actor_hidden_sizes=run["hidden"],
            critic_hidden_sizes=run["hidden"],
            entropy_weight=run["entropy_weight"],
            discrete=discrete,
        )
    return make_mlp_actor_critic(
        obs_size,
        action_size,
        run["hidden"],
        run["hidden"],
        key=key,
        entropy_weight=run["entropy_weight"],
        discrete=discrete,
    )


def _eval_every(run: dict[str, Any]) -> int:
    """The run's evaluation (and checkpoint) spacing: `--eval-every`, else a
    tenth of the steps it was started with."""
    return run["eval_every"] or max(1, run["steps"] // 10)


def train_config(run: dict[str, Any], progress: bool) -> TrainConfig:
    """The `TrainConfig` a run's `run.json` describes."""
    eval_every = _eval_every(run)
    return TrainConfig(
        ppo=PPOConfig(
            n_envs=run["n_envs"],
            rollout_length=run["rollout_length"],
            total_steps=run["steps"],
            learning_rate=run["lr"],
            n_minibatches=run["minibatches"],
            n_epochs=run["epochs"],
            logging_level=LoggingLevel.LOSSES
            | LoggingLevel.THROUGHPUT
            | LoggingLevel.ROLLOUT_STATS,
        ),
        eval=EvalConfig(
            every_steps=eval_every, n_envs=32, max_episode_length=run["episode_length"]
        ),
        seed=run["seed"],
        n_seeds=run["seeds"],
        checkpoint_every_steps=eval_every,
        progress=progress,
    )


def _make_env(run: dict[str, Any]) -> Any:
    """The env a run's `run.json` names, with its `--env-kwargs`."""
    try:
        return envs.make(run["env"], **run.get("env_kwargs", {}))
    except ImportError as e:  # its simulator is not installed here
        raise CLIError(f"the run's env {run['env']}: {e}") from e


def _episode_length(env: Any) -> int:
    return int(getattr(env, "max_len", 0) or 1000)


def _given(args: argparse.Namespace, flags: Sequence[str], fallback: str) -> str:
    """`--flag value ...` for those of `flags` the command line gave (else
    `fallback`), to name them in a one-line error."""
    named = []
    for flag in [f for f in flags if f in args.given] or [fallback]:
        value = getattr(args, flag[2:].replace("-", "_"))
        text = ",".join(map(str, value)) if isinstance(value, tuple) else value
        named.append(f"{flag} {text}")
    return " ".join(named)


def _check_network(args: argparse.Namespace, run: dict[str, Any], env: Any) -> None:
    """Build the network abstractly, so that a bad network flag is one line and
    no run folder."""
    try:
        eqx.filter_eval_shape(build_network, run, env, jax.random.key(0))
    except ValueError as e:
        raise CLIError(f"{_given(args, NETWORK_FLAGS, '--env')}: {e}") from e


def _train(args: argparse.Namespace) -> int:
    from .checkpoint import (
        CheckpointError,
        latest_checkpoint,
        load_checkpoint,
        make_checkpoint_fn,
        read_header,
    )

    if args.resume is not None:
        out = args.resume
        refused = sorted(args.given - RESUMABLE_FLAGS)
        if refused:
            raise CLIError(
                f"--resume {out}: {', '.join(refused)} cannot change a run (its "
                "settings are in run.json); drop them, or start a new run with --out."
            )
        if not (out / "run.json").is_file():
            raise CLIError(f"--resume {out}: no run.json there; not a run folder.")
        if latest_checkpoint(out / "checkpoints") is None:
            raise CLIError(f"--resume {out}: the run has no checkpoint to resume from.")
        run = json.loads((out / "run.json").read_text())
        # Fixed before --steps moves the total (run.json files written before
        # the spacing was saved hold None): a resumed run keeps its cadence.
        run["eval_every"] = _eval_every(run)
        if "--steps" in args.given:
            run["steps"] = args.steps
    else:
        if "--cell" in args.given and not args.recurrent:
            raise CLIError(
                f"--cell {args.cell} picks the cell of a recurrent policy; add "
                "--recurrent SIZE."
            )
        env_kwargs = args.env_kwargs or {}
        try:
            env_probe = envs.make(args.env, **env_kwargs)
        except (ValueError, TypeError, ImportError) as e:
            raise CLIError(f"{_given(args, ENV_FLAGS, '--env')}: {e}") from e
        run = {
            "env": args.env,
            # With the machine's choices (a Playground backend) pinned, so
            # that eval, record and --resume elsewhere build the same env.
            "env_kwargs": pinned_kwargs(args.env, env_kwargs),
            "steps": args.steps,
            "n_envs": args.n_envs,
            "rollout_length": args.rollout_length,
            "seeds": args.seeds,
            "seed": args.seed,
            "hidden": list(args.hidden),
            "recurrent": args.recurrent,
            "cell": args.cell,
            # Saved, so that a later default cannot change this run's shapes.
            "lru_state_size": default_lru_state_size(args.recurrent)
            if args.cell == "lru" and args.recurrent
            else None,
            "lr": args.lr,
            "entropy_weight": args.entropy_weight,
            "minibatches": args.minibatches,
            "epochs": args.epochs,
            "eval_every": args.eval_every,
            "episode_length": _episode_length(env_probe),
        }
        run["eval_every"] = _eval_every(run)
        _check_network(args, run, env_probe)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        out = args.out or pathlib.Path("runs") / f"{args.env.replace(':', '_')}-{stamp}"
        if out.exists() and not out.is_dir():
            raise CLIError(f"--out {out}: a file is there; pass a folder to write to.")
        if (out / "metrics.jsonl").exists():
            raise CLIError(
                f"{out} already holds a run; continue it with --resume {out}, or "
                "pass another --out."
            )
    env = _make_env(run)
    # Built, like the network checked above, before anything is written: bad
    # flags leave no folder behind.
    try:
        config = train_config(run, progress=not args.no_progress)
    except ValueError as e:
        raise CLIError(f"{_given(args, CONFIG_FLAGS, '--n-envs')}: {e}") from e

    def networks(key):
        return build_network(run, env, key)

    initial_state = None
    if args.resume is not None:
        latest = latest_checkpoint(out / "checkpoints")
        try:
            initial_state = load_checkpoint(
                latest, env=env, networks=networks, config=config
            )
        except CheckpointError as e:
            previous = _previous_checkpoint(latest)
            raise CLIError(
                f"--resume {out}: {e}"
                + (
                    f"\nTo resume from {previous.name}, move {latest} out of "
                    f"{latest.parent}."
                    if previous
                    else ""
                )
            ) from e
        resumed_step = read_header(latest).step
        ppo = config.ppo
        if resumed_step >= ppo.n_iterations * ppo.steps_per_iteration:
            print(
                f"{out} is already trained to {resumed_step:,} steps; pass a "
                "larger --steps to continue."
            )
            return 0
        print(f"resuming from {latest}")
    # Written once the checkpoint loaded: a failed resume changes nothing.
    out.mkdir(parents=True, exist_ok=True)
    _write_json(out / "run.json", run)
    resuming = args.resume is not None
    metrics_log = JSONLLogger(out / "metrics.jsonl", append=resuming)
    # Written as the evaluations run, so a killed run keeps its curve.
    eval_log = JSONLLogger(out / "eval.jsonl", append=resuming)
    if resuming:
        for path in (metrics_log.path, eval_log.path):
            _drop_rows_after(path, resumed_step)

    def log(metrics: dict[str, Any], step: int) -> None:
        metrics_log(metrics, step)
        evals = {k: v for k, v in metrics.items() if k.startswith("eval/")}
        if evals:
            eval_log(evals, step)

    print(
        f"training {run['env']} for {run['steps']:,} steps "
        f"({run['seeds']} seed(s), {run['n_envs']} envs) -> {out}"
    )
    try:
        result = train_ppo(
            env,
            networks,
            config,
            log_fn=log,
            checkpoint_fn=make_checkpoint_fn(out / "checkpoints", config, metadata=run),
            initial_state=initial_state,
        )
    except KeyboardInterrupt:
        print(
            f"\ninterrupted; continue from the last checkpoint with: eqx-ppo "
            f"train --resume {out}",
            file=sys.stderr,
        )
        return 130
    history = [
        json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines()
    ]
    final = history[-1]["eval/episode_reward/mean"]
    summary = {
        "env": run["env"],
        "total_steps": result.total_steps,
        "final_eval_return": final,
        "final_eval_return_mean_over_seeds": float(np.mean(final)),
    }
    _write_json(out / "summary.json", summary)
    _plot(history, out / "learning_curve.png", run)
    print(
        f"final eval return: {float(np.mean(final)):.3f}"
        + (f" (mean of {run['seeds']} seeds)" if run["seeds"] > 1 else "")
    )
    print(f"wrote {out}/metrics.jsonl, learning_curve.png, summary.json, checkpoints/")
    return 0


def _drop_rows_after(path: pathlib.Path, step: int) -> None:
    """Cut a JSONL log back to its rows up to `step`: a run resumed from the
    checkpoint at `step` logs the later steps again."""
    if not path.is_file():
        return
    lines = path.read_text().splitlines(keepends=True)
    kept = [line for line in lines if json.loads(line)["step"] <= step]
    if len(kept) < len(lines):
        replace_file(path, "".join(kept))


def _write_json(path: pathlib.Path, data: dict[str, Any]) -> None:
    """Write `data` to `path` through a temporary file, so a run killed while
    writing keeps the old file whole (`run.json` is what `--resume` reads)."""
    replace_file(path, json.dumps(data, indent=2))


def _plot(history: list[dict[str, Any]], path: pathlib.Path, run: dict) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed (pip install 'eqx_ppo[plot]'): no plot written")
        return
    steps = np.array([h["step"] for h in history])
    returns = np.array([np.atleast_1d(h["eval/episode_reward/mean"]) for h in history])
    mean = returns.mean(axis=1)
    fig, ax = plt.subplots(figsize=(6, 4))
    label = (
        f"mean of {returns.shape[1]} seeds" if returns.shape[1] > 1 else "eval return"
    )
    ax.plot(steps, mean, label=label)
    if returns.shape[1] > 1:
        lo, hi = returns.min(axis=1), returns.max(axis=1)
        ax.fill_between(steps, lo, hi, alpha=0.3, label="min-max over seeds")
    ax.set_xlabel("env steps")
    ax.set_ylabel("deterministic eval return")
    ax.set_title(f"eqx_ppo on {run['env']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _previous_checkpoint(checkpoint: pathlib.Path) -> pathlib.Path | None:
    """The checkpoint saved before `checkpoint` in its folder, if any."""
    from .checkpoint import list_checkpoints

    earlier = list_checkpoints(checkpoint.parent)
    earlier = earlier[: earlier.index(checkpoint)] if checkpoint in earlier else []
    return earlier[-1] if earlier else None


def _load_for_analysis(path: pathlib.Path, seed: int):
    from .checkpoint import CheckpointError, latest_checkpoint, load_checkpoint

    if (path / "run.json").exists():
        run_dir = path
    elif path.name == "checkpoints" and (path.parent / "run.json").exists():
        run_dir = path.parent
    else:
        run_dir = path.parent.parent
    if not (run_dir / "run.json").is_file():
        raise CLIError(
            f"--checkpoint {path}: not a run folder, its checkpoints folder or a "
            "checkpoint inside it (no run.json found)."
        )
    run = json.loads((run_dir / "run.json").read_text())
    if not 0 <= seed < run["seeds"]:
        raise CLIError(
            f"--seed {seed}: the run trained {run['seeds']} seed(s); pass 0 .. "
            f"{run['seeds'] - 1}."
        )
    checkpoint = (
        latest_checkpoint(run_dir / "checkpoints")
        if path in (run_dir, run_dir / "checkpoints")
        else path
    )
    if checkpoint is None:
        raise CLIError(f"--checkpoint {path}: the run has no checkpoint yet.")
    env = _make_env(run)
    config = train_config(run, progress=False)
    try:
        state = load_checkpoint(
            checkpoint,
            env=env,
            networks=lambda k: build_network(run, env, k),
            config=config,
        )
    except CheckpointError as e:
        previous = _previous_checkpoint(checkpoint)
        raise CLIError(
            f"--checkpoint {path}: {e}"
            + (f"\nThe one before it: --checkpoint {previous}" if previous else "")
        ) from e
    network = state.network
    if run["seeds"] > 1:
        network = select_seed(network, seed)
    return run_dir, run, env, network, checkpoint


def _eval(args: argparse.Namespace) -> int:
    from .ppo import eval_rollout

    _, run, env, network, checkpoint = _load_for_analysis(args.checkpoint, args.seed)
    metrics = eqx.filter_jit(
        eval_rollout,
    )(
        env,
        eqx.nn.inference_mode(network),
        jax.random.key(args.eval_seed),
        n_envs=args.n_envs,
        max_episode_length=args.episode_length or run["episode_length"],
        logging_percentiles=(0, 50, 100),
    )
    print(
        f"{checkpoint} ({run['env']}"
        + (f", seed {args.seed} of {run['seeds']}" if run["seeds"] > 1 else "")
        + ")"
    )
    for k, v in sorted(metrics.items()):
        print(f"  {k}: {float(v):.4f}")
    return 0


def _record(args: argparse.Namespace) -> int:
    from .ppo import record_activations_rollout

    run_dir, run, env, network, checkpoint = _load_for_analysis(
        args.checkpoint, args.seed
    )
    length = args.episode_length or run["episode_length"]
    # Named by checkpoint and seed, so recording another seed, or the run
    # after more training, does not overwrite an earlier recording.
    out = args.out or run_dir / f"activations_{checkpoint.name}_seed{args.seed}.npz"
    if out.suffix != ".npz":  # NumPy would add it: name the file it writes
        out = out.with_name(out.name + ".npz")
    out.parent.mkdir(parents=True, exist_ok=True)  # before the rollout's work
    activations, dones = record_activations_rollout(
        env,
        network,
        n_envs=args.n_envs,
        max_episode_length=length,
        key=jax.random.key(args.eval_seed),
    )
    flat = {
        "/".join(
            str(getattr(p, "key", getattr(p, "idx", p))) for p in path
        ): np.asarray(leaf)
        for path, leaf in jax.tree_util.tree_leaves_with_path(activations)
    }
    dones = np.asarray(dones)
    np.savez_compressed(out, dones=dones, **flat)
    print(
        f"recorded {len(flat)} layers over {length} steps x {args.n_envs} envs -> {out}"
    )
    for name, value in flat.items():
        peak = live_peak(value, dones)
        print(f"  {name}: shape {value.shape}, peak |a| over live steps {peak:.3f}")
    return 0


def live_peak(value: np.ndarray, dones: np.ndarray) -> float:
    """The largest `|activation|` over the steps before each env's episode
    ended (`dones[t, i]` marks steps after it, as the recording guide masks)."""
    live = ~dones.reshape(dones.shape + (1,) * (value.ndim - 2))
    return float(np.abs(np.where(live, value, 0.0)).max())


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `eqx-ppo` console script."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _parser().parse_args(argv)
    args.given = {a.split("=")[0] for a in argv[1:] if a.startswith("--")}
    commands = {"train": _train, "eval": _eval, "record": _record}
    try:
        return commands[args.command](args)
    except CLIError as e:
        print(f"eqx-ppo {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
