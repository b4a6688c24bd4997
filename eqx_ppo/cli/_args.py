"""The `eqx-ppo` command line: its flags, their defaults and the parser."""

import argparse
import json
import os
import pathlib
from collections.abc import Sequence
from typing import Any, get_args

from .. import envs
from ..nn._recurrent_factories import Cell

EVAL_ENVS = 32
"""Episodes of an evaluation: training's (and so `summary.json`'s) and, by
default, `eqx-ppo eval`'s."""

ENV_DEFAULTS: dict[str, dict[str, Any]] = {
    # With advantage normalisation a solved seed can fall (the FAQ's "Why did
    # my run collapse?"); the getting-started guide gives the measurements.
    "gymnax:CartPole-v1": {
        "--steps": 500_000,
        "--lr": 3e-3,
        "--lr-schedule": "linear",
        "--normalize-advantages": False,
    },
}
"""Per-env defaults of `train`, for envs that the flags' defaults do not solve;
a flag given on the command line wins."""

RESUMABLE_FLAGS = frozenset(
    {"--resume", "--steps", "--no-progress", "--compile-cache", "--no-compile-cache"}
)
"""The `train` flags a resumed run honours; the run's `run.json` fixes the rest."""

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

RUN_KEYS = (
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
)
"""The settings a run folder's `run.json` holds, in its order."""


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


_COUNT = {"type": _count}
_PATH = {"type": pathlib.Path}

_TRAIN_FLAGS: tuple[tuple[str, Any, str, dict[str, Any]], ...] = (
    # (flag, default, help, argparse's other keywords)
    (
        "--env",
        "move_to_center",
        f"built-in env ({', '.join(envs.registered_names())}) or "
        "brax:<name> / playground:<name> / gymnax:<name> / popgym_arcade:<name> "
        "(each needs its extra)",
        {},
    ),
    (
        "--env-kwarg",
        [],
        "an option for the env, repeatable; VALUE is read as JSON if it "
        "parses, else as a string: backend=spring for brax:inverted_pendulum, "
        'env_params=\'{"gravity": 9.8, "masscart": 1.0}\' for gymnax:CartPole-v1',
        {"type": _env_kwarg, "action": "append", "metavar": "NAME=VALUE"},
    ),
    (
        "--steps",
        300_000,
        "env steps in all, rounded up to whole iterations of n-envs x "
        "rollout-length steps (with --resume: the new total, more or fewer than "
        "the run's)",
        _COUNT,
    ),
    ("--n-envs", 128, "parallel envs", _COUNT),
    ("--rollout-length", 20, "steps per env per iteration", _COUNT),
    ("--seeds", 1, "train this many seeds in one vmapped program", _COUNT),
    ("--seed", 0, "the first seed", {"type": int}),
    (
        "--hidden",
        "32,32",
        "hidden sizes of actor and critic, e.g. 64,64",
        {"type": _sizes},
    ),
    (
        "--recurrent",
        0,
        "use a recurrent policy with this many units (the cell: --cell)",
        {"type": int, "metavar": "SIZE"},
    ),
    ("--cell", "lstm", "recurrent cell of --recurrent", {"choices": get_args(Cell)}),
    ("--lr", 1e-3, "learning rate", {"type": float}),
    (
        "--lr-schedule",
        "constant",
        "the learning rate's decay to 0 over --steps (a decaying run's --steps "
        "cannot change on --resume)",
        {"choices": ("constant", "linear", "cosine")},
    ),
    (
        "--normalize-advantages",
        True,
        "standardise advantages per minibatch (on by default); turn it off for "
        "tasks whose episodes all reach the time limit once solved",
        {"action": argparse.BooleanOptionalAction},
    ),
    ("--entropy-weight", 1e-2, "entropy bonus weight", {"type": float}),
    ("--minibatches", 4, "minibatches per epoch", _COUNT),
    ("--epochs", 4, "epochs per iteration", _COUNT),
    (
        "--eval-every",
        None,
        "env steps between evaluations and checkpoints (default: steps/10)",
        _COUNT,
    ),
    ("--out", None, "run folder (default runs/<env>-<time>)", _PATH),
    (
        "--resume",
        None,
        "continue the run in this folder from its latest checkpoint (a run killed "
        "before its first checkpoint starts over); only --steps and --no-progress "
        "may be given with it",
        _PATH,
    ),
    ("--no-progress", False, "no progress bar", {"action": "store_true"}),
)
"""`train`'s flags, in `--help`'s order."""


class _Defaults(argparse.ArgumentDefaultsHelpFormatter):
    """`--help` with every default, except `None` and on/off switches."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or isinstance(action.default, bool):
            return action.help
        return super()._get_help_string(action)


def _parser() -> argparse.ArgumentParser:
    # No abbreviated flags: `--resume` checks the flags given by their names.
    parser = argparse.ArgumentParser(
        prog="eqx-ppo",
        description="train, evaluate and record from the command line",
        allow_abbrev=False,
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
    for flag, default, text, kwargs in _TRAIN_FLAGS:
        train.add_argument(flag, default=default, help=text, **kwargs)
    _add_cache_flags(train)

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
                help="the .npz file to write (default: "
                "RUN/activations_<checkpoint>_seed<seed>.npz)",
            )
        _add_cache_flags(p)
    return parser


def default_compile_cache() -> pathlib.Path:
    """`$XDG_CACHE_HOME/eqx_ppo/jax`, by default `~/.cache/eqx_ppo/jax`."""
    root = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(root) / "eqx_ppo" / "jax"


def _add_cache_flags(parser: argparse.ArgumentParser) -> None:
    cache = parser.add_mutually_exclusive_group()
    cache.add_argument(
        "--compile-cache",
        type=pathlib.Path,
        metavar="DIR",
        help="keep compiled programs here, so that a later run of the same "
        "programs skips most of its compile time (JAX's persistent compilation "
        f"cache; default: {default_compile_cache()}, or JAX's own cache folder "
        "if you set one)",
    )
    cache.add_argument(
        "--no-compile-cache",
        action="store_true",
        help="compile everything afresh and write no compiled programs",
    )
