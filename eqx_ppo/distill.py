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
action structure and samplers of the same kinds in the same order.

The student's critic receives no gradient (the loss has no value term); its
statistics (e.g. observation normaliser) are updated from its own rollout
extras after the gradient phase, as in PPO. The teacher is never modified.

Divergences from nnx-ppo's distillation:

1. nnx-ppo feeds the teacher's *whole* replay extras into the student, so
   both networks must be architectural twins; here only sampler extras are
   exchanged, so a student may differ from its teacher (another width, a
   normaliser the teacher lacks, an LSTM for an MLP).
2. The optimiser, minibatching, `lr_schedule` and `reset_mode` are PPO's
   (`DistillationConfig` mirrors the relevant `PPOConfig` fields).
"""

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jaxtyping import Array, Float, Int, Key, PRNGKeyArray, PyTree

from .checkpoint import register_config
from .logging import LoggingLevel
from .nn._adapter import PPONetworkOutput, _is_sampler_dict
from .nn._module import AbstractStatefulModule, State, StatefulModuleOutput, trainable
from .ppo._config import (
    DRIVER_FREE_ON_RESUME,
    EvalConfig,
    PPOConfig,
    VideoConfig,
    check_coefficient,
    check_iteration_settings,
    iteration_free_on_resume,
)
from .ppo._loss import replay_policy
from .ppo._rollout import StepCarry, env_keys, rollout
from .ppo._sharding import check_mesh, gather_envs, pmean
from .ppo._step import gradient_phase, iteration_metrics, make_optimizer
from .ppo._train import (
    NetworkOrFactory,
    TrainResult,
    VideoData,
    _build_network,
    init_seeds,
    run_training,
    seed_keys,
)
from .ppo._validate import (
    check_callbacks,
    check_config_types,
    check_initial_state,
    check_key,
    check_percentiles,
    check_positive_ints,
)
from .recording import is_leaf_layer


@register_config
class DistillationConfig(eqx.Module):
    """The distillation algorithm's settings.

    As in [`eqx_ppo.PPOConfig`][], structural fields are static and the
    `learning_rate` is a float32 array, so changing it does not recompile and
    `jax.vmap` can sweep it.

    **Arguments:**

    - `n_envs`: parallel environments; divisible by `n_minibatches`.
    - `rollout_length`: steps per env per iteration (`T`).
    - `total_steps`: env steps to train for (`n_envs * rollout_length` per
      iteration).
    - `learning_rate`: Adam(W) step size.
    - `n_epochs`, `n_minibatches`: passes over the rollout and minibatches per
      pass; minibatches split the *env* axis, each replaying whole sequences.
    - `gradient_clipping`: global-norm clip, or `None`.
    - `weight_decay`: AdamW decoupled weight decay, or `None` for Adam.
    - `lr_schedule`: `"constant"`, `"linear"` or `"cosine"` (to 0 at
      `total_steps`).
    - `reset_mode`: `"cached"` or `"fresh"` env resets, as in `PPOConfig`.
    - `check_finite`: stop, naming what and the iteration, on non-finite
      observations, rewards, losses or parameters (on by default, as in
      `PPOConfig`).
    - `logging_level`, `logging_percentiles`: see [`eqx_ppo.LoggingLevel`][].
      `LOSSES` logs `losses/distillation_nll` and `losses/regularization`;
      `NETWORK_METRICS` logs the student's metrics under `student/...`.
    """

    n_envs: int = eqx.field(static=True, default=256)
    rollout_length: int = eqx.field(static=True, default=20)
    total_steps: int = eqx.field(static=True, default=512_000)
    n_epochs: int = eqx.field(static=True, default=4)
    n_minibatches: int = eqx.field(static=True, default=4)
    gradient_clipping: float | None = eqx.field(static=True, default=None)
    weight_decay: float | None = eqx.field(static=True, default=None)
    lr_schedule: Literal["constant", "linear", "cosine"] = eqx.field(
        static=True, default="constant"
    )
    reset_mode: Literal["cached", "fresh"] = eqx.field(static=True, default="cached")
    check_finite: bool = eqx.field(static=True, default=True)
    logging_level: LoggingLevel = eqx.field(static=True, default=LoggingLevel.LOSSES)
    logging_percentiles: tuple[int | float, ...] | None = eqx.field(
        static=True, default=None
    )
    learning_rate: Float[Array, ""] = eqx.field(
        converter=lambda v: jnp.asarray(v, jnp.float32), default=1e-4
    )

    def __check_init__(self):
        check_iteration_settings(self)
        check_percentiles("DistillationConfig", self.logging_percentiles)
        check_coefficient(self, "learning_rate", 0.0)

    @property
    def steps_per_iteration(self) -> int:
        """Env steps taken by one iteration: `n_envs * rollout_length`."""
        return self.n_envs * self.rollout_length

    @property
    def n_iterations(self) -> int:
        """Iterations needed to reach `total_steps` (rounded up)."""
        return -(-self.total_steps // self.steps_per_iteration)

    def free_on_resume(self) -> frozenset[str]:
        """The fields a resumed run may change (see `load_checkpoint(config=)`)."""
        return iteration_free_on_resume(self)


def _as_ppo_config(config: DistillationConfig) -> PPOConfig:
    """The `PPOConfig` whose optimiser and minibatching distillation reuses."""
    return PPOConfig(
        n_envs=config.n_envs,
        rollout_length=config.rollout_length,
        total_steps=config.total_steps,
        learning_rate=config.learning_rate,
        n_epochs=config.n_epochs,
        n_minibatches=config.n_minibatches,
        gradient_clipping=config.gradient_clipping,
        weight_decay=config.weight_decay,
        lr_schedule=config.lr_schedule,
        reset_mode=config.reset_mode,
    )


@register_config
@dataclasses.dataclass(frozen=True)
class DistillationTrainConfig:
    """Everything `train_distillation` needs besides the env and the networks.

    **Arguments:**

    - `distillation`, `eval`, `video`: the sub-configs; evaluation and video
      run the student in inference mode.
    - `seed`: the run's seed; with `n_seeds > 1`, seeds `seed .. seed+n_seeds-1`
      train one student each, in one vmapped program, from the same teacher.
    - `checkpoint_every_steps`: cadence of `checkpoint_fn` calls.
    - `log_every_steps`: cadence of host-side logging (one compiled chunk).
    - `progress`: show a progress bar.
    """

    distillation: DistillationConfig = dataclasses.field(
        default_factory=DistillationConfig
    )
    eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)
    video: VideoConfig = dataclasses.field(default_factory=VideoConfig)
    seed: int = 17
    n_seeds: int = 1
    checkpoint_every_steps: int = 500_000
    log_every_steps: int | None = None
    progress: bool = True

    def free_on_resume(self) -> frozenset[str]:
        """The fields a resumed run may change; `distillation` is checked field
        by field."""
        return DRIVER_FREE_ON_RESUME

    def __post_init__(self):
        check_config_types(
            self, distillation=DistillationConfig, eval=EvalConfig, video=VideoConfig
        )
        check_positive_ints(self, "n_seeds", "checkpoint_every_steps")
        if self.log_every_steps is not None:
            check_positive_ints(self, "log_every_steps")


class DistillationState(eqx.Module):
    """Everything a distillation run carries from one iteration to the next.

    **Fields:**

    - `student`: the student network (parameters and statistics).
    - `opt_state`: the optax state of the student's trainable leaves.
    - `env_state`: the batched env states `[n_envs, ...]`.
    - `student_state`, `teacher_state`: the batched carries `[n_envs, ...]`.
    - `key`: the run's PRNG key.
    - `iteration`, `steps`: int32 counters (iterations done, env steps taken).

    The teacher is not part of the state: pass it to every call. On a device
    mesh, the fields in `env_fields` are split over the devices on their env
    axis and the others are replicated.
    """

    env_fields: ClassVar[tuple[str, ...]] = (
        "env_state",
        "student_state",
        "teacher_state",
    )

    student: AbstractStatefulModule
    opt_state: PyTree
    env_state: Any
    student_state: State
    teacher_state: State
    key: PRNGKeyArray
    iteration: Int[Array, ""]
    steps: Int[Array, ""]


class _SamplerExtras(eqx.Module):
    """Marks the extras of one sampler in a probe run."""

    value: Any
    kind: str = eqx.field(static=True)


class _SamplerProbe(AbstractStatefulModule):
    """Runs `layer` and marks its extras if it is a sampler."""

    layer: AbstractStatefulModule

    @property
    def uses_key(self) -> bool:
        return self.layer.uses_key

    def __call__(
        self,
        state: State,
        x: Any,
        extras: Any = None,
        *,
        key: PRNGKeyArray | None = None,
    ) -> StatefulModuleOutput:
        out = self.layer(state, x, extras, key=key)
        if _is_sampler_dict(out.output):
            marked = _SamplerExtras(out.extras, type(self.layer).__name__)
            return out._replace(extras=marked)
        return out

    def initial_state(self) -> State:
        return self.layer.initial_state()


def _probe(who: str, network: AbstractStatefulModule, obs: PyTree) -> Any:
    """One env's call of `network` with every sampler's extras marked (shapes only)."""
    probed = jax.tree.map(
        lambda n: _SamplerProbe(n) if is_leaf_layer(n) else n,
        network,
        is_leaf=is_leaf_layer,
    )
    out = eqx.filter_eval_shape(
        lambda net, o, k: net(net.initial_state(), o, key=k),
        probed,
        obs,
        jax.random.key(0),
    )
    if not isinstance(out.output, PPONetworkOutput):
        raise TypeError(
            f"train_distillation({who}=...): the {who}'s output must be a "
            "`PPONetworkOutput` (end it with `PPOAdapter(action=..., value=...)`); "
            f"got {type(out.output).__name__}."
        )
    return out


def _marked(extras: Any) -> list[tuple[tuple, _SamplerExtras]]:
    flat, _ = jax.tree_util.tree_flatten_with_path(
        extras, is_leaf=lambda n: isinstance(n, _SamplerExtras)
    )
    return [(path, node) for path, node in flat if isinstance(node, _SamplerExtras)]


def _describe(tree: Any) -> str:
    return str(jax.tree.map(lambda x: f"{x.dtype}{list(x.shape)}", tree))


def _sampler_paths(
    teacher: AbstractStatefulModule, student: AbstractStatefulModule, obs: PyTree
) -> tuple[tuple[tuple, ...], tuple[tuple, ...]]:
    """Where the student's and the (inference-mode) teacher's samplers put their
    extras, matched in order; a clear error if the two cannot be matched."""
    teacher_out = _probe("teacher", teacher, obs)
    student_out = _probe("student", student, obs)
    teacher_actions = _describe(teacher_out.output.actions)
    student_actions = _describe(student_out.output.actions)
    if teacher_actions != student_actions:
        raise ValueError(
            "train_distillation: the teacher's and the student's actions differ.\n"
            f"  teacher: {teacher_actions}\n  student: {student_actions}\n"
            "Fix: give the student the teacher's action structure and sizes."
        )
    teacher_marks = _marked(teacher_out.extras)
    student_marks = _marked(student_out.extras)

    def summary(marks):
        return [(m.kind, _describe(m.value)) for _, m in marks]

    if summary(teacher_marks) != summary(student_marks):
        raise ValueError(
            "train_distillation: the teacher's and the student's samplers differ, "
            "so the student cannot score the teacher's raw actions.\n"
            f"  teacher samplers (kind, replay extras): {summary(teacher_marks)}\n"
            f"  student samplers (kind, replay extras): {summary(student_marks)}\n"
            "Fix: end the student's action port with the same sampler kinds, in "
            "the same order, as the teacher's."
        )
    if any(not jax.tree.leaves(m.value) for _, m in student_marks):
        raise ValueError(
            "train_distillation: a sampler emits no replay extras, so its "
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
    `{"student", "teacher"}` (so the rollout resets both by the same mask);
    extras are the student's own plus the teacher's sampler extras. The
    student gets the step's key unchanged, so replaying it alone reproduces
    its noise.
    """

    student: AbstractStatefulModule
    teacher: AbstractStatefulModule
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
            extras={
                "student": student_out.extras,
                "teacher": _take(teacher_out.extras, self.teacher_paths),
            },
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


