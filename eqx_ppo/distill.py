"""Policy distillation: train a student network to act like a frozen teacher.

The student acts, the teacher runs beside it in inference mode, and the loss
is the student's negative log-likelihood of the teacher's pre-squash action.
The distillation guide has the details and the differences from nnx-ppo.
"""

from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PyTree

from ._typecheck import checked
from .checkpoint import register_config
from .checkpoint._codec import SavedPytree
from .logging import LoggingLevel
from .nn._adapter import PPONetworkOutput, _is_sampler_dict
from .nn._errors import tree_spec
from .nn._module import (
    AbstractLayerWrapper,
    AbstractStatefulModule,
    State,
    StatefulModuleOutput,
)
from .ppo import AbstractLearner, Minibatch
from .ppo._learner import Axis, Loss, Module, Number, setting
from .ppo._sharding import pmean
from .ppo._validate import check_output_type, seed_axis_hint
from .recording import is_leaf_layer


class _SamplerExtras(eqx.Module):
    """Marks the extras of one sampler in a probe run."""

    value: Any
    kind: str = eqx.field(static=True)


class _SamplerProbe(AbstractLayerWrapper):
    """Runs `layer` and marks its extras if it is a sampler."""

    layer: AbstractStatefulModule

    def wrap_output(self, out: StatefulModuleOutput) -> StatefulModuleOutput:
        if not _is_sampler_dict(out.output):
            return out
        kind = type(self.layer).__name__
        n_actions = getattr(self.layer, "n_actions", None)
        if n_actions is not None:
            kind = f"{kind}(n_actions={n_actions!r})"
        return out._replace(extras=_SamplerExtras(out.extras, kind))


def _probe(
    who: str, network: AbstractStatefulModule, obs: PyTree
) -> tuple[Any, list[tuple[tuple, _SamplerExtras]]]:
    """One env's call of `network` (shapes only), and its samplers' marked
    extras with their paths."""
    probed = jax.tree.map(
        lambda n: _SamplerProbe(n) if is_leaf_layer(n) else n,
        network,
        is_leaf=is_leaf_layer,
    )
    try:
        out = eqx.filter_eval_shape(
            lambda net, o, k: net(net.initial_state(), o, key=k),
            probed,
            obs,
            jax.random.key(0),
        )
    except (ValueError, TypeError) as error:
        # Both networks read the same observation: say which one failed.
        raise type(error)(
            f"Distillation: the {who} cannot take the env's observation: {error}"
        ) from error
    check_output_type(out.output, f"Distillation: the {who}")
    is_mark = lambda n: isinstance(n, _SamplerExtras)  # noqa: E731
    flat = jax.tree_util.tree_leaves_with_path(out.extras, is_leaf=is_mark)
    return out, [(path, n) for path, n in flat if is_mark(n)]


def _sampler_paths(
    teacher: AbstractStatefulModule, student: AbstractStatefulModule, obs: PyTree
) -> tuple[tuple[tuple, tuple], ...]:
    """Where the student's and the (inference-mode) teacher's samplers put their
    extras, as `(student path, teacher path)` pairs in order; a clear error if
    the two cannot be matched."""
    teacher_out, teacher_marks = _probe("teacher", teacher, obs)
    student_out, student_marks = _probe("student", student, obs)
    # What the two must share: actions, and samplers that can score them.
    compared = {
        ("actions", "actions"): [
            tree_spec(out.output.actions) for out in (teacher_out, student_out)
        ],
        ("samplers", "samplers (kind, replay extras)"): [
            [(m.kind, tree_spec(m.value)) for _, m in marks]
            for marks in (teacher_marks, student_marks)
        ],
    }
    differ = {names: pair for names, pair in compared.items() if pair[0] != pair[1]}
    if differ:
        raise ValueError(
            "Distillation: the teacher's and the student's "
            + ", and their ".join(f"{name} differ" for name, _ in differ)
            + ", so the student cannot score the teacher's raw actions.\n"
            + "".join(
                f"  teacher {label}: {teacher}\n  student {label}: {student}\n"
                for (_, label), (teacher, student) in differ.items()
            )
            + "Fix: give the student the teacher's action structure and sizes, and "
            "end its action port with the same sampler kinds (and numbers of "
            "actions), in the same order."
        )
    if any(not jax.tree.leaves(m.value) for _, m in student_marks):
        raise ValueError(
            "Distillation: a sampler emits no replay extras, so its "
            "log-likelihood of the teacher's action cannot be computed."
        )
    return tuple(
        (student, teacher)
        for (student, _), (teacher, _) in zip(student_marks, teacher_marks, strict=True)
    )


