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
from .checkpoint import (
    CheckpointError,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    make_checkpoint_fn,
    read_header,
)
from .envs._registry import pinned_kwargs
from .logging import JSONLLogger, LoggingLevel, replace_file
from .nn import make_mlp_actor_critic, make_recurrent_actor_critic
from .nn._recurrent_factories import default_lru_state_size
from .ppo import PPO, EvalConfig, TrainConfig, select_seed, train

DEFAULT_ENV = "move_to_center"

EVAL_ENVS = 32
"""Episodes of an evaluation: training's (and so `summary.json`'s) and, by
default, `eqx-ppo eval`'s."""

ENV_DEFAULTS: dict[str, dict[str, Any]] = {
    # The flags' defaults do not solve it, and with advantage normalisation
    # a solved seed can fall (the FAQ's "Why did my run collapse?"); the
    # getting-started guide gives the measurements.
    "gymnax:CartPole-v1": {
        "--steps": 500_000,
        "--lr": 3e-3,
        "--lr-schedule": "linear",
        "--normalize-advantages": False,
    },
}
"""Per-env defaults of `train`, for envs that the flags' defaults do not solve;
a flag given on the command line wins."""

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
    "--lr-schedule",
    "--minibatches",
    "--epochs",
    "--eval-every",
)
"""The `train` flags the `TrainConfig` is built from."""

ENV_FLAGS = ("--env", "--env-kwarg")
"""The `train` flags the env is made from."""

RUN_KEYS = frozenset(
    {
        "env",
        "env_kwargs",
        "steps",
        "n_envs",
        "rollout_length",
        "seeds",
        "seed",
        "hidden",
        "recurrent",
        "cell",
        "lru_state_size",
        "lr",
        "lr_schedule",
        "normalize_advantages",
        "entropy_weight",
        "minibatches",
        "epochs",
        "eval_every",
        "episode_length",
    }
)
"""The settings a run folder's `run.json` holds."""


def _flag_text(flag: str, value: Any) -> str:
    """A flag as typed: `--lr 0.003`, `--no-normalize-advantages`."""
    if isinstance(value, bool):
        return flag if value else f"--no-{flag[2:]}"
    return f"{flag} {value}"


class CLIError(Exception):
    """A mistake in the command line: printed as one line, exit status 2."""


def _count(text: str) -> int:
    """A positive int flag (a number of steps, envs, seeds, ...)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int; got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1; got {value}")
    return value


def _env_kwarg(text: str) -> str:
    """One `NAME=VALUE` of `--env-kwarg`, kept as written (see `_env_kwargs`)."""
    name, sep, _ = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(
            f"expected NAME=VALUE like backend=spring; got {text!r}"
        )
    return text


def _env_kwargs(items: Sequence[str]) -> dict[str, Any]:
    """`--env-kwarg NAME=VALUE`s -> a dict; each value is read as JSON if it
    parses (numbers, `true`, lists, objects), else kept as a string."""
    kwargs: dict[str, Any] = {}
    for item in items:
        name, _, value = item.partition("=")
        try:
            kwargs[name] = json.loads(value)
        except ValueError:
            kwargs[name] = value
    return kwargs


def _sizes(text: str) -> tuple[int, ...]:
    """Comma-separated layer sizes, `32,32`."""
    return tuple(_count(size) for size in text.split(",") if size)


class _Defaults(argparse.ArgumentDefaultsHelpFormatter):
    """`--help` with every default, except `None` and on/off switches."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or isinstance(action.default, bool):
            return action.help
        return super()._get_help_string(action)