def distill_init(
    env: Any,
    teacher: AbstractStatefulModule,
    student: AbstractStatefulModule,
    config: DistillationConfig,
    *,
    key: PRNGKeyArray,
) -> DistillationState:
    """A fresh distillation state: reset envs, initial carries, optimiser state.

    Checks that the student can score the teacher's actions (same action
    structure, matching samplers) and raises a `ValueError` saying what
    differs otherwise.
    """
    check_key("distill_init", key)
    reset_key, key = jax.random.split(key)
    env_state = jax.vmap(env.reset)(env_keys(reset_key, config.n_envs))
    teacher = eqx.nn.inference_mode(teacher)
    _sampler_paths(teacher, student, _single_env(env_state.obs))
    params = eqx.filter(student, trainable(student))
    return DistillationState(
        student=student,
        opt_state=make_optimizer(_as_ppo_config(config)).init(params),
        env_state=env_state,
        student_state=student.initialize_state(config.n_envs),
        teacher_state=teacher.initialize_state(config.n_envs),
        key=key,
        iteration=jnp.zeros((), jnp.int32),
        steps=jnp.zeros((), jnp.int32),
    )


def distill_step(
    env: Any,
    teacher: AbstractStatefulModule,
    config: DistillationConfig,
    state: DistillationState,
    *,
    axis_name: str | None = None,
) -> tuple[DistillationState, dict[str, Array]]:
    """One iteration: a rollout driven by the student (teacher alongside), then
    `n_epochs * n_minibatches` gradient steps on the distillation loss, then
    `update_statistics` of the student with its own rollout extras.

    `axis_name` runs it as the body of a data-parallel step under
    `jax.shard_map`, exactly as for [`eqx_ppo.ppo_step`][]."""
    key, rollout_key, shuffle_key = jax.random.split(state.key, 3)
    teacher = eqx.nn.inference_mode(teacher)
    student_paths, teacher_paths = _sampler_paths(
        teacher, state.student, _single_env(state.env_state.obs)
    )
    pair = _StudentWithTeacher(state.student, teacher, teacher_paths)
    carry, data = rollout(
        env,
        pair,
        StepCarry(
            state.env_state,
            {"student": state.student_state, "teacher": state.teacher_state},
        ),
        rollout_key,
        length=config.rollout_length,
        reset_mode=config.reset_mode,
        keep_terminal_obs=False,
        axis_name=axis_name,
    )
    student_extras = data.extras["student"]
    replay_data = data._replace(
        extras=_put(student_extras, student_paths, data.extras["teacher"])
    )
    ppo_config = _as_ppo_config(config)
    optimizer = make_optimizer(ppo_config)
    params, static = eqx.partition(state.student, trainable(state.student))

    def minibatch_loss(p, idx):
        replayed = replay_policy(
            eqx.combine(p, static),
            jax.tree.map(lambda x: x[idx], state.student_state),
            jax.tree.map(lambda x: x[:, idx], replay_data),
        )
        return distillation_loss(
            replayed.output,
            replayed.regularization_loss,
            config.logging_level,
            axis_name=axis_name,
        )

    params, opt_state, loss_metrics = gradient_phase(
        minibatch_loss,
        params,
        state.opt_state,
        optimizer,
        shuffle_key,
        n_local_envs=jnp.shape(data.done)[1],
        config=config,
        axis_name=axis_name,
    )
    all_data = gather_envs(data._replace(key=None), axis_name)
    student = eqx.combine(params, static).update_statistics(all_data.extras["student"])
    metrics = iteration_metrics(
        config,
        loss_metrics,
        all_data,
        params,
        net_prefix="student",
        rollout_outputs=False,
    )
    new_state = DistillationState(
        student=student,
        opt_state=opt_state,
        env_state=carry.env_state,
        student_state=carry.net_state["student"],
        teacher_state=carry.net_state["teacher"],
        key=key,
        iteration=state.iteration + 1,
        steps=state.steps + config.steps_per_iteration,
    )
    return new_state, metrics


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


