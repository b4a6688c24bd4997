"""Policy distillation: train a student network to act like a frozen teacher.

The student drives the envs with its own stochastic actions, so it learns on
the states it visits itself (Rusu et al. 2015, "Policy Distillation"). The
teacher runs beside it in inference mode on the same observations, with its
own carries, and both carries are reset with the env by the same `done` mask.
The loss is the negative log-likelihood, under the student, of the teacher's
deterministic *pre-squash* action (for `NormalTanhSampler`, the teacher's mean
before `tanh`), which equals `KL(teacher || student)` up to the teacher's
entropy when the teacher is deterministic, plus the student's regularisation.

It uses PPO's replay machinery: minibatches split the env axis and each
replays whole length-`T` sequences from the carry at the start of the
rollout, with the rollout's per-step keys (so every stochastic layer of the
student sees the noise it saw in the rollout). The only change is that the
extras of the student's *samplers* are replaced by the teacher's, so each
sampler scores the teacher's raw action instead of its own; every other extra
(a normaliser's raw input, a bottleneck's sample) stays the student's.
Samplers are found by shape-probing both networks once at trace time: a
sampler is a leaf layer whose output is a `{"action", "log_likelihood"}`
dict, so custom samplers work too. Teacher and student must have the same
action structure and samplers of the same kinds (and numbers of actions) in
the same order.

The student's critic receives no gradient (the loss has no value term); its
statistics (e.g. observation normaliser) are updated from its own rollout
extras after the gradient phase, as in PPO. The teacher is never modified.

Divergences from nnx-ppo's distillation:

1. nnx-ppo feeds the teacher's *whole* replay extras into the student, so
   both networks must be architectural twins; here only sampler extras are
   exchanged, so a student may differ from its teacher (another width, a
   normaliser the teacher lacks, an LSTM for an MLP).
2. The optimiser, minibatching, `lr_schedule` and `reset_mode` are every
   learner's (`eqx_ppo.AbstractLearner`'s settings).
"""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, PRNGKeyArray, PyTree

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
from .ppo._loss import replay_policy
from .ppo._sharding import pmean
from .ppo._validate import seed_axis_hint
from .recording import is_leaf_layer


class _SamplerExtras(eqx.Module):
    """Marks the extras of one sampler in a probe run."""

    value: Any
    kind: str = eqx.field(static=True)


class _SamplerProbe(AbstractLayerWrapper):
    """Runs `layer` and marks its extras if it is a sampler."""

    layer: AbstractStatefulModule

    def wrap_output(self, out: StatefulModuleOutput) -> StatefulModuleOutput:
        if _is_sampler_dict(out.output):
            marked = _SamplerExtras(out.extras, _sampler_kind(self.layer))
            return out._replace(extras=marked)
        return out


def _sampler_kind(sampler: AbstractStatefulModule) -> str:
    """The sampler's class, with its number of actions if it has one
    (`CategoricalSampler(n_actions=4)`)."""
    kind = type(sampler).__name__
    n_actions = getattr(sampler, "n_actions", None)
    return kind if n_actions is None else f"{kind}(n_actions={n_actions!r})"


def _probe(who: str, network: AbstractStatefulModule, obs: PyTree) -> Any:
    """One env's call of `network` with every sampler's extras marked (shapes only)."""
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
    if not isinstance(out.output, PPONetworkOutput):
        raise TypeError(
            f"Distillation: the {who}'s output must be a "
            "`PPONetworkOutput` (end it with `PPOAdapter(action=..., value=...)`); "
            f"got {type(out.output).__name__}."
        )
    return out


def _marked(extras: Any) -> list[tuple[tuple, _SamplerExtras]]:
    flat, _ = jax.tree_util.tree_flatten_with_path(
        extras, is_leaf=lambda n: isinstance(n, _SamplerExtras)
    )
    return [(path, node) for path, node in flat if isinstance(node, _SamplerExtras)]


