"""How checkpoints of formats 1 and 2 load.

Format 1 (eqx_ppo 0.1) stored PPO's carry as `net_state` and distillation's
state as its own class with `student`, `student_state` and `teacher_state`.
Formats 1 and 2 stored the layers' coefficients (`entropy_weight`,
`kl_weight`, `ar1_weight`) as static fields, so their values are in the
saved pytree definition rather than among the leaves. The classes below have
the old names and fields, so their pytree definitions match the saved ones
exactly; the migrations move the same leaves between the layouts and read
each coefficient back from the saved definition.
"""

import dataclasses
import re
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from .. import samplers
from ..checkpoint import register_migration
from ..checkpoint._leaves import structure
from ..nn import _variational
from ..nn._filters import coefficient_names
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


class _Saved:
    """A static coefficient of an old layer, until read from the saved file."""

    def __init__(self, index: int):
        self.text = f"<coefficient {index}>"

    def __repr__(self) -> str:
        return self.text


class NormalTanhSampler(eqx.Module):
    entropy_weight: Any = eqx.field(static=True)
    min_std: Any = eqx.field(static=True)
    std_scale: Any = eqx.field(static=True)
    inference: Any


class NormalSampler(eqx.Module):
    entropy_weight: Any = eqx.field(static=True)
    min_std: Any = eqx.field(static=True)
    std_scale: Any = eqx.field(static=True)
    inference: Any


class CategoricalSampler(eqx.Module):
    entropy_weight: Any = eqx.field(static=True)
    n_actions: Any = eqx.field(static=True)
    inference: Any


class VariationalBottleneck(eqx.Module):
    head: Any
    kl_weight: Any = eqx.field(static=True)
    inference: Any


class AR1VariationalBottleneck(eqx.Module):
    head: Any
    kl_weight: Any = eqx.field(static=True)
    ar1_weight: Any = eqx.field(static=True)
    backprop_through_time: Any = eqx.field(static=True)
    inference: Any


_TWINS = {
    samplers.NormalTanhSampler: NormalTanhSampler,
    samplers.NormalSampler: NormalSampler,
    samplers.CategoricalSampler: CategoricalSampler,
    _variational.VariationalBottleneck: VariationalBottleneck,
    _variational.AR1VariationalBottleneck: AR1VariationalBottleneck,
}
_CURRENT = {twin: current for current, twin in _TWINS.items()}


def _fields(module: eqx.Module) -> dict[str, Any]:
    return {f.name: getattr(module, f.name) for f in dataclasses.fields(module)}


def _rebuild(cls: type, fields: dict[str, Any]) -> Any:
    """An instance of `cls` with these fields, as unflattening builds one."""
    module = object.__new__(cls)
    for name, value in fields.items():
        object.__setattr__(module, name, value)
    return module


def _coefficients_to_saved(template: Any, saved_treedef: str) -> Any:
    """`template` with each layer's coefficients static, valued as saved."""
    placeholders: list[_Saved] = []

    def to_twin(node: Any) -> Any:
        fields = _fields(node)
        for name in fields:
            if name in coefficient_names(node):
                placeholders.append(_Saved(len(placeholders)))
                fields[name] = placeholders[-1]
        return _rebuild(_TWINS[type(node)], fields)

    saved = jax.tree.map(
        lambda x: to_twin(x) if type(x) in _TWINS else x,
        template,
        is_leaf=lambda x: type(x) in _TWINS,
    )
    if placeholders:
        pattern = re.escape(structure(saved)[1])
        for p in placeholders:
            pattern = pattern.replace(re.escape(p.text), r"([^,()\[\]]+)", 1)
        match = re.fullmatch(pattern, saved_treedef)
        if match is not None:
            for p, text in zip(placeholders, match.groups(), strict=True):
                p.text = text
    return saved


def _coefficients_from_saved(state: Any) -> Any:
    def from_twin(node: Any) -> Any:
        fields = {
            name: jnp.asarray(float(v.text), jnp.float32)
            if isinstance(v, _Saved)
            else v
            for name, v in _fields(node).items()
        }
        return _rebuild(_CURRENT[type(node)], fields)

    return jax.tree.map(
        lambda x: from_twin(x) if type(x) in _CURRENT else x,
        state,
        is_leaf=lambda x: type(x) in _CURRENT,
    )


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


def _format1(to_saved: Any, from_saved: Any) -> dict[str, Any]:
    return {
        "to_saved": lambda s, treedef: _coefficients_to_saved(to_saved(s), treedef),
        "from_saved": lambda s: from_saved(_coefficients_from_saved(s)),
    }


register_migration(1, root="TrainingState", **_format1(_ppo_to_saved, _ppo_from_saved))
register_migration(
    1,
    root="DistillationState",
    **_format1(_distillation_to_saved, _distillation_from_saved),
)
register_migration(
    2,
    root="TrainingState",
    to_saved=_coefficients_to_saved,
    from_saved=_coefficients_from_saved,
)