def init_distillation_state(
    env: Any,
    teacher: AbstractStatefulModule,
    student: NetworkOrFactory,
    config: DistillationTrainConfig,
    *,
    key: PRNGKeyArray | Key[Array, " seed"] | None = None,
) -> DistillationState:
    """The initial state of every seed (stacked when `n_seeds > 1`).

    `student` is a network or a function `key -> network` (each seed then
    gets its own initialisation); `key` is the run's key as in
    [`eqx_ppo.train_distillation`][] (`None`: from `config.seed`). Also the
    template for
    [`eqx_ppo.load_checkpoint`][]:
    `like=lambda c: init_distillation_state(env, teacher, student, c)`.
    """

    def one(init_key, train_key):
        network = _build_network(student, init_key, "train_distillation(student=...)")
        return distill_init(env, teacher, network, config.distillation, key=train_key)

    return init_seeds(one, seed_keys("init_distillation_state", key, config))


def train_distillation(
    env: Any,
    teacher: AbstractStatefulModule,
    student: NetworkOrFactory,
    config: DistillationTrainConfig | None = None,
    *,
    log_fn: Callable[[dict[str, Any], int], None] | None = None,
    video_fn: Callable[[VideoData], None] | None = None,
    checkpoint_fn: Callable[[DistillationState, int], None] | None = None,
    eval_env: Any = None,
    initial_state: DistillationState | None = None,
    mesh: Mesh | None = None,
    key: PRNGKeyArray | Key[Array, " seed"] | None = None,
) -> TrainResult:
    """Distil `teacher` into `student`; the driver is `train_ppo`'s.

    **Arguments:**

    - `env`: a Brax / Playground-protocol env (single-env `reset` / `step`).
    - `teacher`: a trained network ending in a `PPOAdapter`; run in inference
      mode, never modified.
    - `student`: a network ending in a `PPOAdapter` with the teacher's action
      structure and sampler kinds, or a function `key -> network`.
    - `config`: a [`eqx_ppo.DistillationTrainConfig`][].
    - `log_fn`: called `(metrics, step)` after every iteration, with eval
      metrics of the student merged in when an eval ran.
    - `video_fn`: called with [`eqx_ppo.VideoData`][] of the student.
    - `checkpoint_fn`: called `(distillation_state, step)` every
      `checkpoint_every_steps` steps and at the end (see
      [`eqx_ppo.make_checkpoint_fn`][]).
    - `eval_env`: the env for evaluation (default: `env`).
    - `initial_state`: resume from this `DistillationState`.
    - `mesh`: train data-parallel over a 1-D `"env"` device mesh, as in
      [`eqx_ppo.train_ppo`][] (the teacher is replicated).
    - `key`: the run's randomness, as in [`eqx_ppo.train_ppo`][]: one key, a
      batch `[n_seeds]`, or `None` to derive it from `config.seed`.

    Returns a [`eqx_ppo.TrainResult`][] whose `training_state` is the final
    `DistillationState`.
    """
    config = DistillationTrainConfig() if config is None else config
    check_callbacks(
        "train_distillation",
        log_fn=log_fn,
        video_fn=video_fn,
        checkpoint_fn=checkpoint_fn,
    )
    if mesh is not None:
        check_mesh(
            mesh,
            config.distillation.n_envs,
            config.distillation.n_minibatches,
            where="train_distillation",
        )
    keys = seed_keys("train_distillation", key, config)
    check_initial_state(
        "train_distillation",
        initial_state,
        lambda: init_distillation_state(env, teacher, student, config, key=key),
    )
    state = (
        init_distillation_state(env, teacher, student, config, key=key)
        if initial_state is None
        else initial_state
    )
    return run_training(
        jax.tree_util.Partial(distill_step, env, teacher, config.distillation),
        state,
        keys,
        config,
        config.distillation,
        network_of=lambda s: s.student,
        eval_env=env if eval_env is None else eval_env,
        log_fn=log_fn,
        video_fn=video_fn,
        checkpoint_fn=checkpoint_fn,
        mesh=mesh,
    )
