"""A run folder's settings (`run.json`): read, checked and turned into the
env, the network and the `TrainConfig` they describe."""

import argparse
import contextlib
import json
import pathlib
import time
from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax

from .. import envs
from ..envs._registry import pinned_kwargs
from ..logging import LoggingLevel
from ..nn import make_mlp_actor_critic, make_recurrent_actor_critic
from ..nn._recurrent_factories import default_lru_state_size
from ..ppo import PPO, EvalConfig, TrainConfig
from ._args import (
    ENV_DEFAULTS,
    EVAL_ENVS,
    RESUMABLE_FLAGS,
    RUN_KEYS,
    CLIError,
    _env_kwargs,
    _flag_text,
)


def build_network(run: dict[str, Any], env: Any, key: jax.Array):
    """The network a run's `run.json` describes, freshly initialised with `key`."""
    n_actions = getattr(env, "n_actions", None)
    discrete = n_actions is not None
    sizes = (env.observation_size, n_actions if discrete else env.action_size)
    common = dict(key=key, entropy_weight=run["entropy_weight"], discrete=discrete)
    if run["recurrent"]:
        return make_recurrent_actor_critic(
            *sizes,
            run["recurrent"],
            cell=run["cell"],
            lru_state_size=run["lru_state_size"],
            actor_hidden_sizes=run["hidden"],
            critic_hidden_sizes=run["hidden"],
            **common,
        )
    return make_mlp_actor_critic(*sizes, run["hidden"], run["hidden"], **common)


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


def _read_run(folder: pathlib.Path, given: str, wanted: str) -> dict[str, Any]:
    """The settings in `folder/run.json`, or a one-line error that names the
    flag as `given` and says what it wants."""
    file = folder / "run.json"
    if not file.is_file():
        raise CLIError(f"{given}: no run.json there; not {wanted}.")
    try:
        run = json.loads(file.read_text())
        missing = sorted(set(RUN_KEYS) - run.keys()) if isinstance(run, dict) else None
        problem = "is not a JSON object" if missing is None else f"lacks {missing}"
    except (OSError, ValueError) as e:
        missing, problem = None, f"cannot be read ({type(e).__name__}: {e})"
    if missing != []:
        raise CLIError(
            f"{given}: {file} {problem}, so the run cannot be rebuilt "
            "(eqx-ppo writes it whole: it was edited or damaged). Fix: restore it; "
            "every checkpoint's header keeps a copy, eqx_ppo.read_header("
            f"'{folder / 'checkpoints'}').metadata."
        )
    return run


@contextlib.contextmanager
def blamed_on(
    args: argparse.Namespace,
    flags: Sequence[str],
    fallback: str,
    errors: tuple[type[Exception], ...] = (ValueError,),
):
    """Turn `errors` raised inside into a one-line `CLIError` that starts with
    those of `flags` the command line gave (else `fallback`), as typed."""
    try:
        yield
    except errors as e:
        named = []
        for flag in [f for f in flags if f in args.given] or [fallback]:
            value = getattr(args, flag[2:].replace("-", "_"))
            for v in value if isinstance(value, list) else [value]:  # repeatable
                text = ",".join(map(str, v)) if isinstance(v, tuple) else v
                named.append(f"{flag} {text}")
        raise CLIError(f"{' '.join(named)}: {e}") from e


def _resumed_run(args: argparse.Namespace) -> tuple[pathlib.Path, dict[str, Any]]:
    """The folder and settings of the run `--resume` continues."""
    out = args.resume
    refused = sorted(args.given - RESUMABLE_FLAGS)
    if refused:
        raise CLIError(
            f"--resume {out}: {', '.join(refused)} cannot change a run (its "
            "settings are in run.json); drop them, or start a new run with --out."
        )
    run = _read_run(out, f"--resume {out}", "a run folder")
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
    with blamed_on(
        args, ("--env", "--env-kwarg"), "--env", (ValueError, TypeError, ImportError)
    ):
        env = envs.make(args.env, **env_kwargs)
    run = {key: getattr(args, key, None) for key in RUN_KEYS}
    run.update(
        # With the machine's choices (a Playground backend) pinned, so that
        # eval, record and --resume elsewhere build the same env.
        env_kwargs=pinned_kwargs(args.env, env_kwargs),
        hidden=list(args.hidden),
        # Saved, so that a later default cannot change this run's shapes.
        lru_state_size=default_lru_state_size(args.recurrent)
        if args.cell == "lru" and args.recurrent
        else None,
        # The evaluation (and checkpoint) spacing, fixed for the run.
        eval_every=args.eval_every or max(1, args.steps // 10),
        episode_length=int(getattr(env, "max_len", 0) or 1000),
    )
    # Built abstractly, so that a bad network flag is one line and no folder.
    network_flags = ("--hidden", "--recurrent", "--cell", "--entropy-weight")
    with blamed_on(args, network_flags, "--env"):
        eqx.filter_eval_shape(build_network, run, env, jax.random.key(0))
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
