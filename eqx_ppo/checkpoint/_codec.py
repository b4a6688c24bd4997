"""The header codec: configs to JSON and back, and what may change on resume
(the fields a config's `free_on_resume()` names)."""

import dataclasses
import enum
import hashlib
import re
from typing import Any, NamedTuple, TypeVar

import equinox as eqx
import jax
import numpy as np


class CheckpointError(ValueError):
    """A checkpoint is missing, incomplete, corrupted or does not match."""


_TYPES: dict[str, type] = {}
T = TypeVar("T", bound=type)


def register_config(cls: T) -> T:
    """Class decorator: let checkpoint headers save and rebuild `cls`, a
    frozen dataclass (a config) or an `enum.Flag`, stored under its class name
    (unique among registered types)."""
    if not isinstance(cls, type) or not (
        dataclasses.is_dataclass(cls) or issubclass(cls, enum.Flag)
    ):
        name = cls.__name__ if isinstance(cls, type) else f"<{type(cls).__name__}>"
        raise TypeError(
            f"register_config({name}): expected a dataclass or an enum.Flag class."
        )
    known = _TYPES.setdefault(cls.__name__, cls)
    if known is not cls:
        raise ValueError(
            f"register_config({cls.__name__}): another class of that name is "
            f"registered ({known.__module__}.{known.__qualname__}); rename one."
        )
    return cls


def config_to_dict(config: Any) -> dict[str, Any]:
    """A JSON-ready dict of a registered config, tagged with its class name
    under `"_type"`; [`config_from_dict`][] inverts it. A network inside (a
    distillation teacher) is kept as its fingerprint, a `SavedPytree`."""
    if not dataclasses.is_dataclass(config) or type(config).__name__ not in _TYPES:
        raise TypeError(
            f"config_to_dict: expected a registered config, one of "
            f"{sorted(n for n, c in _TYPES.items() if dataclasses.is_dataclass(c))}, "
            f"got {type(config).__name__}."
        )
    return _encode(config, type(config).__name__)


class SavedPytree(NamedTuple):
    """A network a config holds (a distillation teacher), as the header keeps
    it: a SHA-256 fingerprint of its structure and arrays."""

    sha256: str


def _fingerprint(tree: Any) -> str:
    digest = hashlib.sha256()
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    digest.update(re.sub(r" at 0x[0-9a-fA-F]+", "", str(treedef)).encode())
    for leaf in leaves:
        if eqx.is_array(leaf):
            array = np.asarray(leaf)
            digest.update(f"{array.dtype}{array.shape}".encode())
            digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def _encode(value: Any, path: str) -> Any:
    kind = type(value).__name__
    if _TYPES.get(kind) is type(value) and dataclasses.is_dataclass(value):
        return {"_type": kind} | {
            f.name: _encode(getattr(value, f.name), f"{path}.{f.name}")
            for f in dataclasses.fields(value)
        }
    if isinstance(value, enum.Flag) and _TYPES.get(kind) is type(value):
        return {"_type": kind, "flags": [f.name for f in value]}
    if isinstance(value, SavedPytree | eqx.Module):
        # A network a config holds (a distillation teacher): not JSON.
        sha256 = value.sha256 if isinstance(value, SavedPytree) else _fingerprint(value)
        return {"_type": "pytree", "sha256": sha256}
    if isinstance(value, jax.Array | np.ndarray | np.generic):
        if np.ndim(value) != 0 or isinstance(value, jax.core.Tracer):
            raise TypeError(
                f"config_to_dict: {path} is an array of shape {np.shape(value)}; "
                "only concrete scalars can be saved (save one config per vmapped "
                "value)."
            )
        return float(value) if np.issubdtype(value.dtype, np.inexact) else int(value)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, tuple | list):
        return [_encode(v, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        if "_type" in value:
            raise TypeError(
                f'config_to_dict: {path} has a key "_type", which the header '
                "reserves to tag configs; rename the key."
            )
        return {k: _encode(v, f"{path}[{k!r}]") for k, v in value.items()}
    raise TypeError(
        f"config_to_dict: {path} = {value!r} ({type(value).__name__}) is not "
        "JSON-serialisable; use numbers, strings, lists and str-keyed dicts."
    )


def config_from_dict(data: dict[str, Any]) -> Any:
    """The config that [`config_to_dict`][] turned into `data`; missing fields
    take their defaults, and what does not rebuild raises a
    [`CheckpointError`][] naming the field."""
    if not isinstance(data, dict) or "_type" not in data:
        seen = "a dict without one" if isinstance(data, dict) else type(data).__name__
        raise CheckpointError(
            f"config_from_dict(data=...): expected what config_to_dict returns, a "
            f"dict with the config's '_type'; got {seen}."
        )
    return _decode(data, "config")


def _decode(value: Any, path: str) -> Any:
    if isinstance(value, list):
        return tuple(_decode(v, f"{path}[{i}]") for i, v in enumerate(value))
    if not isinstance(value, dict):
        return value
    kind = value.get("_type")
    if kind is None:
        return {k: _decode(v, f"{path}[{k!r}]") for k, v in value.items()}
    if kind == "pytree":
        return SavedPytree(str(value.get("sha256")))
    cls = _TYPES.get(kind)
    if cls is None:
        raise CheckpointError(f"{path}: unknown config type {kind!r}.")
    if issubclass(cls, enum.Flag):
        flags = cls(0)
        for name in value.get("flags", ()):
            if name not in cls.__members__:
                raise CheckpointError(
                    f"{path}: unknown {kind} flag {name!r}; known flags: "
                    f"{sorted(cls.__members__)}."
                )
            flags |= cls[name]
        return flags
    fields = {k: _decode(v, f"{path}.{k}") for k, v in value.items() if k != "_type"}
    for field in dataclasses.fields(cls):
        factory = field.default_factory  # a sub-config's field has one
        if isinstance(fields.get(field.name), dict) and (
            factory is not dataclasses.MISSING and type(factory()).__name__ in _TYPES
        ):
            raise CheckpointError(
                f'{path}.{field.name}: a sub-config saved without its "_type".'
            )
    try:
        return cls(**fields)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: the saved {kind} is invalid: {e}") from e


def config_differences(saved: Any, given: Any, prefix: str = "") -> list[str]:
    """The fields of `given` that differ from `saved` and may not change on
    resume, compared as the header stores them."""
    if type(saved) is not type(given):
        return [
            f"{prefix or 'config '}type: saved {type(saved).__name__}, given "
            f"{type(given).__name__}"
        ]
    free = saved.free_on_resume() if hasattr(saved, "free_on_resume") else ()
    diffs = []
    for field in dataclasses.fields(saved):
        if field.name in free:
            continue
        old, new = getattr(saved, field.name), getattr(given, field.name)
        path = f"{prefix}{field.name}"
        if dataclasses.is_dataclass(old) and type(old).__name__ in _TYPES:
            diffs += config_differences(old, new, f"{path}.")
        elif _encode(old, path) != _encode(new, path):
            diffs.append(
                f"{path}: saved {_shown(old, path)}, given {_shown(new, path)}"
            )
    return diffs


def _shown(value: Any, path: str) -> str:
    """A config value as a difference message shows it: a float32 coefficient
    by its shortest float32 repr (`0.001`, not `0.0010000000474974513`)."""
    if getattr(value, "dtype", None) == np.float32:
        return np.format_float_positional(np.float32(value), unique=True, trim="-")
    return repr(_encode(value, path))
