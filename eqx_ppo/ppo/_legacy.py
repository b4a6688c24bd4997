"""The training states of format-1 checkpoints (eqx_ppo 0.1), and how they load.

Format 1 stored PPO's carry as `net_state` and distillation's state as its
own class with `student`, `student_state` and `teacher_state`. The classes
below have the old names and fields, so their pytree definitions match the
saved ones exactly; the migrations move the same leaves between the layouts.
"""

from typing import Any

import equinox as eqx

from ..checkpoint import register_migration
from ._step import TrainingState as _Current


class TrainingState(eqx.Module):
    network: Any
    opt_state: Any
    env_state: Any
    net_state: Any
    key: Any
    iteration: Any
    steps: Any


class DistillationState(eqx.Module):
    student: Any
    opt_state: Any
    env_state: Any
    student_state: Any
    teacher_state: Any
    key: Any
    iteration: Any
    steps: Any


def _ppo_to_saved(s: _Current) -> TrainingState:
    return TrainingState(
        s.network, s.opt_state, s.env_state, s.carry, s.key, s.iteration, s.steps
    )


def _ppo_from_saved(s: TrainingState) -> _Current:
    return _Current(
        s.network, s.opt_state, s.env_state, s.net_state, s.key, s.iteration, s.steps
    )


def _distillation_to_saved(s: _Current) -> DistillationState:
    return DistillationState(
        s.network,
        s.opt_state,
        s.env_state,
        s.carry["student"],
        s.carry["teacher"],
        s.key,
        s.iteration,
        s.steps,
    )


def _distillation_from_saved(s: DistillationState) -> _Current:
    carry = {"student": s.student_state, "teacher": s.teacher_state}
    return _Current(
        s.student, s.opt_state, s.env_state, carry, s.key, s.iteration, s.steps
    )


register_migration(
    1, root="TrainingState", to_saved=_ppo_to_saved, from_saved=_ppo_from_saved
)
register_migration(
    1,
    root="DistillationState",
    to_saved=_distillation_to_saved,
    from_saved=_distillation_from_saved,
)
