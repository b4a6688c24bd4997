"""Checkpoints: save a training state, load it back exactly, resume.

A checkpoint is one folder `step_<step, 9 digits>/` holding

- `state.eqx`: every array leaf of the state, written with
  `eqx.tree_serialise_leaves` (NumPy `.npy` records, no pickle). PRNG keys are
  stored as their raw key data (`jax.random.key_data`) and wrapped back, with
  the saved key implementation, on load.
- `header.json`: the format and library versions, the step, the configuration
  as JSON, your `metadata`, the size and SHA-256 of `state.eqx`, and a
  structure summary of the state (every leaf's path, shape and dtype, and the
  pytree definition, which includes static fields such as layer sizes).

**What is saved.** Everything in a [`eqx_ppo.TrainingState`][] or
[`eqx_ppo.DistillationState`][] that is an array: parameters, optimiser
state (the optimiser itself is rebuilt from the config, see below),
normaliser statistics, network carries, env states, the key and the
counters. Built-in envs, Brax and MuJoCo Playground keep their whole state
(physics included) in arrays, so it is all saved and a resumed run continues
bit-identically on the same device type. A non-array leaf of an env state
(rare: a Python object in `info`) is not saved; it comes back as it is in the
template. Arrays are gathered to the host (a sharded run hands its
`checkpoint_fn` the state gathered onto one device), so a checkpoint loads on
any device count; states larger than one host's memory would need Orbax.

**Atomic writes.** A checkpoint is written into a temporary folder next to
the final one and renamed into place when complete, so a process killed
mid-save leaves every earlier checkpoint whole; [`latest_checkpoint`][] only
sees complete ones, and leftovers are removed by the next save. Retention
(`keep`) deletes old checkpoints only after the new one is in place. One
writer per directory.

**Loading** needs a *template* with the state's structure: pass
`like=lambda config: eqx_ppo.ppo.init_state(env, networks, config)` (or the
shortcut `env=..., networks=...`); it is called with the saved config and
evaluated for shapes only, so nothing is allocated. Loading checks the
header, the versions, the structure against the template, and the file's
size and checksum before reading, and either returns the whole state or
raises a [`CheckpointError`][] that says what differs; it never returns part
of a state.

**Resuming.** The optimiser (learning rate, schedule, clipping) is rebuilt
from the config passed to `train_ppo`, so resume with the saved config:

```python
config = eqx_ppo.read_header(path).config
state = eqx_ppo.load_checkpoint(path, env=env, networks=networks)
eqx_ppo.train_ppo(env, networks, config, initial_state=state)
```

or pass your config as `load_checkpoint(..., config=config)` and it is
checked against the saved one (a [`CheckpointError`][] names every field that
would change the optimisation; raising `total_steps` is allowed with a
constant learning rate).
"""

import dataclasses
import hashlib
import json
import os
import pathlib
import re
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import numpy as np

from .distill import DistillationConfig, DistillationTrainConfig
from .logging import LoggingLevel
from .ppo._config import EvalConfig, PPOConfig, TrainConfig, VideoConfig

FORMAT_VERSION = 1
"""The checkpoint layout version; bumped when the layout changes."""

_STATE = "state.eqx"
_HEADER = "header.json"
_PREFIX = "step_"
_TMP = ".tmp-"
_TRASH = ".trash-"
_CONFIG_CLASSES = {
    cls.__name__: cls
    for cls in (
        TrainConfig,
        PPOConfig,
        EvalConfig,
        VideoConfig,
        DistillationTrainConfig,
        DistillationConfig,
    )
}
# Fields that do not change the optimisation, so a resumed run may change them.
_FREE_FIELDS = frozenset({"logging_level", "logging_percentiles", "check_finite"})


class CheckpointError(ValueError):
    """A checkpoint is missing, incomplete, corrupted or does not match."""


