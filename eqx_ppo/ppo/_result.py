"""What `train` returns, and how to take one seed of a multi-seed result."""

import dataclasses
import operator
from typing import Any

import equinox as eqx
import jax
import numpy as np

from .._typecheck import Index, checked
from ._step import TrainingState

Metrics = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class VideoData:
    """One rendered evaluation episode, passed to `video_fn`."""

    frames: np.ndarray
    step: int
    episode_reward: float
    episode_length: int


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """What [`eqx_ppo.train`][] returns.

    With `n_seeds > 1`, every array leaf of `training_state` has a leading
    seed axis and every metric value is a list with one float per seed.
    """

    training_state: TrainingState
    final_metrics: Metrics
    eval_history: list[Metrics]
    total_steps: int
    total_iterations: int


@checked
def select_seed(tree: Any, seed_index: Index) -> Any:
    """Seed `seed_index`'s slice of a multi-seed result (state, network, ...):
    every array leaf loses its leading seed axis. A [`eqx_ppo.TrainResult`][]
    gives that seed's own result, its metrics' per-seed lists replaced by the
    seed's values."""
    if isinstance(tree, TrainResult):

        def pick(record: Metrics) -> Metrics:
            return {
                k: v[seed_index] if isinstance(v, list) else v
                for k, v in record.items()
            }

        return dataclasses.replace(
            tree,
            training_state=select_seed(tree.training_state, seed_index),
            final_metrics=pick(tree.final_metrics),
            eval_history=[pick(record) for record in tree.eval_history],
        )
    sizes = sorted({np.shape(x)[:1] for x in jax.tree.leaves(tree) if eqx.is_array(x)})
    if len(sizes) != 1 or sizes == [()]:
        raise ValueError(
            f"select_seed(tree=...): the array leaves share no leading seed axis "
            f"(leading sizes {sizes}). Fix: pass a result of TrainConfig(n_seeds > 1)."
        )
    if not isinstance(seed_index, jax.core.Tracer):
        n_seeds, index = sizes[0][0], operator.index(seed_index)
        if not -n_seeds <= index < n_seeds:
            # JAX indexing would clamp it to the last seed.
            raise IndexError(
                f"select_seed(seed_index={index}): out of range for {n_seeds} seeds. "
                f"Fix: pass 0 <= seed_index < {n_seeds}."
            )
    return jax.tree.map(lambda x: x[seed_index] if eqx.is_array(x) else x, tree)
