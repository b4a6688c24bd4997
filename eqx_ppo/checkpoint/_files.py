"""Checkpoint folders on disk: atomic writes, retention, checksums (the
checkpointing guide says what a crash at any point leaves). `header.json`,
written last, ends with its own SHA-256 and records that of `state.eqx`."""

import hashlib
import json
import os
import pathlib
import shutil
import uuid
import warnings
from typing import Any

from .._typecheck import checked
from ._codec import CheckpointError

STATE = "state.eqx"
HEADER = "header.json"
HEADER_SHA256 = "header_sha256"
_SEAL = f',\n "{HEADER_SHA256}": '.encode()
PREFIX = "step_"
_TMP = ".tmp-"
_TRASH = ".trash-"
_REPLACED = ".replaced-"


def _fsync_dir(path: pathlib.Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_synced(file: pathlib.Path, data: bytes) -> None:
    with open(file, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _sealed(body: bytes) -> bytes:
    """`body`, the start of a JSON object up to its last field, completed with
    the field `header_sha256`: the SHA-256 of `body`."""
    return body + _SEAL + f'"{hashlib.sha256(body).hexdigest()}"\n}}\n'.encode()


def header_json(header: dict[str, Any]) -> bytes:
    """The bytes of `header.json` holding `header`."""
    return _sealed(json.dumps(header, indent=1).encode().removesuffix(b"\n}"))


def read_header_json(folder: pathlib.Path) -> dict[str, Any]:
    """The JSON object in `folder/header.json`, after checking its checksum."""
    file = folder / HEADER
    try:
        data = file.read_bytes()  # another OSError names the file itself
    except FileNotFoundError:
        raise removed_while_reading(folder) from None
    if data != _sealed(data.rpartition(_SEAL)[0]):
        raise CheckpointError(
            f"{file} does not match its own checksum (field `{HEADER_SHA256}`): "
            "it was edited, truncated or corrupted after it was saved. Fix: load "
            "an earlier checkpoint of the folder, or save this one again."
        )
    try:
        return json.loads(data)
    except ValueError as e:
        raise CheckpointError(f"{file} is not JSON ({e}).") from e


def step_of(path: pathlib.Path) -> int | None:
    digits = path.name.removeprefix(PREFIX)
    return int(digits) if path.name.startswith(PREFIX) and digits.isdigit() else None


def _replaced_name(aside: pathlib.Path) -> str:
    """The name of the checkpoint that `aside`, a set-aside copy, replaced."""
    return aside.name[len(_REPLACED) :].rsplit("-", 1)[0]


def named_step(folder: pathlib.Path) -> int | None:
    """The step in the name of a checkpoint folder (`step_*`, or the set-aside
    copy of one), or `None` for any other name."""
    if folder.name.startswith(_REPLACED):
        folder = folder.with_name(_replaced_name(folder))
    return step_of(folder)


def _complete(directory: pathlib.Path) -> list[tuple[int, pathlib.Path]]:
    """`(step, folder)` of every complete checkpoint in `directory`, by step;
    a set-aside copy stands for a step that has no `step_*` folder."""
    if not directory.is_dir():
        return []
    found: dict[int, pathlib.Path] = {}
    set_aside: dict[int, pathlib.Path] = {}
    for p in directory.iterdir():
        if (p / HEADER).is_file() and (step := named_step(p)) is not None:
            (set_aside if p.name.startswith(_REPLACED) else found)[step] = p
    return sorted({**set_aside, **found}.items())


@checked
def list_checkpoints(directory: str | os.PathLike) -> list[pathlib.Path]:
    """The complete checkpoints in `directory` (those with a `header.json`,
    written last), oldest step first."""
    return [p for _, p in _complete(pathlib.Path(directory))]


@checked
def latest_checkpoint(directory: str | os.PathLike) -> pathlib.Path | None:
    """The complete checkpoint with the highest step in `directory`, or `None`;
    warns of a later `step_*` folder without a header (loading passes over it)."""
    directory = pathlib.Path(directory)
    found = _complete(directory)
    latest = found[-1] if found else (-1, None)
    if directory.is_dir():
        skipped = sorted(
            p.name
            for p in directory.iterdir()
            if (step := step_of(p)) is not None
            and step > latest[0]
            and not (p / HEADER).is_file()
        )
        if skipped:
            picked = "no checkpoint" if latest[1] is None else latest[1].name
            warnings.warn(
                f"{directory}: {', '.join(skipped)} has no {HEADER}, so loading "
                f"passes over it and finds {picked}. No save leaves such a "
                "folder: it was damaged or copied incompletely.",
                stacklevel=2,
            )
    return latest[1]


def _aside(path: pathlib.Path, prefix: str) -> pathlib.Path:
    """Rename `path` to a hidden sibling no other call uses; return it."""
    aside = path.with_name(f"{prefix}{path.name}-{uuid.uuid4().hex}")
    os.replace(path, aside)
    return aside


def _is_intact(folder: pathlib.Path) -> bool:
    try:
        header = read_header_json(folder)
        read_state(folder, header["state_bytes"], header["state_sha256"])
    except (KeyError, TypeError, CheckpointError):
        return False
    return True


def _remove_leftovers(directory: pathlib.Path) -> None:
    """Delete what interrupted saves left, restoring a replaced checkpoint
    whose successor never arrived."""
    for p in directory.iterdir():
        if not (p.name.startswith((_TMP, _TRASH, _REPLACED)) and p.is_dir()):
            continue
        if p.name.startswith(_REPLACED):
            original = directory / _replaced_name(p)
            if not original.exists() and _is_intact(p):
                os.replace(p, original)
                continue
        shutil.rmtree(p, ignore_errors=True)


def write_atomically(
    directory: pathlib.Path, step: int, files: dict[str, bytes], *, keep: int | None
) -> pathlib.Path:
    """Write `directory/step_<step>/` holding `files` (name: bytes, written in
    order, the header last), atomically, replacing any checkpoint of that step;
    with `keep`, only the newest `keep` of the checkpoints up to `step` remain."""
    final = directory / f"{PREFIX}{step:09d}"
    tmp = replaced = None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        # Not `tempfile.mkdtemp`: a checkpoint gets the umask's permissions.
        tmp = directory / f"{_TMP}{final.name}-{uuid.uuid4().hex}"
        tmp.mkdir()
        for name, data in files.items():
            _write_synced(tmp / name, data)
        _fsync_dir(tmp)
        if final.exists():
            replaced = _aside(final, _REPLACED)
        try:
            os.replace(tmp, final)
        finally:
            if replaced is not None and not final.exists():
                os.replace(replaced, final)
        _fsync_dir(directory)
    except BaseException as e:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if not isinstance(e, OSError):
            raise
        raise CheckpointError(
            f"Saving {final} failed ({type(e).__name__}: {e}); the half-written "
            f"copy was removed and every earlier checkpoint in {directory} is "
            "intact. Free space or fix the folder, then save again."
        ) from e
    _remove_leftovers(directory)
    found = _complete(directory)
    later = [p.name for s, p in found if s > step]
    if later:
        warnings.warn(
            f"{directory} holds checkpoints after step {step}: {later}. Loading "
            "the folder (`latest_checkpoint`, `--resume`) picks the highest step, "
            "not this one; save each run to its own folder, or delete them.",
            stacklevel=5,
        )
    if keep is not None:
        up_to_step = [p for s, p in found if s <= step]
        for old in up_to_step[:-keep]:  # renamed first: never half a checkpoint
            shutil.rmtree(_aside(old, _TRASH), ignore_errors=True)
    return final


def resolve(path: str | os.PathLike | None) -> pathlib.Path:
    """A checkpoint folder, or the latest complete one in a folder of them."""
    if path is None:
        raise CheckpointError(
            "No checkpoint given (path=None; latest_checkpoint(folder) is None "
            "when the folder holds no complete checkpoint). Pass the folder "
            "itself to be told what is in it, or start a fresh run."
        )
    path = pathlib.Path(path)
    if (path / HEADER).is_file():
        return path
    step = step_of(path)
    if step is not None and not path.exists():
        set_aside = dict(_complete(path.parent)).get(step)  # see `_complete`
        if set_aside is not None:
            return set_aside
    if step is not None and path.is_dir():
        raise CheckpointError(
            f"{path} has no {HEADER}: it is not a complete checkpoint (was a save "
            "interrupted?). Use an earlier checkpoint in the same folder."
        )
    latest = latest_checkpoint(path)
    if latest is None:
        raise CheckpointError(
            f"No checkpoint at {path}: expected a checkpoint folder (with "
            f"{HEADER}) or a folder of `{PREFIX}*` checkpoints."
        )
    return latest


def removed_while_reading(folder: pathlib.Path) -> CheckpointError:
    """The error for a checkpoint deleted by retention as it was read."""
    return CheckpointError(
        f"{folder} was deleted while it was being read: a save with `keep=` "
        "removes older checkpoints as training goes on. Load again; the "
        "folder's latest checkpoint is newer."
    )


def read_state(folder: pathlib.Path, size: int, sha256: str) -> bytes:
    """The bytes of `folder/state.eqx`, after checking their size and checksum
    (the bytes checked are the bytes loaded)."""
    file = folder / STATE
    try:
        data = file.read_bytes()
    except FileNotFoundError:
        if folder.is_dir():
            raise CheckpointError(
                f"{folder} has no {STATE}; it is incomplete."
            ) from None
        raise removed_while_reading(folder) from None
    if hashlib.sha256(data).hexdigest() != sha256:
        size_differs = (
            f" (truncated or overwritten: it has {len(data)} bytes, the header "
            f"records {size})"
            if len(data) != size
            else ""
        )
        raise CheckpointError(
            f"{file} does not match the checksum in its header: it is "
            f"corrupted{size_differs}."
        )
    return data