@dataclasses.dataclass(frozen=True)
class CheckpointHeader:
    """What `header.json` of a checkpoint says (see [`read_header`][]).

    **Fields:**

    - `path`: the checkpoint folder.
    - `step`: the env step the state was saved at.
    - `config`: the saved configuration, rebuilt (`TrainConfig`,
      `DistillationTrainConfig`, ...), or `None` if none was saved.
    - `metadata`: the JSON `metadata` given to `save_checkpoint`.
    - `library_version`, `format_version`: who wrote it.
    - `leaves`: one dict per leaf: `path`, and `shape` + `dtype` (arrays, with
      `key_impl` for PRNG keys) or `type` (Python scalars and other leaves).
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


def config_to_dict(config: Any) -> dict[str, Any]:
    """A JSON-ready dict of a config (`TrainConfig`, `PPOConfig`, `EvalConfig`,
    `VideoConfig`, `DistillationTrainConfig`, `DistillationConfig`), tagged
    with its class name under `"_type"`; [`config_from_dict`][] inverts it.

    Coefficient arrays become floats (float32 values round-trip exactly);
    `LoggingLevel` flags become a list of flag names.
    """
    if type(config).__name__ not in _CONFIG_CLASSES:
        raise TypeError(
            f"config_to_dict: expected one of {sorted(_CONFIG_CLASSES)}, got "
            f"{type(config).__name__}."
        )
    return _encode(config, type(config).__name__)


def _encode(value: Any, where: str) -> Any:
    if type(value).__name__ in _CONFIG_CLASSES:
        out: dict[str, Any] = {"_type": type(value).__name__}
        for field in dataclasses.fields(value):
            out[field.name] = _encode(
                getattr(value, field.name), f"{where}.{field.name}"
            )
        return out
    if isinstance(value, LoggingLevel):
        return {"_type": "LoggingLevel", "flags": [f.name for f in value]}
    if isinstance(value, jax.Array | np.ndarray | np.generic):
        if np.ndim(value) != 0 or isinstance(value, jax.core.Tracer):
            raise TypeError(
                f"config_to_dict: {where} is an array of shape {np.shape(value)}; "
                "only concrete scalars can be saved (save one config per vmapped "
                "value)."
            )
        return float(value) if np.issubdtype(value.dtype, np.inexact) else int(value)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, tuple | list):
        return [_encode(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _encode(v, f"{where}[{k!r}]") for k, v in value.items()}
    raise TypeError(
        f"config_to_dict: {where} = {value!r} ({type(value).__name__}) is not "
        "JSON-serialisable; use numbers, strings, lists and str-keyed dicts."
    )


def config_from_dict(data: dict[str, Any]) -> Any:
    """The config that [`config_to_dict`][] turned into `data`.

    Fields missing from `data` take their defaults; unknown fields raise.
    """
    return _decode(data)


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_decode(v) for v in value)
    if not isinstance(value, dict):
        return value
    kind = value.get("_type")
    if kind == "LoggingLevel":
        level = LoggingLevel.NONE
        for name in value["flags"]:
            level |= LoggingLevel[name]
        return level
    fields = {k: _decode(v) for k, v in value.items() if k != "_type"}
    if kind is None:
        return fields
    if kind not in _CONFIG_CLASSES:
        raise CheckpointError(f"Unknown config type {kind!r} in checkpoint header.")
    cls = _CONFIG_CLASSES[kind]
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise CheckpointError(
            f"The saved {kind} has fields {unknown} this version of eqx_ppo does "
            "not know; it was written by a newer version."
        )
    if kind == "VideoConfig" and "render_kwargs" in fields:
        fields["render_kwargs"] = dict(fields["render_kwargs"])
    return cls(**fields)


def _is_key(x: Any) -> bool:
    return hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _leaf_spec(path: tuple, x: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"path": jax.tree_util.keystr(path)}
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        spec["shape"] = list(x.shape)
        spec["dtype"] = str(x.dtype)
    else:
        spec["type"] = type(x).__name__
    return spec


def _structure(tree: Any) -> tuple[list[dict[str, Any]], str]:
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
    leaves = [_leaf_spec(path, x) for path, x in flat]
    # Static fields holding functions print their address, which differs
    # between processes; the rest of the definition is stable.
    return leaves, re.sub(r" at 0x[0-9a-fA-F]+", "", str(treedef))


def _with_key_data(tree: Any) -> Any:
    return jax.tree.map(lambda x: jax.random.key_data(x) if _is_key(x) else x, tree)


class _HashingWriter:
    """A binary file wrapper that hashes and counts what goes through it."""

    def __init__(self, file):
        self.file = file
        self.sha256 = hashlib.sha256()
        self.size = 0

    def write(self, data) -> int:
        data = bytes(data)
        self.sha256.update(data)
        self.size += len(data)
        return self.file.write(data)


def _fsync_dir(path: pathlib.Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_state(folder: pathlib.Path, state: Any) -> tuple[int, str]:
    with open(folder / _STATE, "wb") as f:
        writer = _HashingWriter(f)
        eqx.tree_serialise_leaves(writer, _with_key_data(state))
        f.flush()
        os.fsync(f.fileno())
    return writer.size, writer.sha256.hexdigest()


def _write_header(folder: pathlib.Path, header: dict[str, Any]) -> None:
    with open(folder / _HEADER, "w") as f:
        json.dump(header, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def _step_of(path: pathlib.Path) -> int | None:
    name = path.name
    if not name.startswith(_PREFIX) or not name[len(_PREFIX) :].isdigit():
        return None
    return int(name[len(_PREFIX) :])


def list_checkpoints(directory: str | os.PathLike) -> list[pathlib.Path]:
    """The complete checkpoints in `directory`, oldest step first.

    Complete means a `step_*` folder with a `header.json` (written last).
    """
    directory = pathlib.Path(directory)
    if not directory.is_dir():
        return []
    found = [
        (step, p)
        for p in directory.iterdir()
        if (step := _step_of(p)) is not None and (p / _HEADER).is_file()
    ]
    return [p for _, p in sorted(found)]


def latest_checkpoint(directory: str | os.PathLike) -> pathlib.Path | None:
    """The complete checkpoint with the highest step in `directory`, or `None`."""
    found = list_checkpoints(directory)
    return found[-1] if found else None


def _remove(path: pathlib.Path) -> None:
    # Rename first, so a crash mid-delete never leaves a half-deleted
    # `step_*` folder that looks like a checkpoint.
    trash = path.with_name(f"{_TRASH}{path.name}-{os.getpid()}")
    os.replace(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def _remove_leftovers(directory: pathlib.Path) -> None:
    for p in directory.iterdir():
        if p.name.startswith((_TMP, _TRASH)) and p.is_dir():
            shutil.rmtree(p, ignore_errors=True)


def save_checkpoint(
    directory: str | os.PathLike,
    state: Any,
    *,
    config: Any,
    step: int,
    keep: int | None = None,
    metadata: dict[str, Any] | None = None,
) -> pathlib.Path:
    """Write `state` to `directory/step_<step>/` atomically; returns that folder.

    **Arguments:**

    - `directory`: the folder of checkpoints (created if missing).
    - `state`: a `TrainingState` or `DistillationState` (or any pytree of
      arrays), single- or multi-seed.
    - `config`: the run's config (`TrainConfig`, `DistillationTrainConfig`),
      saved as JSON; `None` to save none.
    - `step`: the env step, used in the folder name.
    - `keep`: keep only the newest `keep` checkpoints (by step); `None` keeps
      all. Older ones are deleted after the new one is complete.
    - `metadata`: extra JSON-serialisable information (e.g. how to rebuild the
      network), returned by [`read_header`][].

    A checkpoint already saved at `step` is replaced.
    """
    if keep is not None and keep < 1:
        raise ValueError(f"save_checkpoint(keep={keep}): must be >= 1 or None.")
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    leaves, treedef = _structure(state)
    for spec, x in zip(leaves, jax.tree.leaves(state), strict=True):
        if _is_key(x):
            spec["key_impl"] = str(jax.random.key_impl(x))
    header = {
        "format_version": FORMAT_VERSION,
        "library_version": _library_version(),
        "step": int(step),
        "config": None if config is None else config_to_dict(config),
        "metadata": {} if metadata is None else metadata,
        "leaves": leaves,
        "treedef": treedef,
    }
    json.dumps(header["metadata"])  # fail before writing anything
    final = directory / f"{_PREFIX}{int(step):09d}"
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f"{_TMP}{final.name}-", dir=directory))
    try:
        header["state_bytes"], header["state_sha256"] = _write_state(tmp, state)
        _write_header(tmp, header)
        _fsync_dir(tmp)
        if final.exists():
            _remove(final)
        os.replace(tmp, final)
        _fsync_dir(directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _remove_leftovers(directory)
    if keep is not None:
        for old in list_checkpoints(directory)[:-keep]:
            _remove(old)
    return final


def make_checkpoint_fn(
    directory: str | os.PathLike,
    config: Any,
    *,
    keep: int | None = 3,
    metadata: dict[str, Any] | None = None,
) -> Callable[[Any, int], None]:
    """A `checkpoint_fn` for `train_ppo` / `train_distillation` that saves every
    call to `directory` with [`save_checkpoint`][], keeping the newest `keep`.

    ```python
    eqx_ppo.train_ppo(env, networks, config,
                      checkpoint_fn=eqx_ppo.make_checkpoint_fn("run/ckpt", config))
    ```
    """

    def checkpoint_fn(state: Any, step: int) -> None:
        save_checkpoint(
            directory, state, config=config, step=step, keep=keep, metadata=metadata
        )

    return checkpoint_fn


def _resolve(path: str | os.PathLike) -> pathlib.Path:
    path = pathlib.Path(path)
    if (path / _HEADER).is_file():
        return path
    if _step_of(path) is not None and path.is_dir():
        raise CheckpointError(
            f"{path} has no {_HEADER}: it is not a complete checkpoint (was a save "
            "interrupted?). Use an earlier checkpoint in the same folder."
        )
    latest = latest_checkpoint(path)
    if latest is None:
        raise CheckpointError(
            f"No checkpoint at {path}: expected a checkpoint folder (with "
            f"{_HEADER}) or a folder of `{_PREFIX}*` checkpoints."
        )
    return latest


def read_header(path: str | os.PathLike) -> CheckpointHeader:
    """The header of the checkpoint at `path` (a checkpoint folder, or a folder
    of checkpoints: the latest is read), with the config rebuilt.

    Use it to rebuild what loading needs: `read_header(path).config` is the
    run's config, `.metadata` what the run stored (e.g. network sizes).
    """
    path = _resolve(path)
    try:
        raw = json.loads((path / _HEADER).read_text())
        fields = {
            "step": int(raw["step"]),
            "metadata": raw["metadata"],
            "library_version": str(raw["library_version"]),
            "format_version": int(raw["format_version"]),
            "leaves": tuple(raw["leaves"]),
            "treedef": str(raw["treedef"]),
            "state_bytes": int(raw["state_bytes"]),
            "state_sha256": str(raw["state_sha256"]),
        }
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(
            f"{path / _HEADER} is unreadable or incomplete ({type(e).__name__}: "
            f"{e}); the checkpoint is corrupted."
        ) from e
    _check_versions(path, fields["format_version"], fields["library_version"])
    config = None if raw["config"] is None else config_from_dict(raw["config"])
    return CheckpointHeader(path=path, config=config, **fields)


def _check_versions(path: pathlib.Path, format_version: int, library: str) -> None:
    if format_version > FORMAT_VERSION:
        raise CheckpointError(
            f"{path} has checkpoint format {format_version}; this eqx_ppo "
            f"({_library_version()}) reads formats up to {FORMAT_VERSION}. "
            f"Upgrade eqx_ppo (the checkpoint was written by {library})."
        )
    ours = _library_version()
    if library.split(".")[0] != ours.split(".")[0]:
        raise CheckpointError(
            f"{path} was written by eqx_ppo {library}; this is eqx_ppo {ours}, a "
            "different major version whose states are not compatible. Load it "
            f"with eqx_ppo {library.split('.')[0]}.x."
        )


def _describe(spec: dict[str, Any] | None) -> str:
    if spec is None:
        return "(absent)"
    if "shape" in spec:
        return f"{spec['dtype']}{spec['shape']}"
    return spec["type"]


def _check_structure(header: CheckpointHeader, like: Any) -> None:
    expected, treedef = _structure(like)
    saved = [{k: v for k, v in s.items() if k != "key_impl"} for s in header.leaves]
    if saved != expected:
        by_path = {s["path"]: s for s in saved}
        lines = []
        for spec in expected:
            got = by_path.pop(spec["path"], None)
            if got != spec:
                lines.append(
                    f"  {spec['path']}: saved {_describe(got)}, expected "
                    f"{_describe(spec)}"
                )
        lines += [
            f"  {p}: saved {_describe(s)}, expected (absent)"
            for p, s in by_path.items()
        ]
        if not lines:
            lines = ["  the leaves are the same but in a different order"]
        raise CheckpointError(
            f"{header.path} does not match the template: {len(lines)} leaves "
            f"differ (saved {len(saved)} leaves, template {len(expected)}):\n"
            + "\n".join(lines[:8])
            + ("\n  ..." if len(lines) > 8 else "")
            + "\nFix: build the template with the network constructor and config "
            "the checkpoint was saved with (see read_header(path).config / "
            ".metadata)."
        )
    if treedef != header.treedef:
        i = len(os.path.commonprefix([treedef, header.treedef]))
        lo = max(0, i - 60)
        raise CheckpointError(
            f"{header.path} does not match the template: the arrays agree but the "
            "static structure differs (e.g. an activation, a sampler setting or "
            "a layer option):\n"
            f"  saved:    ...{header.treedef[lo : i + 60]}...\n"
            f"  template: ...{treedef[lo : i + 60]}...\n"
            "Fix: build the template with the same constructor arguments."
        )


def _check_file(header: CheckpointHeader) -> pathlib.Path:
    file = header.path / _STATE
    if not file.is_file():
        raise CheckpointError(f"{header.path} has no {_STATE}; it is incomplete.")
    size = file.stat().st_size
    if size != header.state_bytes:
        raise CheckpointError(
            f"{file} has {size} bytes, the header records {header.state_bytes}: "
            "the file is truncated or was overwritten."
        )
    digest = hashlib.sha256()
    with open(file, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != header.state_sha256:
        raise CheckpointError(
            f"{file} does not match the checksum in its header: it is corrupted."
        )
    return file


def _config_differences(saved: Any, given: Any) -> list[str]:
    if type(saved) is not type(given):
        return [
            f"config type: saved {type(saved).__name__}, given {type(given).__name__}"
        ]
    saved_d, given_d = config_to_dict(saved), config_to_dict(given)
    diffs = []
    if saved_d.get("n_seeds") != given_d.get("n_seeds"):
        diffs.append(
            f"n_seeds: saved {saved_d.get('n_seeds')}, given {given_d.get('n_seeds')}"
        )
    section = "ppo" if "ppo" in saved_d else "distillation"
    old, new = saved_d[section], given_d[section]
    free = set(_FREE_FIELDS)
    if old.get("lr_schedule") == "constant" == new.get("lr_schedule"):
        free.add("total_steps")
    for name in old:
        if name not in free and old[name] != new.get(name):
            diffs.append(
                f"{section}.{name}: saved {old[name]!r}, given {new.get(name)!r}"
            )
    return diffs


def _template(header: CheckpointHeader, like: Any, env: Any, networks: Any) -> Any:
    if like is None:
        if env is None or networks is None:
            raise TypeError(
                "load_checkpoint: pass `like=` (a template state, or a function "
                "config -> state) or both `env=` and `networks=` (PPO)."
            )
        from .ppo._train import init_state

        def like(config):
            return init_state(env, networks, config)

    elif env is not None or networks is not None:
        raise TypeError("load_checkpoint: pass either `like=` or `env=`/`networks=`.")
    if not callable(like) or isinstance(like, eqx.Module):
        return like
    if header.config is None:
        raise CheckpointError(
            f"{header.path} saved no config, so the template cannot be built from "
            "it: pass a template state as `like=`."
        )
    return eqx.filter_eval_shape(like, header.config)


def _as_load_target(x: Any, spec: dict[str, Any]) -> Any:
    if _is_key(x):
        data = jax.eval_shape(
            lambda: jax.random.key_data(jax.random.key(0, impl=spec["key_impl"]))
        )
        return jax.ShapeDtypeStruct(tuple(x.shape) + data.shape, data.dtype)
    if isinstance(x, jax.Array):
        return jax.ShapeDtypeStruct(x.shape, x.dtype)
    return x


def load_checkpoint(
    path: str | os.PathLike,
    *,
    like: Any = None,
    env: Any = None,
    networks: Any = None,
    config: Any = None,
) -> Any:
    """The state saved at `path`, checked against a template.

    **Arguments:**

    - `path`: a checkpoint folder, or a folder of checkpoints (the latest is
      loaded).
    - `like`: the template: a state with the saved structure (arrays or
      `jax.ShapeDtypeStruct`s), or a function `config -> state` called with the
      saved config under `eqx.filter_eval_shape`, e.g.
      `lambda c: eqx_ppo.ppo.init_state(env, networks, c)` or
      `lambda c: eqx_ppo.init_distillation_state(env, teacher, student, c)`.
    - `env`, `networks`: instead of `like`, for PPO states: the template is
      `init_state(env, networks, saved_config)`.
    - `config`: optionally, the config you will resume with; a
      [`CheckpointError`][] lists every field that differs from the saved one
      and would change the optimisation (logging fields may differ, and
      `total_steps` may grow with a constant learning rate).

    Raises [`CheckpointError`][] (a `ValueError`) if the checkpoint is
    incomplete, corrupted, of an incompatible version, or does not match the
    template; the message says what differs.
    """
    header = read_header(path)
    if config is not None and header.config is not None:
        diffs = _config_differences(header.config, config)
        if diffs:
            raise CheckpointError(
                f"{header.path}: the given config differs from the saved one in "
                "fields that change the optimisation:\n  "
                + "\n  ".join(diffs)
                + "\nFix: resume with read_header(path).config, or load without "
                "`config=` if the change is intended."
            )
    template = _template(header, like, env, networks)
    _check_structure(header, template)
    file = _check_file(header)
    specs = jax.tree.unflatten(jax.tree.structure(template), header.leaves)
    target = jax.tree.map(_as_load_target, template, specs)
    try:
        loaded = eqx.tree_deserialise_leaves(file, target)
    except Exception as e:
        raise CheckpointError(
            f"{file} could not be read ({type(e).__name__}: {e}); it is corrupted."
        ) from e
    return jax.tree.map(
        lambda x, t, spec: (
            jax.random.wrap_key_data(x, impl=spec["key_impl"]) if _is_key(t) else x
        ),
        loaded,
        template,
        specs,
    )
