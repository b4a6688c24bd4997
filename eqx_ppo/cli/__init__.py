"""`eqx-ppo`: train, evaluate and record from the command line; the
getting-started guide lists the files of the run folder that `train` writes."""

import argparse
import json
import os
import pathlib
import sys
from typing import Any

import equinox as eqx
import jax
import numpy as np

from ..checkpoint import (
    CheckpointError,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    make_checkpoint_fn,
    read_header,
)
from ..logging import JSONLLogger, replace_file
from ..ppo import eval_rollout, record_activations_rollout, select_seed, train
from ._args import CONFIG_FLAGS, EVAL_ENVS, CLIError, _parser, default_compile_cache
from ._settings import (
    _make_env,
    _new_run,
    _read_run,
    _resumed_run,
    blamed_on,
    build_network,
    train_config,
)


def _train(args: argparse.Namespace) -> int:
    resuming = args.resume is not None
    out, run = _resumed_run(args) if resuming else _new_run(args)
    env = _make_env(run)
    # Built, like the network checked above, before anything is written: bad
    # flags leave no folder behind.
    with blamed_on(args, CONFIG_FLAGS, "--n-envs"):
        config = train_config(run, progress=not args.no_progress)

    # A run killed before its first checkpoint starts over (it had trained
    # nothing); else it continues from its latest checkpoint, whose step its
    # logs already hold.
    latest = latest_checkpoint(out / "checkpoints") if resuming else None
    initial_state, logged = None, -1
    if latest is not None:
        initial_state = _load(
            latest,
            run,
            env,
            config,
            f"--resume {out}",
            lambda previous: (
                f"\nTo resume from {previous.name}, move {latest} out "
                f"of {latest.parent}."
            ),
        )
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
    if jax.config.jax_enable_compilation_cache and jax.config.jax_compilation_cache_dir:
        print(f"compiled programs are cached in {jax.config.jax_compilation_cache_dir}")
    try:
        # Written once the checkpoint loaded: a failed resume changes nothing.
        out.mkdir(parents=True, exist_ok=True)
        replace_file(out / "run.json", json.dumps(run, indent=2))
        metrics_log = JSONLLogger(out / "metrics.jsonl", append=resuming)
        # Written as the evaluations run, so a killed run keeps its curve.
        eval_log = JSONLLogger(out / "eval.jsonl", append=resuming)
        # Cut back to the rows up to the checkpoint resumed from: the run logs
        # the later steps again.
        for path in (metrics_log.path, eval_log.path):
            lines = path.read_text().splitlines(keepends=True) if path.is_file() else []
            kept = [line for line in lines if json.loads(line)["step"] <= logged]
            if len(kept) < len(lines):
                replace_file(path, "".join(kept))

        def log(metrics: dict[str, Any], step: int) -> None:
            if step <= logged:  # resumed at step 0, the driver evaluates it again
                return
            metrics_log(metrics, step)
            evals = {k: v for k, v in metrics.items() if k.startswith("eval/")}
            if evals:
                eval_log(evals, step)

        save = make_checkpoint_fn(out / "checkpoints", config, metadata=run)
        try:
            result = train(
                env,
                lambda key: build_network(run, env, key),
                config,
                log_fn=log,
                checkpoint_fn=save,
                initial_state=initial_state,
            )
        except KeyboardInterrupt:
            print(
                f"\ninterrupted; continue from the last checkpoint with: eqx-ppo "
                f"train --resume {out}",
                file=sys.stderr,
            )
            return 130
        history = [json.loads(line) for line in eval_log.path.read_text().splitlines()]
        final = history[-1]["eval/episode_reward/mean"]
        summary = {
            "env": run["env"],
            "total_steps": result.total_steps,
            "final_eval_return": final,
            "final_eval_return_mean_over_seeds": float(np.mean(final)),
            "eval_episodes": EVAL_ENVS,
        }
        replace_file(out / "summary.json", json.dumps(summary, indent=2))
        _plot(history, out / "learning_curve.png", run)
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
    print(
        f"final eval return: {float(np.mean(final)):.3f}"
        + (f" (mean of {run['seeds']} seeds)" if run["seeds"] > 1 else "")
        + f", over {EVAL_ENVS} episodes"
    )
    print(f"wrote {out}/metrics.jsonl, learning_curve.png, summary.json, checkpoints/")
    return 0


