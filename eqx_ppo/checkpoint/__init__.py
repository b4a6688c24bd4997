"""Checkpoints: save a training state, load it back exactly, resume.

A checkpoint is one folder `step_<step>/` of `state.eqx` (the arrays) and
`header.json` (what loading checks them against); the checkpointing guide says
what each holds. Config classes join with [`register_config`][], and a config
type's template builder with `register_template`.
"""

import dataclasses
import hashlib
import os
import pathlib
from collections.abc import Callable
from typing import Any

import equinox as eqx
from jaxtyping import Array, Int

from .._typecheck import check_range, checked
from ._codec import (
    CheckpointError as CheckpointError,
    config_differences,
    config_from_dict as config_from_dict,
    config_to_dict as config_to_dict,
    register_config as register_config,
)
from ._files import (
    HEADER,
    HEADER_SHA256,
    PREFIX,
    STATE,
    header_json,
    latest_checkpoint as latest_checkpoint,
    list_checkpoints as list_checkpoints,
    named_step,
    read_header_json,
    read_state,
    resolve,
    write_atomically,
)
from ._leaves import (
    check_saveable,
    check_structure,
    deserialise,
    serialise,
    spec_problem,
    structure,
)

FORMAT_VERSION = 1
"""The checkpoint layout version; a release that changes the layout bumps it."""

_KEEP_FIX = "pass the number of checkpoints to keep, or None to keep all."


@dataclasses.dataclass(frozen=True)
class CheckpointHeader:
    """What `header.json` of a checkpoint says (see [`read_header`][]).

    - `path`: the checkpoint folder.
    - `step`: the env step the state was saved at.
    - `config`: the saved config, rebuilt (a teacher as its fingerprint), or `None`.
    - `metadata`: the JSON `metadata` given to `save_checkpoint`.
    - `library_version`, `format_version`: who wrote it.
    - `leaves`: per leaf, `path` and `shape` + `dtype` (+ `key_impl`) or `type`.
    - `treedef`: the pytree definition, memory addresses removed.
    - `state_bytes`, `state_sha256`: size and checksum of `state.eqx`.
    """

    path: pathlib.Path
    step: int
    config: Any
    metadata: dict[str, Any]
    library_version: str
    format_version: int
    leaves: tuple[dict[str, Any], ...]
    treedef: str
    state_bytes: int
    state_sha256: str


def _library_version() -> str:
    import eqx_ppo

    return eqx_ppo.__version__


@checked
def save_checkpoint(
    directory: str | os.PathLike,
    state: Any,
    *,
    config: Any,
    step: int | Int[Array, ""],
    keep: int | None = None,
    metadata: dict[str, Any] | None = None,
) -> pathlib.Path:
    """Write `state` to `directory/step_<step>/` atomically, replacing any
    checkpoint of that step; returns that folder.

    **Arguments:**

    - `directory`: the folder of checkpoints (created if missing).
    - `state`: a `TrainingState` (or any pytree of arrays).
    - `config`: the run's config (a `TrainConfig`), or `None` to save none.
    - `step`: the env step, used in the folder name.
    - `keep`: keep only the newest `keep` checkpoints up to `step`; `None`: all.
    - `metadata`: JSON information (how to rebuild the network), for [`read_header`][].
    """
    check_range("save_checkpoint(keep=", keep, 1, fix=_KEEP_FIX)
    step = int(step)
    check_range("save_checkpoint(step=", step, 0, fix="pass `int(state.steps)`.")
    check_saveable(state)
    leaves, treedef = structure(state, saved=True)
    data = serialise(state)
    header = {
        "format_version": FORMAT_VERSION,
        "library_version": _library_version(),
        "step": step,
        "config": None if config is None else config_to_dict(config),
        "metadata": {} if metadata is None else metadata,
        "leaves": leaves,
        "treedef": treedef,
        "state_bytes": len(data),
        "state_sha256": hashlib.sha256(data).hexdigest(),
    }
    try:  # fail before writing anything
        files = {STATE: data, HEADER: header_json(header)}
    except (TypeError, ValueError) as e:
        raise TypeError(
            f"save_checkpoint(metadata=...): {e}. Use plain Python values (int, "
            "float, str, bool, None, lists and str-keyed dicts): e.g. `int(x)` "
            "for a NumPy or JAX scalar."
        ) from None
    return write_atomically(pathlib.Path(directory), step, files, keep=keep)


@checked
def make_checkpoint_fn(
    directory: str | os.PathLike,
    config: Any,
    *,
    keep: int | None = 3,
    metadata: dict[str, Any] | None = None,
) -> Callable[[Any, int], None]:
    """A `checkpoint_fn` for [`eqx_ppo.train`][] that saves every call to
    `directory` with [`save_checkpoint`][], keeping the newest `keep`."""
    check_range("make_checkpoint_fn(keep=", keep, 1, fix=_KEEP_FIX)

    def checkpoint_fn(state: Any, step: int) -> None:
        save_checkpoint(
            directory, state, config=config, step=step, keep=keep, metadata=metadata
        )

    return checkpoint_fn


_HEADER_FIELDS = {
    "format_version": int,
    "library_version": str,
    "step": int,
    "config": dict | None,
    "metadata": dict,
    "leaves": list,
    "treedef": str,
    "state_bytes": int,
    "state_sha256": str,
    HEADER_SHA256: str,
}