def _parser() -> argparse.ArgumentParser:
    # No abbreviated flags: `--resume` checks the flags given by their names.
    parser = argparse.ArgumentParser(
        prog="eqx-ppo", description=__doc__.split("\n")[0], allow_abbrev=False
    )
    sub = parser.add_subparsers(dest="command", required=True)

    per_env = "; ".join(
        f"{env}: " + " ".join(_flag_text(*item) for item in flags.items())
        for env, flags in ENV_DEFAULTS.items()
    )
    train = sub.add_parser(
        "train",
        help="train a policy and write a run folder",
        formatter_class=_Defaults,
        allow_abbrev=False,
        epilog=f"Per-env defaults, where the defaults above do not solve the env "
        f"(a flag you give wins): {per_env}.",
    )
    train.add_argument(
        "--env",
        default=DEFAULT_ENV,
        help=f"built-in env ({', '.join(envs.registered_names())}) or "
        "brax:<name> / playground:<name> / gymnax:<name> / popgym_arcade:<name> "
        "(each needs its extra)",
    )
    train.add_argument(
        "--env-kwarg",
        type=_env_kwarg,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an option for the env, repeatable; VALUE is read as JSON if it "
        "parses, else as a string: backend=spring for brax:inverted_pendulum, "
        'env_params=\'{"gravity": 9.8, "masscart": 1.0}\' for gymnax:CartPole-v1',
    )
    train.add_argument(
        "--steps",
        type=_count,
        default=300_000,
        help="env steps in all, rounded up to whole iterations of n-envs x "
        "rollout-length steps (with --resume: the new total, more or fewer than "
        "the run's)",
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
        default="32,32",
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
        "--lr-schedule",
        choices=("constant", "linear", "cosine"),
        default="constant",
        help="the learning rate's decay to 0 over --steps (a decaying run's "
        "--steps cannot change on --resume)",
    )
    train.add_argument(
        "--normalize-advantages",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="standardise advantages per minibatch (on by default); turn it off "
        "for tasks whose episodes all reach the time limit once solved",
    )
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
        help="env steps between evaluations and checkpoints (default: steps/10)",
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
        help="continue the run in this folder from its latest checkpoint (a run "
        "killed before its first checkpoint starts over); only --steps and "
        "--no-progress may be given with it",
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
            "--n-envs",
            type=_count,
            default=EVAL_ENVS if name == "eval" else 16,
            help="episodes, one per env"
            + (" (as many as training's evaluations)" if name == "eval" else ""),
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
        return make_recurrent_actor_critic(
            obs_size,
            action_size,
            run["recurrent"],
            key=key,
            cell=run["cell"],
            lru_state_size=run["lru_state_size"],
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
    return TrainConfig(
        learner=PPO(
            n_envs=run["n_envs"],
            rollout_length=run["rollout_length"],
            total_steps=run["steps"],
            learning_rate=run["lr"],
            lr_schedule=run["lr_schedule"],
            normalize_advantages=run["normalize_advantages"],
            n_minibatches=run["minibatches"],
            n_epochs=run["epochs"],
            logging_level=LoggingLevel.LOSSES
            | LoggingLevel.THROUGHPUT
            | LoggingLevel.ROLLOUT_STATS,
        ),
        eval=EvalConfig(
            every_steps=run["eval_every"],
            n_envs=EVAL_ENVS,
            max_episode_length=run["episode_length"],
        ),
        seed=run["seed"],
        n_seeds=run["seeds"],
        checkpoint_every_steps=run["eval_every"],
        progress=progress,
    )


def _make_env(run: dict[str, Any]) -> Any:
    """The env a run's `run.json` names, with its `--env-kwarg`s."""
    try:
        return envs.make(run["env"], **run["env_kwargs"])
    except ImportError as e:  # its simulator is not installed here
        raise CLIError(f"the run's env {run['env']}: {e}") from e


def _episode_length(env: Any) -> int:
    return int(getattr(env, "max_len", 0) or 1000)


def _read_run(folder: pathlib.Path, flag: str) -> dict[str, Any]:
    """The settings in `folder/run.json`, or a one-line error naming the fix."""
    file = folder / "run.json"
    if not file.is_file():
        raise CLIError(f"{flag} {folder}: no run.json there; not a run folder.")
    try:
        run = json.loads(file.read_text())
        missing = sorted(RUN_KEYS - run.keys()) if isinstance(run, dict) else None
        problem = "is not a JSON object" if missing is None else f"lacks {missing}"
    except (OSError, ValueError) as e:
        missing, problem = None, f"cannot be read ({type(e).__name__}: {e})"
    if missing != []:
        raise CLIError(
            f"{flag} {folder}: {file} {problem}, so the run cannot be rebuilt "
            "(eqx-ppo writes it whole: it was edited or damaged). Fix: restore it; "
            "every checkpoint's header keeps a copy, eqx_ppo.read_header("
            f"'{folder / 'checkpoints'}').metadata."
        )
    return run


def _given(args: argparse.Namespace, flags: Sequence[str], fallback: str) -> str:
    """`--flag value ...` for those of `flags` the command line gave (else
    `fallback`), to name them in a one-line error."""
    named = []
    for flag in [f for f in flags if f in args.given] or [fallback]:
        value = getattr(args, flag[2:].replace("-", "_"))
        if isinstance(value, list):  # a repeated flag
            named += [f"{flag} {v}" for v in value]
        else:
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


def _resumed_run(args: argparse.Namespace) -> tuple[pathlib.Path, dict[str, Any]]:
    """The folder and settings of the run `--resume` continues."""
    out = args.resume
    refused = sorted(args.given - RESUMABLE_FLAGS)
    if refused:
        raise CLIError(
            f"--resume {out}: {', '.join(refused)} cannot change a run (its "
            "settings are in run.json); drop them, or start a new run with --out."
        )
    run = _read_run(out, "--resume")
    if "--steps" in args.given and args.steps != run["steps"]:
        if run["lr_schedule"] != "constant":
            raise CLIError(
                f"--steps {args.steps}: this run's learning rate decays to 0 over "
                f"its {run['steps']:,} steps (--lr-schedule {run['lr_schedule']}), "
                "which changing the total would rewrite; start a new run with --out."
            )
        run["steps"] = args.steps  # the spacing, fixed in run.json, stays
    return out, run


def _new_run(args: argparse.Namespace) -> tuple[pathlib.Path, dict[str, Any]]:
    """The folder and settings of a new run, checked before anything is written."""
    if "--cell" in args.given and not args.recurrent:
        raise CLIError(
            f"--cell {args.cell} picks the cell of a recurrent policy; add "
            "--recurrent SIZE."
        )
    own = {
        f: v for f, v in ENV_DEFAULTS.get(args.env, {}).items() if f not in args.given
    }
    for flag, value in own.items():
        setattr(args, flag[2:].replace("-", "_"), value)
    if own:
        flags = " ".join(_flag_text(*item) for item in own.items())
        print(f"{args.env} trains with its own defaults: {flags}")
    env_kwargs = _env_kwargs(args.env_kwarg)
    try:
        env = envs.make(args.env, **env_kwargs)
    except (ValueError, TypeError, ImportError) as e:
        raise CLIError(f"{_given(args, ENV_FLAGS, '--env')}: {e}") from e
    run = {
        "env": args.env,
        # With the machine's choices (a Playground backend) pinned, so that
        # eval, record and --resume elsewhere build the same env.
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
        "lr_schedule": args.lr_schedule,
        "normalize_advantages": args.normalize_advantages,
        "entropy_weight": args.entropy_weight,
        "minibatches": args.minibatches,
        "epochs": args.epochs,
        "eval_every": args.eval_every,
        "episode_length": _episode_length(env),
    }
    run["eval_every"] = _eval_every(run)
    _check_network(args, run, env)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = args.out or pathlib.Path("runs") / f"{args.env.replace(':', '_')}-{stamp}"
    if out.exists() and not out.is_dir():
        raise CLIError(f"--out {out}: a file is there; pass a folder to write to.")
    if (out / "metrics.jsonl").exists():
        raise CLIError(
            f"{out} already holds a run; continue it with --resume {out}, or "
            "pass another --out."
        )
    return out, run


def _train(args: argparse.Namespace) -> int:
    resuming = args.resume is not None
    out, run = _resumed_run(args) if resuming else _new_run(args)
    env = _make_env(run)
    # Built, like the network checked above, before anything is written: bad
    # flags leave no folder behind.
    try:
        config = train_config(run, progress=not args.no_progress)
    except ValueError as e:
        raise CLIError(f"{_given(args, CONFIG_FLAGS, '--n-envs')}: {e}") from e

    def networks(key):
        return build_network(run, env, key)

    # A run killed before its first checkpoint starts over (it had trained
    # nothing); else it continues from its latest checkpoint, whose step its
    # logs already hold.
    latest = latest_checkpoint(out / "checkpoints") if resuming else None
    initial_state, logged = None, -1
    if latest is not None:
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
        logged = read_header(latest).step
    ppo = config.learner
    total = ppo.n_iterations * ppo.steps_per_iteration
    if logged >= total:
        print(
            f"{out} is already trained to {logged:,} steps; pass a larger --steps "
            "to continue."
        )
        return 0
    rounded = (
        f" (--steps {run['steps']:,} rounded up to whole iterations of "
        f"{ppo.n_envs} envs x {ppo.rollout_length} steps)"
        if total != run["steps"]
        else ""
    )
    print(
        f"training {run['env']} for {total:,} env steps{rounded}, "
        f"{run['seeds']} seed(s) -> {out}"
    )
    if resuming:
        print(
            f"resuming from {latest}" if latest else "no checkpoint yet: starting over"
        )
    try:
        return _run(out, run, env, networks, config, initial_state, logged, resuming)
    except FloatingPointError as e:
        raise CLIError(
            f"training stopped: {e} On the command line: start a new run with a "
            f"lower --lr than {run['lr']:g} (--resume keeps a run's settings); "
            f"{_kept(out)}"
        ) from e
    except (OSError, CheckpointError) as e:
        raise CLIError(
            f"writing {out} failed: {e} Fix: free space or fix the folder, then "
            f"continue with: eqx-ppo train --resume {out}; {_kept(out)}"
        ) from e


def _kept(out: pathlib.Path) -> str:
    """What a stopped run keeps, for its one-line error."""
    saved = list_checkpoints(out / "checkpoints")
    if not saved:
        return "it had saved no checkpoint yet."
    return f"its checkpoints up to {saved[-1].name} are kept."


def _run(out, run, env, networks, config, initial_state, logged, resuming) -> int:
    """Train, logging the steps after `logged`, and write the run folder."""
    # Written once the checkpoint loaded: a failed resume changes nothing.
    out.mkdir(parents=True, exist_ok=True)
    _write_json(out / "run.json", run)
    metrics_log = JSONLLogger(out / "metrics.jsonl", append=resuming)
    # Written as the evaluations run, so a killed run keeps its curve.
    eval_log = JSONLLogger(out / "eval.jsonl", append=resuming)
    for path in (metrics_log.path, eval_log.path):
        _drop_rows_after(path, logged)

    def log(metrics: dict[str, Any], step: int) -> None:
        if step <= logged:  # resumed at step 0, the driver evaluates it again
            return
        metrics_log(metrics, step)
        evals = {k: v for k, v in metrics.items() if k.startswith("eval/")}
        if evals:
            eval_log(evals, step)

    try:
        result = train(
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
        "eval_episodes": EVAL_ENVS,
    }
    _write_json(out / "summary.json", summary)
    _plot(history, out / "learning_curve.png", run)
    print(
        f"final eval return: {float(np.mean(final)):.3f}"
        + (f" (mean of {run['seeds']} seeds)" if run["seeds"] > 1 else "")
        + f", over {EVAL_ENVS} episodes"
    )
    print(f"wrote {out}/metrics.jsonl, learning_curve.png, summary.json, checkpoints/")
    return 0


def _drop_rows_after(path: pathlib.Path, step: int) -> None:
    """Cut a JSONL log back to its rows up to `step`: a run resumed from the
    checkpoint at `step` logs the later steps again."""
    lines = path.read_text().splitlines(keepends=True) if path.is_file() else []
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
    earlier = list_checkpoints(checkpoint.parent)
    earlier = earlier[: earlier.index(checkpoint)] if checkpoint in earlier else []
    return earlier[-1] if earlier else None


def _load_for_analysis(path: pathlib.Path, seed: int):
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
    run = _read_run(run_dir, "--checkpoint")
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