def _kept(out: pathlib.Path) -> str:
    """What a stopped run keeps, for its one-line error."""
    saved = list_checkpoints(out / "checkpoints")
    if not saved:
        return "it had saved no checkpoint yet."
    return f"its checkpoints up to {saved[-1].name} are kept."


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
    seeds = returns.shape[1]
    fig, ax = plt.subplots(figsize=(6, 4))
    label = f"mean of {seeds} seeds" if seeds > 1 else "eval return"
    ax.plot(steps, returns.mean(axis=1), label=label)
    if seeds > 1:
        lo, hi = returns.min(axis=1), returns.max(axis=1)
        ax.fill_between(steps, lo, hi, alpha=0.3, label="min-max over seeds")
    ax.set(
        xlabel="env steps",
        ylabel="deterministic eval return",
        title=f"eqx_ppo on {run['env']}",
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _load(checkpoint, run, env, config, given: str, hint) -> Any:
    """The state saved at `checkpoint`, or a one-line error naming `given` and,
    with `hint(previous)`, the checkpoint saved before it (if any)."""
    try:
        return load_checkpoint(
            checkpoint,
            env=env,
            networks=lambda key: build_network(run, env, key),
            config=config,
        )
    except CheckpointError as e:
        earlier = list_checkpoints(checkpoint.parent)
        earlier = earlier[: earlier.index(checkpoint)] if checkpoint in earlier else []
        raise CLIError(f"{given}: {e}" + (hint(earlier[-1]) if earlier else "")) from e


def _load_for_analysis(args: argparse.Namespace):
    path, seed = args.checkpoint, args.seed
    if (path / "run.json").exists():
        run_dir = path
    elif path.name == "checkpoints" and (path.parent / "run.json").exists():
        run_dir = path.parent
    else:
        run_dir = path.parent.parent
    run = _read_run(
        run_dir,
        f"--checkpoint {path}",
        "a run folder, its checkpoints folder or a checkpoint inside it",
    )
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
    state = _load(
        checkpoint,
        run,
        env,
        train_config(run, progress=False),
        f"--checkpoint {path}",
        lambda previous: f"\nThe one before it: --checkpoint {previous}",
    )
    network = select_seed(state.network, seed) if run["seeds"] > 1 else state.network
    return run_dir, run, env, network, checkpoint


def _eval(args: argparse.Namespace) -> int:
    _, run, env, network, checkpoint = _load_for_analysis(args)
    metrics = eqx.filter_jit(eval_rollout)(
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
    run_dir, run, env, network, checkpoint = _load_for_analysis(args)
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


def _use_compile_cache(args: argparse.Namespace) -> None:
    """Point JAX's persistent compilation cache at `--compile-cache` (a folder
    set through JAX is kept unless the flag is given, and so is a minimum
    compile time set by `JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS`)."""
    if args.no_compile_cache:
        jax.config.update("jax_enable_compilation_cache", False)
        return
    if args.compile_cache is None and jax.config.jax_compilation_cache_dir:
        return
    folder = args.compile_cache or default_compile_cache()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CLIError(
            f"--compile-cache {folder}: cannot create it ({e}); pass a folder you "
            "can write, or --no-compile-cache."
        ) from e
    jax.config.update("jax_compilation_cache_dir", str(folder))
    # Training's programs take seconds to compile; its small ones (a reset, a
    # key split) are not worth a file each.
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `eqx-ppo` console script."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _parser().parse_args(argv)
    args.given = {a.split("=")[0] for a in argv[1:] if a.startswith("--")}
    commands = {"train": _train, "eval": _eval, "record": _record}
    try:
        _use_compile_cache(args)
        return commands[args.command](args)
    except CLIError as e:
        print(f"eqx-ppo {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
