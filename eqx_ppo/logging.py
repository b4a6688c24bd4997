"""What to log (`LoggingLevel`), in-graph metric reduction (see the logging
guide), and the sinks that get the host's plain dicts."""

import csv
import enum
import io
import json
import math
import os
import pathlib
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, PyTree

from ._optional import import_optional
from ._typecheck import checked
from .checkpoint import register_config

Metrics = Mapping[str, int | float | list[float]]
"""Host metrics: a float per key, or a list of floats (one per seed) for
multi-seed runs; `total_steps` is an int."""

LogFn = Callable[[Metrics, int], None]
"""A metric sink: called with `(metrics, step)` on the host."""


@register_config
class LoggingLevel(enum.Flag):
    """Which metric groups a run computes; combine with `|`. The logging guide
    lists each group's keys (`ROLLOUT_OBS` is left out of `ALL`)."""

    LOSSES = enum.auto()
    CRITIC_EXTRA = enum.auto()
    ACTOR_EXTRA = enum.auto()
    ROLLOUT_STATS = enum.auto()
    ROLLOUT_OBS = enum.auto()
    ENV_METRICS = enum.auto()
    NETWORK_METRICS = enum.auto()
    GRAD_NORM = enum.auto()
    WEIGHTS = enum.auto()
    THROUGHPUT = enum.auto()
    BASIC = LOSSES
    ALL = (
        LOSSES
        | ACTOR_EXTRA
        | CRITIC_EXTRA
        | ROLLOUT_STATS
        | ENV_METRICS
        | NETWORK_METRICS
        | GRAD_NORM
        | WEIGHTS
        | THROUGHPUT
    )
    NONE = 0


def reduce_metric(
    out: dict[str, Array],
    name: str,
    value: PyTree[Array],
    percentiles: Sequence[int | float] | None = None,
) -> None:
    """Add `value`'s statistics to `out` under `name` (nested dicts as
    `name/key`): a bool's fraction true, else `name/mean` and `name/std`, or
    `name/p{N}` for each of `percentiles`."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            reduce_metric(out, f"{name}/{k}", v, percentiles)
        return
    value = jnp.asarray(value)
    if value.dtype == jnp.bool_:
        out[name] = jnp.mean(value.astype(jnp.float32))
    elif not percentiles:
        out[f"{name}/mean"] = jnp.mean(value.astype(jnp.float32))
        out[f"{name}/std"] = jnp.std(value.astype(jnp.float32))
    else:
        levels = jnp.asarray(percentiles, jnp.float32)
        ps = jnp.percentile(value.astype(jnp.float32), levels)
        for level, p in zip(percentiles, ps, strict=True):
            out[f"{name}/p{level:g}"] = p


def _clean(value: Any) -> Any:
    """`value` (a number, list or NumPy/JAX array) as JSON's numbers, with
    non-finite floats as `None`."""
    value = value if isinstance(value, list) else np.asarray(value).tolist()
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return None if isinstance(value, float) and not math.isfinite(value) else value


def per_seed_columns(metrics: Metrics) -> dict[str, float]:
    """Flatten multi-seed lists into `key/seed{i}` scalars (for table sinks)."""
    flat: dict[str, float] = {}
    for k, v in metrics.items():
        if isinstance(v, list):
            flat.update({f"{k}/seed{i}": x for i, x in enumerate(v)})
        else:
            flat[k] = v
    return flat


def _start_log(sink: str, path: pathlib.Path, append: bool, suffix: str) -> None:
    """Refuse a `path` that is a folder, or that holds an earlier run's log
    (unless `append`); drop, with a warning, a continued log's unfinished last
    line (a run killed mid-write), onto which the next record would be glued."""
    if path.is_dir():
        raise IsADirectoryError(
            f"{sink}: {path} is a folder; pass the path of the log file to "
            f"write, e.g. {path / 'metrics'}{suffix}."
        )
    if not append and path.exists() and path.stat().st_size > 0:
        raise FileExistsError(
            f"{sink}: {path} already holds a log (an earlier run's?), and "
            "writing to it would mix two runs or lose the first. Log to a new "
            "path, or pass append=True to continue it (e.g. when resuming that "
            "run)."
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    data = path.read_bytes() if path.is_file() else b""
    if not data or data.endswith(b"\n"):
        return
    keep = data.rfind(b"\n") + 1
    os.truncate(path, keep)
    warnings.warn(
        f"{sink}: {path} ended in an unfinished line ({len(data) - keep} bytes, "
        "from a run killed while writing?); dropped it before continuing.",
        stacklevel=3,
    )


def replace_file(path: pathlib.Path, text: str) -> None:
    """Replace `path` by a file holding `text`, written to a temporary file
    first, so a process killed while writing leaves the old file whole."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text, newline="")
    os.replace(partial, path)


