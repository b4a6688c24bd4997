"""A state's leaves on disk: leaf specs, the structure check, PRNG key data
(written as raw key data, wrapped back with the saved implementation)."""

import io
import os
import pathlib
import re
from typing import Any

import equinox as eqx
import jax
import numpy as np

from ._codec import CheckpointError


def is_key(x: Any) -> bool:
    return hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def structure(tree: Any, saved: bool = False) -> tuple[list[dict[str, Any]], str]:
    """Every leaf's spec (of a `saved` state, with each PRNG key's
    implementation), and the pytree definition without memory addresses."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
    leaves = []
    for path, x in flat:
        spec: dict[str, Any] = {"path": jax.tree_util.keystr(path)}
        if hasattr(x, "shape") and hasattr(x, "dtype"):
            spec.update(shape=list(x.shape), dtype=str(x.dtype))
            if saved and is_key(x):
                spec["key_impl"] = str(jax.random.key_impl(x))
        else:
            spec["type"] = type(x).__name__
        leaves.append(spec)
    # Static fields holding functions print their address, which differs
    # between processes; the rest of the definition is stable.
    return leaves, re.sub(r" at 0x[0-9a-fA-F]+", "", str(treedef))


_ARRAY = {"path": str, "shape": list, "dtype": str}
_KEY = {**_ARRAY, "key_impl": str}
_OTHER = {"path": str, "type": str}


def spec_problem(spec: Any) -> str | None:
    """What is wrong with `spec`, a leaf spec read from a header (exactly the
    fields `structure(state, saved=True)` writes, each of its type), or `None`."""
    if not isinstance(spec, dict):
        return f"is not an object ({type(spec).__name__})"
    fields = _OTHER if "type" in spec else _KEY if "key_impl" in spec else _ARRAY
    for name in sorted(fields.keys() | spec.keys()):
        if name not in fields or not isinstance(spec.get(name), fields[name]):
            return f"has {name}={spec.get(name, '(absent)')!r}"
    shape = spec.get("shape", ())
    if not all(type(n) is int and n >= 0 for n in shape):
        return f"has shape={shape!r}"
    if "key_impl" in spec:
        try:
            jax.eval_shape(lambda: jax.random.key(0, impl=spec["key_impl"]))
        except (TypeError, ValueError) as e:
            return (
                f"has key_impl={spec['key_impl']!r}, which is not a PRNG "
                f"implementation this JAX knows ({e})"
            )
    return None


def _holds_arrays(x: Any) -> bool:
    """Whether `x`, a pytree leaf, is an object whose attributes hold arrays."""
    try:
        fields = vars(x)
    except TypeError:
        return False
    return any(eqx.is_array(leaf) for leaf in jax.tree.leaves(fields))


def check_saveable(state: Any) -> None:
    """Refuse a `state` with NaN or inf, or with a leaf that holds arrays but
    is not a pytree (serialising would lose them without a word)."""
    for path, x in jax.tree_util.tree_flatten_with_path(state)[0]:
        if eqx.is_inexact_array(x) and not np.isfinite(np.asarray(x)).all():
            raise FloatingPointError(
                f"save_checkpoint(state=...): leaf {jax.tree_util.keystr(path)} "
                "holds NaN or inf, and a checkpoint is never written with "
                "non-finite values. Fix: save an earlier state (training with "
                "check_finite=True stops before one is produced)."
            )
        if not eqx.is_array_like(x) and _holds_arrays(x):
            where = f"leaf {jax.tree_util.keystr(path)}" if path else "the state"
            raise TypeError(
                f"save_checkpoint(state=...): {where} is a {type(x).__name__}, "
                "which holds arrays but is not a pytree, so they would not be "
                "saved. Fix: save the pytree inside it (for a TrainResult, "
                "result.training_state), or make the class a pytree (an "
                "eqx.Module)."
            )


def serialise(state: Any) -> bytes:
    """`state`'s array leaves as `state.eqx` holds them, PRNG keys as key data."""
    data = jax.tree.map(lambda x: jax.random.key_data(x) if is_key(x) else x, state)
    file = io.BytesIO()
    eqx.tree_serialise_leaves(file, data)
    return file.getvalue()


def _describe(spec: dict[str, Any] | None) -> str:
    if spec is None:
        return "(absent)"
    return f"{spec['dtype']}{spec['shape']}" if "shape" in spec else spec["type"]


def check_structure(
    folder: pathlib.Path, saved_leaves: tuple, saved_treedef: str, like: Any
) -> None:
    """Raise a `CheckpointError` listing how `like` differs from the saved state."""
    expected, treedef = structure(like)
    saved = [{k: v for k, v in s.items() if k != "key_impl"} for s in saved_leaves]
    if saved != expected:
        by_saved = {s["path"]: s for s in saved}
        by_expected = {s["path"]: s for s in expected}
        lines = [
            f"  {p}: saved {_describe(by_saved.get(p))}, expected "
            f"{_describe(by_expected.get(p))}"
            for p in {**by_expected, **by_saved}  # the template's order first
            if by_saved.get(p) != by_expected.get(p)
        ]
        if not lines:
            lines = ["  the leaves are the same but in a different order"]
        raise CheckpointError(
            f"{folder} does not match the template: {len(lines)} leaves "
            f"differ (saved {len(saved)} leaves, template {len(expected)}):\n"
            + "\n".join(lines[:8])
            + ("\n  ..." if len(lines) > 8 else "")
            + "\nFix: build the template with the network constructor and config "
            "the checkpoint was saved with (see read_header(path).config / "
            ".metadata)."
        )
    if treedef != saved_treedef:
        i = len(os.path.commonprefix([treedef, saved_treedef]))
        lo = max(0, i - 60)
        raise CheckpointError(
            f"{folder} does not match the template: the arrays agree but the "
            "static structure differs (e.g. an activation, a sampler setting or "
            "a layer option):\n"
            f"  saved:    ...{saved_treedef[lo : i + 60]}...\n"
            f"  template: ...{treedef[lo : i + 60]}...\n"
            "Fix: build the template with the same constructor arguments."
        )


def _load_target(x: Any, spec: dict[str, Any]) -> Any:
    if is_key(x):
        data = jax.eval_shape(
            lambda: jax.random.key_data(jax.random.key(0, impl=spec["key_impl"]))
        )
        return jax.ShapeDtypeStruct(tuple(x.shape) + data.shape, data.dtype)
    return x


def deserialise(
    file: pathlib.Path, data: bytes, template: Any, saved_leaves: tuple
) -> Any:
    """The state in `data`, the checked bytes of `file`, shaped like
    `template` (checked beforehand)."""
    specs = jax.tree.unflatten(jax.tree.structure(template), saved_leaves)
    target = jax.tree.map(_load_target, template, specs)
    try:
        loaded = eqx.tree_deserialise_leaves(io.BytesIO(data), target)
    except Exception as e:
        raise CheckpointError(
            f"{file} could not be read ({type(e).__name__}: {e}); it is corrupted."
        ) from e
    return jax.tree.map(
        lambda x, t, spec: (
            jax.random.wrap_key_data(x, impl=spec["key_impl"]) if is_key(t) else x
        ),
        loaded,
        template,
        specs,
    )