def _sampler_paths(
    teacher: AbstractStatefulModule, student: AbstractStatefulModule, obs: PyTree
) -> tuple[tuple[tuple, ...], tuple[tuple, ...]]:
    """Where the student's and the (inference-mode) teacher's samplers put their
    extras, matched in order; a clear error if the two cannot be matched."""
    teacher_out = _probe("teacher", teacher, obs)
    student_out = _probe("student", student, obs)
    teacher_actions = tree_spec(teacher_out.output.actions)
    student_actions = tree_spec(student_out.output.actions)
    if teacher_actions != student_actions:
        raise ValueError(
            "Distillation: the teacher's and the student's actions differ.\n"
            f"  teacher: {teacher_actions}\n  student: {student_actions}\n"
            "Fix: give the student the teacher's action structure and sizes."
        )
    teacher_marks = _marked(teacher_out.extras)
    student_marks = _marked(student_out.extras)

    def summary(marks):
        return [(m.kind, tree_spec(m.value)) for _, m in marks]

    if summary(teacher_marks) != summary(student_marks):
        raise ValueError(
            "Distillation: the teacher's and the student's samplers differ, "
            "so the student cannot score the teacher's raw actions.\n"
            f"  teacher samplers (kind, replay extras): {summary(teacher_marks)}\n"
            f"  student samplers (kind, replay extras): {summary(student_marks)}\n"
            "Fix: end the student's action port with the same sampler kinds (and "
            "numbers of actions), in the same order, as the teacher's."
        )
    if any(not jax.tree.leaves(m.value) for _, m in student_marks):
        raise ValueError(
            "Distillation: a sampler emits no replay extras, so its "
            "log-likelihood of the teacher's action cannot be computed."
        )
    return (
        tuple(path for path, _ in student_marks),
        tuple(path for path, _ in teacher_marks),
    )


def _under(path: tuple, prefix: tuple) -> bool:
    return path[: len(prefix)] == prefix


def _take(extras: Any, paths: tuple[tuple, ...]) -> tuple[tuple[Array, ...], ...]:
    """The leaves of `extras` below each of `paths`, in order."""
    flat, _ = jax.tree_util.tree_flatten_with_path(extras)
    return tuple(tuple(x for p, x in flat if _under(p, prefix)) for prefix in paths)