def _swap(extras: Any, source: Any, paths: tuple) -> Any:
    """`extras` with the leaves below `path` replaced by those below
    `source_path` in `source`, for each `(path, source_path)` of `paths`."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(extras)
    source_flat = jax.tree_util.tree_flatten_with_path(source)[0]
    leaves = [x for _, x in flat]
    for prefix, source_prefix in paths:
        positions = [i for i, (p, _) in enumerate(flat) if p[: len(prefix)] == prefix]
        new = [x for p, x in source_flat if p[: len(source_prefix)] == source_prefix]
        for i, x in zip(positions, new, strict=True):
            leaves[i] = x
    return jax.tree_util.tree_unflatten(treedef, leaves)


class _StudentWithTeacher(AbstractStatefulModule):
    """The student, with the teacher beside it on the same input: the carry is
    `{"student", "teacher"}`, the rest the student's, except that each
    sampler's extras are the teacher's (so replay scores its actions)."""

    student: AbstractStatefulModule
    teacher: AbstractStatefulModule
    paths: tuple = eqx.field(static=True)

    def __call__(self, state, x, extras=None, *, key=None) -> StatefulModuleOutput:
        del extras
        student_out = self.student(state["student"], x, key=key)
        teacher_key = None if key is None else jax.random.fold_in(key, 1)
        teacher_out = self.teacher(state["teacher"], x, key=teacher_key)
        extras = _swap(student_out.extras, teacher_out.extras, self.paths)
        carry = {"student": student_out.next_state, "teacher": teacher_out.next_state}
        return student_out._replace(next_state=carry, extras=extras)

    def initial_state(self) -> dict[str, State]:
        modules = {"student": self.student, "teacher": self.teacher}
        return {name: m.initial_state() for name, m in modules.items()}

    def reset_state(self, prev_state: dict[str, State]) -> dict[str, State]:
        modules = {"student": self.student, "teacher": self.teacher}
        return {name: m.reset_state(prev_state[name]) for name, m in modules.items()}


def _inference(
    teacher: AbstractStatefulModule | SavedPytree,
) -> AbstractStatefulModule | SavedPytree:
    """The teacher in inference mode; a header's fingerprint of it as it is."""
    return (
        teacher if isinstance(teacher, SavedPytree) else eqx.nn.inference_mode(teacher)
    )


@register_config
@checked
class Distillation(AbstractLearner):
    """Distillation: the student (the trained network) learns to score a frozen
    teacher's actions, by `distillation_loss`. Evaluation and video run the
    student, and every seed trains its own student.

    ```python
    learner = eqx_ppo.Distillation(teacher, n_envs=64, learning_rate=1e-3)
    ```

    **Arguments:**

    - `teacher`: a trained network ending in a `PPOAdapter` (one seed's).
    - the settings of [`eqx_ppo.AbstractLearner`][]; `gradient_clipping`
      defaults to `None`.
    """

    teacher: AbstractStatefulModule | SavedPytree = eqx.field(converter=_inference)
    gradient_clipping: Number | None = setting(None, low=0.0, open_low=True)
    metrics_prefix: ClassVar[str] = "student"
    logs_rollout_outputs: ClassVar[bool] = False

    def __check_init__(self):
        # Else training would stop later on a non-finite loss that names neither
        # the teacher nor the fix.
        weights = eqx.filter(self.teacher, eqx.is_inexact_array)
        for path, x in jax.tree_util.tree_leaves_with_path(weights):
            # NumPy, not jnp: under a trace jnp would stage even a concrete leaf.
            if not isinstance(x, jax.core.Tracer) and not np.isfinite(x).all():
                raise ValueError(
                    f"Distillation(teacher=...): the teacher's weights hold NaN or "
                    f"inf (teacher{jax.tree_util.keystr(path)}). Fix: pass a teacher "
                    "whose training did not diverge, e.g. an earlier checkpoint."
                )

    def acting(self, network: Module, obs: PyTree[Array]) -> Module:
        if not isinstance(self.teacher, AbstractStatefulModule):
            raise TypeError(
                "Distillation(teacher=...): this learner was read from a checkpoint "
                "header, which keeps only the teacher's fingerprint. Fix: build "
                "TrainConfig(learner=Distillation(teacher, ...)) with the teacher "
                "and pass it to load_checkpoint(config=...) and train."
            )
        obs = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), obs)
        with seed_axis_hint(self.teacher, "teacher"):
            paths = _sampler_paths(self.teacher, network, obs)
        return _StudentWithTeacher(network, self.teacher, paths)

    def loss(
        self, network: Module, batch: Minibatch, *, axis_name: Axis = None
    ) -> Loss:
        data = batch.data
        replayed = network.replay(
            batch.carry["student"], data.obs, data.extras, data.key, data.done
        )
        return distillation_loss(
            replayed.output,
            replayed.regularization_loss,
            self.logging_level,
            axis_name=axis_name,
        )


def distillation_loss(
    outputs: PPONetworkOutput,
    regularization: Float[Array, "time env"],
    logging_level: LoggingLevel = LoggingLevel.LOSSES,
    *,
    axis_name: str | None = None,
) -> tuple[Float[Array, ""], dict[str, Array]]:
    """The loss of one replayed minibatch, `sum over samplers of
    -mean(loglikelihood) + mean(regularization)`, and its metrics.
    `outputs.loglikelihoods` score the teacher's raw actions under the student.
    """
    nll = sum(-jnp.mean(ll) for ll in jax.tree.leaves(outputs.loglikelihoods))
    reg = jnp.mean(regularization)
    total = nll + reg
    metrics: dict[str, Array] = {"loss/total": pmean(total, axis_name)}
    if LoggingLevel.LOSSES in logging_level:
        metrics["losses/distillation_nll"] = pmean(nll, axis_name)
        metrics["losses/regularization"] = pmean(reg, axis_name)
    return total, metrics