def _header_problem(raw: dict[str, Any]) -> str | None:
    """What is wrong with `raw`, a header's JSON object, or `None`."""
    for name, kind in _HEADER_FIELDS.items():
        if name not in raw:
            return f"field `{name}` is missing"
        if not isinstance(raw[name], kind) or (
            kind is int and isinstance(raw[name], bool)
        ):
            return f"field `{name}` has the wrong type ({type(raw[name]).__name__})"
    for i, spec in enumerate(raw["leaves"]):
        problem = spec_problem(spec)
        if problem is not None:
            return f"field `leaves[{i}]` {problem}"
    return None


@checked
def read_header(path: str | os.PathLike | None) -> CheckpointHeader:
    """The header of the checkpoint at `path` (a checkpoint folder, or a folder
    of checkpoints: the latest), with the config rebuilt. A header changed
    after saving, or in the `step_*` folder of another step, is refused.
    """
    path = resolve(path)
    raw = read_header_json(path)
    problem = _header_problem(raw)
    if problem is not None:
        raise CheckpointError(f"{path / HEADER}: {problem}; it is malformed.")
    written_by, ours = raw["library_version"], _library_version()
    if raw["format_version"] > FORMAT_VERSION:
        raise CheckpointError(
            f"{path} has checkpoint format {raw['format_version']}; this eqx_ppo "
            f"({ours}) reads formats up to {FORMAT_VERSION}. "
            f"Upgrade eqx_ppo (the checkpoint was written by {written_by})."
        )
    if written_by.split(".")[0] != ours.split(".")[0]:
        raise CheckpointError(
            f"{path} was written by eqx_ppo {written_by}; this is eqx_ppo {ours}, a "
            "different major version whose states are not compatible. Load it "
            f"with eqx_ppo {written_by.split('.')[0]}.x."
        )
    named = named_step(path)
    if named is not None and named != raw["step"]:
        raise CheckpointError(
            f"{path} holds the checkpoint of step {raw['step']} (field `step` of "
            f"its {HEADER}), not of step {named}: its files were copied or "
            f"renamed from another folder. Fix: load the folder of step "
            f"{raw['step']}, or move these files to {PREFIX}{raw['step']:09d}."
        )
    try:
        config = None if raw["config"] is None else config_from_dict(raw["config"])
    except CheckpointError as e:
        raise CheckpointError(f"{path / HEADER}: {e}") from e
    saved = {f.name: raw.get(f.name) for f in dataclasses.fields(CheckpointHeader)}
    return CheckpointHeader(
        **{**saved, "path": path, "config": config, "leaves": tuple(raw["leaves"])}
    )


_TEMPLATES: dict[type, Callable[[Any, Any, Any], Any]] = {}


def register_template(config_type: type, build: Callable[[Any, Any, Any], Any]) -> None:
    """Let `load_checkpoint(env=..., networks=...)` build the template of a
    checkpoint saved with a `config_type` config, as `build(env, networks,
    config)`."""
    _TEMPLATES[config_type] = build


def _template(
    header: CheckpointHeader, like: Any, env: Any, networks: Any, config: Any
) -> Any:
    by_like = like is not None and env is None and networks is None
    if not by_like and (like is not None or env is None or networks is None):
        raise TypeError(
            "load_checkpoint: pass either `like=` (a template state, or a "
            "function config -> state) or both `env=` and `networks=` (PPO)."
        )
    if by_like and (not callable(like) or isinstance(like, eqx.Module)):
        return like
    # The given config, when there is one: it may hold what the header keeps
    # only a fingerprint of (a distillation teacher).
    config = header.config if config is None else config
    if config is None:
        raise CheckpointError(
            f"{header.path} saved no config, so the template cannot be built from "
            "it: pass a template state as `like=`."
        )
    if by_like:
        return eqx.filter_eval_shape(like, config)
    build = _TEMPLATES.get(type(config))
    if build is None:
        raise TypeError(
            f"load_checkpoint: `env=` / `networks=` cannot build the template of "
            f"a checkpoint saved with a {type(config).__name__}; pass `like=` (a "
            "template state, or a function config -> state)."
        )
    return eqx.filter_eval_shape(build, env, networks, config)


@checked
def load_checkpoint(
    path: str | os.PathLike | None,
    *,
    like: Any = None,
    env: Any = None,
    networks: Any = None,
    config: Any = None,
) -> Any:
    """The state saved at `path`, checked against a template built from `like`,
    or from `env` and `networks`; either the whole state or a
    [`CheckpointError`][] saying what differs.

    **Arguments:**

    - `path`: a checkpoint folder, or a folder of checkpoints (the latest).
    - `like`: a template state, or a function `config -> state` (shapes only).
    - `env`, `networks`: instead of `like`, as given to [`eqx_ppo.train`][].
    - `config`: the `TrainConfig` you will resume with; one that changes the
      optimisation is refused (required for a distillation checkpoint).
    """
    header = read_header(path)
    if config is not None and header.config is not None:
        diffs = config_differences(header.config, config)
        if diffs:
            raise CheckpointError(
                f"{header.path}: the given config differs from the saved one in "
                "fields that change the optimisation:\n  "
                + "\n  ".join(diffs)
                + "\nFix: resume with read_header(path).config, or load without "
                "`config=` if the change is intended."
            )
    template = _template(header, like, env, networks, config)
    check_structure(header.path, header.leaves, header.treedef, template)
    data = read_state(header.path, header.state_bytes, header.state_sha256)
    return deserialise(header.path / STATE, data, template, header.leaves)