def _put(extras: Any, paths: tuple[tuple, ...], values: tuple) -> Any:
    """`extras` with the leaves below each of `paths` replaced by `values`."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(extras)
    leaves = [x for _, x in flat]
    for prefix, new in zip(paths, values, strict=True):
        positions = [i for i, (p, _) in enumerate(flat) if _under(p, prefix)]
        for i, x in zip(positions, new, strict=True):
            leaves[i] = x
    return jax.tree_util.tree_unflatten(treedef, leaves)


class _StudentWithTeacher(AbstractStatefulModule):
    """The student, with the teacher running beside it on the same input.

    Output, regularisation and metrics are the student's; the carry is
    `{"student", "teacher"}` (so the rollout resets both by the same mask).
    The extras are the student's, with each sampler's replaced by the
    matching teacher sampler's: replaying the student alone on them scores
    the teacher's actions. The student gets the step's key unchanged, so
    that replay reproduces its noise.
    """

    student: AbstractStatefulModule
    teacher: AbstractStatefulModule
    student_paths: tuple = eqx.field(static=True)
    teacher_paths: tuple = eqx.field(static=True)

    def __call__(
        self,
        state: dict[str, State],
        x: Any,
        extras: Any = None,
        *,
        key: PRNGKeyArray | None = None,
    ) -> StatefulModuleOutput:
        del extras
        student_out = self.student(state["student"], x, key=key)
        teacher_key = None if key is None else jax.random.fold_in(key, 1)
        teacher_out = self.teacher(state["teacher"], x, key=teacher_key)
        return StatefulModuleOutput(
            next_state={
                "student": student_out.next_state,
                "teacher": teacher_out.next_state,
            },
            output=student_out.output,
            regularization_loss=student_out.regularization_loss,
            metrics=student_out.metrics,
            extras=_put(
                student_out.extras,
                self.student_paths,
                _take(teacher_out.extras, self.teacher_paths),
            ),
        )

    def initial_state(self) -> dict[str, State]:
        return {
            "student": self.student.initial_state(),
            "teacher": self.teacher.initial_state(),
        }

    def reset_state(self, prev_state: dict[str, State]) -> dict[str, State]:
        return {
            "student": self.student.reset_state(prev_state["student"]),
            "teacher": self.teacher.reset_state(prev_state["teacher"]),
        }


def _single_env(obs: PyTree) -> PyTree:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), obs)


def _check_teacher(teacher: AbstractStatefulModule | SavedPytree) -> None:
    """Raise unless the teacher's concrete weights are finite: a non-finite
    teacher would stop training later with a non-finite loss that names
    neither it nor the fix."""
    leaves = jax.tree_util.tree_flatten_with_path(
        eqx.filter(teacher, eqx.is_inexact_array)
    )[0]
    for path, x in leaves:
        # NumPy, not jnp: under a trace jnp would stage even a concrete leaf.
        if not isinstance(x, jax.core.Tracer) and not np.isfinite(x).all():
            raise ValueError(
                f"Distillation(teacher=...): the teacher's weights hold NaN or inf "
                f"(teacher{jax.tree_util.keystr(path)}). Fix: pass a teacher "
                "whose training did not diverge, e.g. an earlier checkpoint."
            )


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
    """Distillation: the student learns to score a frozen teacher's actions.

    The student (the trained network) acts, driving the rollout, with the
    teacher running beside it on the same observations in inference mode;
    the loss is the student's negative log-likelihood of the teacher's raw
    actions under the same noise and carries (`distillation_loss`).
    Evaluation and video run the student; with `n_seeds > 1` every seed
    trains its own student from the same teacher.

    ```python
    learner = eqx_ppo.Distillation(teacher, n_envs=64, learning_rate=1e-3)
    ```

    **Arguments:**

    - `teacher`: a trained network ending in a `PPOAdapter`, one seed's; it is
      stored in inference mode and never modified. (A learner read back from
      a checkpoint header holds only the teacher's fingerprint, a
      `SavedPytree`: enough to compare, not to train.)
    - the settings of [`eqx_ppo.AbstractLearner`][] (keyword-only), except
      that `gradient_clipping` defaults to `None`, as in nnx-ppo. `LOSSES`
      logs `losses/distillation_nll` and `losses/regularization`;
      `NETWORK_METRICS` logs the student's metrics under `student/...`.
    """

    teacher: AbstractStatefulModule | SavedPytree = eqx.field(converter=_inference)
    gradient_clipping: Number | None = setting(None, low=0.0, open_low=True)

    def __check_init__(self):
        _check_teacher(self.teacher)

    def acting(self, network: Module, obs: PyTree[Array]) -> Module:
        if not isinstance(self.teacher, AbstractStatefulModule):
            raise TypeError(
                "Distillation(teacher=...): this learner was read from a checkpoint "
                "header, which keeps only the teacher's fingerprint. Fix: build "
                "TrainConfig(learner=Distillation(teacher, ...)) with the teacher "
                "and pass it to load_checkpoint(config=...) and train."
            )
        with seed_axis_hint(self.teacher, "teacher"):
            paths = _sampler_paths(self.teacher, network, _single_env(obs))
        return _StudentWithTeacher(network, self.teacher, *paths)

    def loss(
        self, network: Module, batch: Minibatch, *, axis_name: Axis = None
    ) -> Loss:
        replayed = replay_policy(network, batch.carry["student"], batch.data)
        return distillation_loss(
            replayed.output,
            replayed.regularization_loss,
            self.logging_level,
            axis_name=axis_name,
        )

    @property
    def metrics_prefix(self) -> str:
        return "student"

    @property
    def logs_rollout_outputs(self) -> bool:
        return False


def distillation_loss(
    outputs: PPONetworkOutput,
    regularization: Float[Array, "time env"],
    logging_level: LoggingLevel = LoggingLevel.LOSSES,
    *,
    axis_name: str | None = None,
) -> tuple[Float[Array, ""], dict[str, Array]]:
    """The loss of one replayed minibatch and its metrics.

    `outputs.loglikelihoods` are the student's log-likelihoods of the
    teacher's raw actions; the loss is `sum over samplers of
    -mean(loglikelihood) + mean(regularization)`. Under `jax.shard_map` with
    `axis_name`, the loss is this device's share and the metrics are
    whole-minibatch values.
    """
    nll = sum(-jnp.mean(ll) for ll in jax.tree.leaves(outputs.loglikelihoods))
    reg = jnp.mean(regularization)
    total = nll + reg
    metrics: dict[str, Array] = {"loss/total": pmean(total, axis_name)}
    if LoggingLevel.LOSSES in logging_level:
        metrics["losses/distillation_nll"] = pmean(nll, axis_name)
        metrics["losses/regularization"] = pmean(reg, axis_name)
    return total, metrics