@checked
class JSONLLogger:
    """Writes one JSON object per call to `path`: `{"step": ..., **metrics}`,
    non-finite values as `null`.

    **Arguments:**

    - `path`: the `.jsonl` file; one that holds a log is refused unless `append`.
    - `append`: continue the log at `path` (when resuming its run).
    """

    def __init__(self, path: str | pathlib.Path, *, append: bool = False):
        self.path = pathlib.Path(path)
        _start_log("JSONLLogger", self.path, append, ".jsonl")

    def __call__(self, metrics: Mapping[str, Any], step: int | np.integer) -> None:
        record = {"step": int(step), **{k: _clean(v) for k, v in metrics.items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")


@checked
class CSVLogger:
    """Writes metrics as CSV rows; a new key rewrites the file with the wider
    header, so it always parses as one table.

    **Arguments:**

    - `path`: the `.csv` file; one that holds a log is refused unless `append`.
    - `append`: continue the table at `path` (when resuming its run).
    """

    def __init__(self, path: str | pathlib.Path, *, append: bool = False):
        self.path = pathlib.Path(path)
        _start_log("CSVLogger", self.path, append, ".csv")
        self._rows: list[dict[str, Any]] = []
        self._fields: list[str] = ["step"]
        if self.path.exists() and self.path.stat().st_size > 0:
            with self.path.open(newline="") as f:
                reader = csv.DictReader(f)
                if not reader.fieldnames or reader.fieldnames[0] != "step":
                    raise ValueError(
                        f"CSVLogger(append=True): {self.path} is not a CSVLogger "
                        "log (its header does not start with 'step'); log to a "
                        "new path."
                    )
                self._fields = list(reader.fieldnames)
                self._rows = list(reader)

    def __call__(self, metrics: Metrics, step: int) -> None:
        row = {"step": step, **per_seed_columns(metrics)}
        new = [k for k in row if k not in self._fields]
        self._fields.extend(new)
        self._rows.append(row)
        if new or len(self._rows) == 1:
            table = io.StringIO(newline="")
            writer = csv.DictWriter(table, fieldnames=self._fields)
            writer.writeheader()
            writer.writerows(self._rows)
            replace_file(self.path, table.getvalue())
        else:
            with self.path.open("a", newline="") as f:
                csv.DictWriter(f, fieldnames=self._fields).writerow(row)


@checked
class TensorBoardLogger:
    """Writes scalars with tensorboardX (`pip install eqx_ppo[logging]`)."""

    def __init__(self, logdir: str | pathlib.Path):
        tensorboardx = import_optional("tensorboardX", "TensorBoardLogger", "logging")
        self.writer = tensorboardx.SummaryWriter(str(logdir))

    def __call__(self, metrics: Metrics, step: int) -> None:
        for k, v in per_seed_columns(metrics).items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()


@checked
class WandbLogger:
    """Logs to Weights & Biases (`pip install eqx_ppo[logging]`); kwargs go to
    `wandb.init`."""

    def __init__(self, **init_kwargs: Any):
        wandb = import_optional("wandb", "WandbLogger", "logging")
        self.run = wandb.init(**init_kwargs)

    def __call__(self, metrics: Metrics, step: int) -> None:
        self.run.log(per_seed_columns(metrics), step=step)


@checked
def combine_loggers(*log_fns: LogFn) -> LogFn:
    """One sink that forwards every call to each of `log_fns` (each checked to
    be callable here, not at the first log)."""

    def log(metrics: Metrics, step: int) -> None:
        for fn in log_fns:
            fn(metrics, step)

    return log
