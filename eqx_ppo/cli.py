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
from typing import Any

import jax
import numpy as np

from . import envs
from .logging import JSONLLogger, LoggingLevel
from .nn import make_lstm_actor_critic, make_mlp_actor_critic
from .ppo import EvalConfig, PPOConfig, TrainConfig, train_ppo

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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eqx-ppo", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="train a policy and write a run folder")
    train.add_argument(
        "--env",
        default=DEFAULT_ENV,
        help=f"built-in env ({', '.join(envs.registered_names())}) "
        "or brax:<name> / gymnax:<name>; default %(default)s",
    )
    train.add_argument("--steps", type=int, default=300_000, help="env steps")
    train.add_argument("--n-envs", type=int, default=128)
    train.add_argument("--rollout-length", type=int, default=20)
    train.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="train this many seeds in one vmapped program",
    )
    train.add_argument("--seed", type=int, default=0)
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
        metavar="LSTM_SIZE",
        help="use an LSTM policy with this many units",
    )
    train.add_argument("--lr", type=float, default=1e-3)
    train.add_argument("--entropy-weight", type=float, default=1e-2)
    train.add_argument("--minibatches", type=int, default=4)
    train.add_argument("--epochs", type=int, default=4)
    train.add_argument(
        "--eval-every",
        type=int,
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
        help="continue the run in this folder from its latest checkpoint",
    )
    train.add_argument("--no-progress", action="store_true")

    for name, text in (
        ("eval", "evaluate a checkpoint"),
        ("record", "record activations of a checkpoint"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument(
            "--checkpoint",
            type=pathlib.Path,
            required=True,
            help="a run folder or one checkpoint folder in it",
        )
        p.add_argument("--n-envs", type=int, default=16)
        p.add_argument("--episode-length", type=int, default=200)
        p.add_argument("--seed", type=int, default=0)
        if name == "record":
            p.add_argument(
                "--out",
                type=pathlib.Path,
                default=None,
                help="where to write activations.npz (default: run folder)",
            )
    return parser


def build_network(run: dict[str, Any], env: Any, key: jax.Array):
    """The network a run's `run.json` describes, freshly initialised with `key`."""
    obs_size = env.observation_size
    n_actions = getattr(env, "n_actions", None)
    discrete = n_actions is not None
    action_size = n_actions if discrete else env.action_size
    if run["recurrent"]:
        return make_lstm_actor_critic(
            obs_size,
            action_size,
            run["recurrent"],
            key=key,
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


def train_config(run: dict[str, Any], progress: bool) -> TrainConfig:
    """The `TrainConfig` a run's `run.json` describes."""
    eval_every = run["eval_every"] or max(1, run["steps"] // 10)
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


def _episode_length(env: Any) -> int:
    return int(getattr(env, "max_len", 0) or 1000)


def _train(args: argparse.Namespace) -> int:
    from .checkpoint import latest_checkpoint, load_checkpoint, make_checkpoint_fn

    if args.resume is not None:
        out = args.resume
        run = json.loads((out / "run.json").read_text())
        run["steps"] = max(run["steps"], args.steps)
        (out / "run.json").write_text(json.dumps(run, indent=2))
    else:
        env_probe = envs.make(args.env)
        run = {
            "env": args.env,
            "steps": args.steps,
            "n_envs": args.n_envs,
            "rollout_length": args.rollout_length,
            "seeds": args.seeds,
            "seed": args.seed,
            "hidden": list(args.hidden),
            "recurrent": args.recurrent,
            "lr": args.lr,
            "entropy_weight": args.entropy_weight,
            "minibatches": args.minibatches,
            "epochs": args.epochs,
            "eval_every": args.eval_every,
            "episode_length": _episode_length(env_probe),
        }
        stamp = time.strftime("%Y%m%d-%H%M%S")
        out = args.out or pathlib.Path("runs") / f"{args.env.replace(':', '_')}-{stamp}"
        out.mkdir(parents=True, exist_ok=True)
        (out / "run.json").write_text(json.dumps(run, indent=2))
    env = envs.make(run["env"])
    config = train_config(run, progress=not args.no_progress)

    def networks(key):
        return build_network(run, env, key)

    initial_state = None
    if args.resume is not None:
        latest = latest_checkpoint(out / "checkpoints")
        initial_state = load_checkpoint(
            latest, env=env, networks=networks, config=config
        )
        print(f"resuming from {latest}")
    metrics_log = JSONLLogger(out / "metrics.jsonl")
    print(
        f"training {run['env']} for {run['steps']:,} steps "
        f"({run['seeds']} seed(s), {run['n_envs']} envs) -> {out}"
    )
    result = train_ppo(
        env,
        networks,
        config,
        log_fn=metrics_log,
        checkpoint_fn=make_checkpoint_fn(out / "checkpoints", config, metadata=run),
        initial_state=initial_state,
    )
    if not result.eval_history:
        print(
            f"{out} is already trained to {result.total_steps:,} steps; "
            "pass a larger --steps to continue."
        )
        return 0
    eval_log = JSONLLogger(out / "eval.jsonl")
    for record in result.eval_history:
        eval_log({k: v for k, v in record.items() if k != "step"}, record["step"])
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
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    _plot(history, out / "learning_curve.png", run)
    print(
        f"final eval return: {float(np.mean(final)):.3f}"
        + (f" (mean of {run['seeds']} seeds)" if run["seeds"] > 1 else "")
    )
    print(f"wrote {out}/metrics.jsonl, learning_curve.png, summary.json, checkpoints/")
    return 0


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


def _load_for_analysis(path: pathlib.Path):
    from .checkpoint import latest_checkpoint, load_checkpoint

    run_dir = path if (path / "run.json").exists() else path.parent.parent
    run = json.loads((run_dir / "run.json").read_text())
    checkpoint = (
        latest_checkpoint(path / "checkpoints")
        if (path / "checkpoints").exists()
        else path
    )
    env = envs.make(run["env"])
    config = train_config(run, progress=False)
    state = load_checkpoint(
        checkpoint,
        env=env,
        networks=lambda k: build_network(run, env, k),
        config=config,
    )
    network = state.network
    if run["seeds"] > 1:
        network = jax.tree.map(
            lambda x: x[0] if isinstance(x, jax.Array) else x, network
        )
    return run_dir, run, env, network, checkpoint


def _eval(args: argparse.Namespace) -> int:
    import equinox as eqx

    from .ppo import eval_rollout

    _, run, env, network, checkpoint = _load_for_analysis(args.checkpoint)
    metrics = eqx.filter_jit(
        eval_rollout,
    )(
        env,
        eqx.nn.inference_mode(network),
        jax.random.key(args.seed),
        n_envs=args.n_envs,
        max_episode_length=args.episode_length,
        logging_percentiles=(0, 50, 100),
    )
    print(
        f"{checkpoint} ({run['env']}"
        + (f", seed 0 of {run['seeds']}" if run["seeds"] > 1 else "")
        + ")"
    )
    for k, v in sorted(metrics.items()):
        print(f"  {k}: {float(v):.4f}")
    return 0


def _record(args: argparse.Namespace) -> int:
    from .ppo import record_activations_rollout

    run_dir, run, env, network, _ = _load_for_analysis(args.checkpoint)
    activations, dones = record_activations_rollout(
        env,
        network,
        n_envs=args.n_envs,
        max_episode_length=args.episode_length,
        key=jax.random.key(args.seed),
    )
    flat = {
        "/".join(
            str(getattr(p, "key", getattr(p, "idx", p))) for p in path
        ): np.asarray(leaf)
        for path, leaf in jax.tree_util.tree_leaves_with_path(activations)
    }
    out = args.out or run_dir / "activations.npz"
    np.savez_compressed(out, dones=np.asarray(dones), **flat)
    print(
        f"recorded {len(flat)} layers over {args.episode_length} steps x "
        f"{args.n_envs} envs -> {out}"
    )
    for name, value in flat.items():
        print(f"  {name}: shape {value.shape}, peak |a| {np.abs(value).max():.3f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `eqx-ppo` console script."""
    args = _parser().parse_args(argv)
    commands = {"train": _train, "eval": _eval, "record": _record}
    return commands[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
